"""Speculative decoding, the scheduler's side: the ngram proposer, and steps that carry draft tokens
through the fake executor (a model whose next token is a hash of the context), with KV slots reserved for
the drafts and the rejected ones' blocks given back."""
import pytest

from actorserve.runtime.config import SpeculativeConfig
from actorserve.runtime.engine.sampling_params import SamplingParams
from actorserve.runtime.engine.spec_decode import NgramProposer
from tests.runtime.engine.test_scheduler import expected, make_engine, run


def test_ngram_proposes_what_followed_the_latest_earlier_occurrence():
    p = NgramProposer(4, 2, 4)
    assert p.propose([1, 2, 3, 4, 5, 6, 7, 1, 2, 3]) == [4, 5, 6, 7]  # the longest n first (3 here)
    assert p.propose([5, 1, 2, 8, 8, 1, 2]) == [8, 8, 1, 2]
    assert p.propose([1, 2, 9, 1, 2, 7, 1, 2]) == [7, 1, 2]  # the latest occurrence, up to the end
    assert p.propose([1, 2, 3, 9, 9, 3]) == []  # no 2-gram recurs
    assert p.propose([1, 2, 3, 4, 1, 2], limit=1) == [3]
    assert p.propose([256, 1, 2, 3, 1]) == []  # a byte match across token boundaries is not a match
    assert p.propose([7] * 5) == [7]
    assert p.propose([1, 2]) == []


def test_the_config_takes_vllms_json_and_refuses_nonsense():
    c = SpeculativeConfig.parse('{"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_max": 4, '
                                '"prompt_lookup_min": 2}')
    assert (c.method, c.num_speculative_tokens, c.prompt_lookup_min, c.prompt_lookup_max) == ("ngram", 4, 2, 4)
    assert SpeculativeConfig.parse({"method": "ngram", "num_speculative_tokens": 3}).prompt_lookup_max == 5
    assert SpeculativeConfig.parse({"method": "ngram", "num_speculative_tokens": 3,
                                    "prompt_lookup_max": 3}).prompt_lookup_min == 3
    for bad, why in [({"method": "eagle", "num_speculative_tokens": 2}, "method"),
                     ({"method": "ngram"}, "num_speculative_tokens"),
                     ({"method": "ngram", "num_speculative_tokens": 0}, "num_speculative_tokens"),
                     ({"method": "ngram", "num_speculative_tokens": 2, "prompt_lookup_min": 3,
                       "prompt_lookup_max": 2}, "prompt_lookup"),
                     ({"method": "ngram", "num_speculative_tokens": 2, "bogus": 1}, "bogus"),
                     ("{not json", "JSON")]:
        with pytest.raises(ValueError, match=why):
            SpeculativeConfig.parse(bad)


def test_drafts_give_the_same_tokens_in_fewer_steps():
    engine, ex = make_engine(spec_k=4)
    prompt = list(range(40))
    engine.add_request("a", prompt, SamplingParams(max_tokens=60))
    out = run(engine)["a"]
    assert out.outputs[0].token_ids == expected(prompt, 60)
    assert ex.steps < 60  # several tokens a step where drafts were kept
    stats = engine.scheduler.spec_stats
    assert stats.num_drafts > 0 and 0 < stats.num_accepted_tokens < stats.num_draft_tokens
    assert engine.num_free_blocks == 256


def test_drafts_never_pass_max_tokens_or_the_context():
    engine, _ = make_engine(spec_k=8)
    prompt = list(range(10))
    engine.add_request("a", prompt, SamplingParams(max_tokens=3))
    out = run(engine)["a"]
    assert out.outputs[0].token_ids == expected(prompt, 3) and out.outputs[0].finish_reason == "length"


def test_a_stop_inside_the_kept_drafts_ends_the_output_there():
    engine, _ = make_engine(spec_k=4)
    prompt = list(range(30))
    tokens = expected(prompt, 40)
    stop = tokens[5]
    engine.add_request("a", prompt, SamplingParams(max_tokens=40, stop_token_ids=[stop]))
    out = run(engine)["a"]
    assert out.outputs[0].token_ids == tokens[:tokens.index(stop) + 1]
    assert out.outputs[0].finish_reason == "stop"
    assert engine.num_free_blocks == 256
