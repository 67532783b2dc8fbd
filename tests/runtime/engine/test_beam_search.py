"""Beam search's bookkeeping on made-up logprobs: which candidates go on, which finish, how they rank."""
import math

import pytest

from actorserve.runtime.engine.beam_search import BeamSearch, BeamSearchParams, beam_score
from actorserve.runtime.engine.outputs import Logprob

EOS = 9


def step(**lps: float) -> dict[int, Logprob]:
    """Candidates t<id>=logprob."""
    return {int(name[1:]): Logprob(int(name[1:]), value, rank) for rank, (name, value) in enumerate(lps.items(), 1)}


@pytest.mark.parametrize("bad", [dict(beam_width=0), dict(beam_width=11), dict(beam_width=True),
                                 dict(beam_width=2.0), dict(max_tokens=0), dict(temperature=-1.0),
                                 dict(length_penalty=math.nan)])
def test_bad_params_are_refused(bad):
    with pytest.raises(ValueError):
        BeamSearchParams(**{"beam_width": 2, "max_tokens": 4, **bad})


def test_each_step_keeps_the_best_candidates_of_all_beams_and_sets_eos_aside():
    search = BeamSearch([[1, 2], [3]], BeamSearchParams(beam_width=2, max_tokens=3), EOS, max_model_len=100)
    assert search.pending() == [[1, 2], [3]]
    search.advance([step(t5=-0.1, t6=-1.0, t9=-0.5), step(t7=-0.2, t8=-0.3)])
    # prompt 0: 5 and 6 go on, EOS finishes; prompt 1: both
    assert search.pending() == [[1, 2, 5], [1, 2, 6], [3, 7], [3, 8]]
    assert [b.tokens for b in search.finished[0]] == [[1, 2, 9]]
    search.advance([step(t4=-2.0, t5=-3.0), step(t4=-0.1, t5=-0.2),  # beam 6 (-1.0) overtakes beam 5 (-0.1)
                    step(t1=-0.1, t2=-0.2), step(t1=-5.0, t2=-6.0)])
    assert search.pending() == [[1, 2, 6, 4], [1, 2, 6, 5], [3, 7, 1], [3, 7, 2]]
    assert search.beams[0][0].cum_logprob == pytest.approx(-1.1)
    assert len(search.beams[0][0].logprobs) == 2


def test_the_results_rank_finished_and_live_beams_together_by_length_normalised_score():
    def run(length_penalty):
        search = BeamSearch([[1, 2]], BeamSearchParams(beam_width=2, max_tokens=2, length_penalty=length_penalty),
                            EOS, max_model_len=100)
        search.advance([step(t9=-0.6, t5=-0.4, t6=-0.5)])
        search.advance([step(t7=-0.3), step(t7=-0.3)])
        assert search.pending() == []  # max_tokens reached
        return search.results(lambda ids: ",".join(map(str, ids)))[0].sequences

    # [1, 2, 9]: -0.6 over 2 (the EOS is not counted) = -0.3; [1, 2, 5, 7]: -0.7 / 4; [1, 2, 6, 7]: -0.8 / 4
    out = run(1.0)
    assert [s.tokens for s in out] == [[1, 2, 5, 7], [1, 2, 6, 7]]
    assert [s.finish_reason for s in out] == ["length", "length"] and out[0].text == "5,7"
    out = run(0.0)  # no length penalty: -0.6 beats -0.7 and -0.8
    assert [s.tokens for s in out] == [[1, 2, 9], [1, 2, 5, 7]]
    assert out[0].finish_reason == "stop" and out[0].text == ""
    assert beam_score([1, 2, 9], -0.6, EOS, 1.0) == pytest.approx(-0.3)
    assert beam_score([1, 2, 9], -0.6, None, 1.0) == pytest.approx(-0.2)


