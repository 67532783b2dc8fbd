"""Acceptance: bad input is a ValueError naming the field, and the engine keeps serving."""
import pytest

from actorserve import SamplingParams


@pytest.mark.parametrize("kwargs,field", [
    ({"stop_token_ids": [49152]}, "stop_token_ids"), ({"stop_token_ids": [-1]}, "stop_token_ids"),
    ({"logit_bias": {49152: 1.0}}, "logit_bias"), ({"logit_bias": {-3: 1.0}}, "logit_bias"),
])
def test_out_of_vocab_ids_raise_and_the_engine_serves_on(smollm, greedy_reference, kwargs, field):
    ref = greedy_reference["prompts"][0]
    engine = smollm.engine
    engine.add_request("good", ref["prompt_ids"], SamplingParams(temperature=0, max_tokens=64))
    engine.step()
    with pytest.raises(ValueError, match=field):
        engine.add_request("bad", ref["prompt_ids"], SamplingParams(temperature=0, **kwargs))
    done = None
    while engine.has_unfinished_requests():
        for out in engine.step():
            done = out if out.finished else done
    assert done.request_id == "good" and done.outputs[0].token_ids == ref["output_ids"]


def test_min_tokens_past_the_context_raise_though_max_tokens_is_unset(smollm):
    """As every way in refuses it (HTTP fills max_tokens in first; the ZMQ port and Python do not)."""
    with pytest.raises(ValueError, match="min_tokens"):
        smollm.generate("Hello", SamplingParams(min_tokens=10 ** 9), use_tqdm=False)
    assert len(smollm.generate("Hello", SamplingParams(min_tokens=3, max_tokens=3), use_tqdm=False)[0]
               .outputs[0].token_ids) == 3


def test_bad_prompts_raise(smollm):
    with pytest.raises(ValueError, match="prompt_token_ids"):
        smollm.generate({"prompt_token_ids": [1, 2, 10**6]}, use_tqdm=False)
    with pytest.raises(ValueError, match="prompt"):
        smollm.generate({"prompt_token_ids": []}, use_tqdm=False)
    with pytest.raises(ValueError, match="max_model_len"):
        smollm.generate({"prompt_token_ids": [5] * 5000}, use_tqdm=False)
    with pytest.raises(ValueError, match="sampling_params"):
        smollm.generate(["a", "b"], [SamplingParams()], use_tqdm=False)


def test_a_bad_request_in_a_batch_admits_nothing(smollm):
    with pytest.raises(ValueError, match="stop_token_ids"):
        smollm.generate(["Hello", "World"], [SamplingParams(), SamplingParams(stop_token_ids=[10**9])],
                        use_tqdm=False)
    assert not smollm.engine.has_unfinished_requests()
    assert smollm.engine.num_free_blocks == smollm.engine.kv.pool.num_blocks
    out = smollm.generate("Hello", SamplingParams(temperature=0, max_tokens=3), use_tqdm=False)[0]
    assert len(out.outputs[0].token_ids) == 3


def test_unknown_engine_argument():
    from actorserve import LLM

    with pytest.raises(TypeError, match="max_num_seq"):
        LLM(max_num_seq=4)


def test_missing_model_path_is_a_clear_error():
    from actorserve import LLM, ModelLoadError

    with pytest.raises(ModelLoadError, match="does not exist"):
        LLM("/nonexistent/model.gguf")


FLOAT_FIELDS = ["temperature", "top_p", "min_p", "presence_penalty", "frequency_penalty", "repetition_penalty"]


@pytest.mark.parametrize("value", [float("nan"), float("inf"), float("-inf"), 1e308, -1e308])
@pytest.mark.parametrize("field", FLOAT_FIELDS)
def test_every_float_field_refuses_nan_infinities_and_huge_values_or_serves_them(smollm, field, value):
    """One validation for every way in (SamplingParams): a value out of its field's range is a ValueError
    naming the field; one in range (a huge temperature) is served."""
    try:
        params = SamplingParams(max_tokens=2, **{field: value})
    except ValueError as exc:
        assert field in str(exc)
        return
    assert value == value and abs(value) != float("inf"), f"{field}={value} was accepted"
    assert len(smollm.generate("Hi", params, use_tqdm=False)[0].outputs[0].token_ids) == 2
