"""Structured outputs from Python: ``SamplingParams(structured_outputs=StructuredOutputsParams(...))`` or the
same as a plain dict, alone, with n > 1, and beside speculative decoding (which drafts nothing for them)."""
import json

import pytest

from actorserve import LLM, SamplingParams
from actorserve.runtime.engine.sampling_params import StructuredOutputsParams

pytest.importorskip("xgrammar")
jsonschema = pytest.importorskip("jsonschema")

SCHEMA = {"type": "object", "properties": {"name": {"type": "string", "maxLength": 10},
                                           "legs": {"type": "integer", "minimum": 0, "maximum": 8}},
          "required": ["name", "legs"], "additionalProperties": False}
ASK = [{"role": "user", "content": "Describe an animal as JSON."}]


@pytest.fixture(scope="module")
def llm():
    return LLM(kv_cache_memory=128 << 20, max_model_len=2048,
               speculative_config={"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_min": 1,
                                   "prompt_lookup_max": 3})


def test_a_schema_as_params_or_as_a_dict(llm):
    for constraint in (StructuredOutputsParams(json=SCHEMA), {"json": SCHEMA}, {"json": json.dumps(SCHEMA)}):
        params = SamplingParams(temperature=0.9, seed=4, n=2, max_tokens=120, structured_outputs=constraint)
        out = llm.chat(ASK, params, use_tqdm=False)[0]
        for sample in out.outputs:
            assert sample.finish_reason == "stop", sample.text
            jsonschema.validate(json.loads(sample.text), SCHEMA)


def test_choice_and_regex_beside_free_requests_with_drafts(llm):
    free = {"prompt_token_ids": [1, 2, 3, 4, 1, 2, 3, 4, 1, 2]}
    greedy = SamplingParams(temperature=0, max_tokens=30, ignore_eos=True)
    alone = llm.generate(free, greedy, use_tqdm=False)[0].outputs[0].token_ids
    outs = llm.generate(["The sky is", free, "Call me at"],
                        [SamplingParams(max_tokens=8, structured_outputs={"choice": ["blue", "green"]}), greedy,
                         SamplingParams(max_tokens=12, structured_outputs={"regex": r"[0-9]{3}-[0-9]{4}"})],
                        use_tqdm=False)
    assert outs[0].outputs[0].text in ("blue", "green")
    assert outs[1].outputs[0].token_ids == alone
    assert len(outs[2].outputs[0].text) == 8 and outs[2].outputs[0].text[3] == "-"


def test_a_bad_schema_is_a_value_error_and_the_engine_goes_on(llm):
    with pytest.raises(ValueError, match="structured_outputs.json"):
        llm.generate("Hi", SamplingParams(structured_outputs={"json": {"type": "nope"}}), use_tqdm=False)
    assert llm.generate("Hi", SamplingParams(max_tokens=2), use_tqdm=False)[0].outputs[0].token_ids


def test_drafts_the_grammar_forbids_are_cut_and_the_output_still_matches(llm):
    """The prompt repeats "x y"; prompt lookup drafts "y" after "x", which the regex forbids: those drafts
    are cut, the output matches, and where the drafts fit the grammar ("x z" repeated) they are kept."""
    import re

    stats = llm.engine.scheduler.spec_stats
    kept_before = stats.num_accepted_tokens
    out = llm.generate("x y x y x y x y x y x y x", SamplingParams(temperature=0, max_tokens=40, structured_outputs={
        "regex": "( x z){10}"}), use_tqdm=False)[0].outputs[0]
    assert re.fullmatch("( x z){10}", out.text), out.text
    assert stats.num_accepted_tokens > kept_before  # the repetition of " x z" itself was drafted and kept


def test_a_finished_grammar_ends_the_output_even_with_ignore_eos(llm):
    """ignore_eos (or min_tokens) would go on past the grammar's stop token, where the grammar allows
    nothing: the request stops there instead, as a stop."""
    params = SamplingParams(temperature=0, max_tokens=20, ignore_eos=True,
                            structured_outputs={"choice": ["yes", "no"]})
    out = llm.generate("Is the sky blue? Answer yes or no.", params, use_tqdm=False)[0].outputs[0]
    assert out.text in ("yes", "no") and out.finish_reason == "stop"
    assert llm.generate("Say hi.", SamplingParams(max_tokens=4), use_tqdm=False)[0].outputs[0].token_ids  # serving