def test_an_eos_ending_beam_keeps_its_eos_out_of_the_text_unless_asked():
    for include, text in ((False, "5"), (True, "5,9")):
        search = BeamSearch([[1]], BeamSearchParams(beam_width=1, max_tokens=3, include_stop_str_in_output=include),
                            EOS, 100)
        search.advance([step(t5=-0.1)])
        search.advance([step(t9=-0.1, t6=-5.0)])
        search.advance([step(t7=-5.0)])
        best = search.results(lambda ids: ",".join(map(str, ids)))[0].sequences[0]
        assert best.tokens == [1, 5, 9] and best.finish_reason == "stop" and best.stop_reason == EOS
        assert best.text == text


def test_ignore_eos_keeps_eos_candidates_going():
    search = BeamSearch([[1]], BeamSearchParams(beam_width=1, max_tokens=2, ignore_eos=True), EOS, 100)
    search.advance([step(t9=-0.1, t5=-2.0)])
    assert search.pending() == [[1, 9]] and search.finished == [[]]


def test_a_beam_that_fills_the_context_finishes_for_length():
    search = BeamSearch([[1, 2]], BeamSearchParams(beam_width=2, max_tokens=5), EOS, max_model_len=3)
    search.advance([step(t5=-0.1, t6=-0.2)])
    assert search.pending() == []  # both beams now hold 3 tokens: no room for a fourth
    out = search.results(None)[0].sequences
    assert [s.tokens for s in out] == [[1, 2, 5], [1, 2, 6]] and all(s.finish_reason == "length" for s in out)
    assert out[0].text is None  # no tokenizer


def test_advance_refuses_a_result_count_that_does_not_match():
    search = BeamSearch([[1]], BeamSearchParams(beam_width=1, max_tokens=2), EOS, 100)
    with pytest.raises(ValueError, match="2 results for 1 beams"):
        search.advance([step(t5=-0.1), step(t6=-0.1)])


def _engine_search(llm, request_id, ids, params, abort_after=None):
    """A served request's beam search: the engine core runs it (one request); returns its final output and
    the engine steps it took."""
    core = llm.engine
    core.add_request(request_id, ids, params)
    steps = 0
    while core.has_unfinished_requests():
        steps += 1
        if steps == abort_after:
            return core.abort_request(request_id), steps
        for out in core.step():
            if out.finished:
                return out, steps
    raise AssertionError("the search never finished")


@pytest.mark.parametrize("width,ignore_eos,penalty", [(4, True, 1.0), (3, False, 0.5)])
def test_the_engine_s_search_is_llm_beam_search_with_every_step_s_beams_in_one_batch(smollm, width, ignore_eos,
                                                                                     penalty):
    ids = smollm.get_tokenizer().encode("The capital of France is")
    params = BeamSearchParams(beam_width=width, max_tokens=10, ignore_eos=ignore_eos, length_penalty=penalty)
    want = smollm.beam_search([{"prompt_token_ids": ids}], params)[0].sequences
    out, steps = _engine_search(smollm, "beams", ids, params)
    assert [o.token_ids for o in out.outputs] == [s.tokens[len(ids):] for s in want]
    assert [o.text for o in out.outputs] == [s.text for s in want]
    assert [o.finish_reason for o in out.outputs] == [s.finish_reason for s in want]
    assert [o.cumulative_logprob for o in out.outputs] == pytest.approx([s.cum_logprob for s in want], abs=1e-3)
    assert steps <= params.max_tokens  # each step's beams ran together, one engine step a token
    assert out.prompt_token_ids == ids and out.metrics is not None


def test_an_aborted_search_frees_every_block(smollm):
    core = smollm.engine
    free = core.num_free_blocks
    ids = smollm.get_tokenizer().encode("Once upon a time")
    update, _ = _engine_search(smollm, "gone", ids, BeamSearchParams(beam_width=4, max_tokens=50), abort_after=5)
    assert update.output.finished and [s.finish_reason for s in update.samples] == ["abort"] * 4
    assert not core.has_unfinished_requests() and core.num_free_blocks == free
