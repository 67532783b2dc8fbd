"""SamplingParams validation: every out-of-range field is a ValueError that names it."""
import pytest

from actorserve.runtime.engine.sampling_params import SamplingParams, verify_prompt_token_ids

BAD = [
    ("n", {"n": 0}), ("temperature", {"temperature": -1.0}), ("top_p", {"top_p": 0.0}),
    ("top_p", {"top_p": 2.0}), ("top_k", {"top_k": -5}), ("min_p", {"min_p": 1.5}),
    ("presence_penalty", {"presence_penalty": 3.0}), ("frequency_penalty", {"frequency_penalty": -2.5}),
    ("repetition_penalty", {"repetition_penalty": 0.0}), ("max_tokens", {"max_tokens": 0}),
    ("max_tokens", {"max_tokens": -3}), ("min_tokens", {"min_tokens": -1}),
    ("min_tokens", {"min_tokens": 5, "max_tokens": 2}), ("logprobs", {"logprobs": 21}),
    ("logprobs", {"logprobs": -1}), ("stop", {"stop": [""]}), ("stop_token_ids", {"stop_token_ids": ["x"]}),
    ("logit_bias", {"logit_bias": {"abc": 1.0}}), ("seed", {"seed": "s"}),
    ("prompt_logprobs", {"prompt_logprobs": 21}), ("prompt_logprobs", {"prompt_logprobs": -1}),
    ("allowed_token_ids", {"allowed_token_ids": []}), ("allowed_token_ids", {"allowed_token_ids": ["x"]}),
    ("allowed_token_ids", {"allowed_token_ids": 5}), ("bad_words", {"bad_words": [" "]}),
    ("bad_words", {"bad_words": "word"}), ("bad_words", {"bad_words": ["x"] * 257}),
    ("truncate_prompt_tokens", {"truncate_prompt_tokens": 0}),
    ("truncate_prompt_tokens", {"truncate_prompt_tokens": -2}),
]


@pytest.mark.parametrize("field,kwargs", BAD, ids=[f"{f}={list(k.values())[0]}" for f, k in BAD])
def test_bad_values_name_the_field(field, kwargs):
    with pytest.raises(ValueError, match=field):
        SamplingParams(**kwargs)


def test_defaults_and_normalisation():
    p = SamplingParams(stop="###", top_k=-1, logit_bias={"5": 1})
    assert p.stop == ["###"] and p.top_k == 0 and p.logit_bias == {5: 1.0}
    assert SamplingParams(temperature=0).greedy and not SamplingParams().greedy


@pytest.mark.parametrize("kwargs,field", [
    ({"stop_token_ids": [100]}, "stop_token_ids"), ({"stop_token_ids": [-1]}, "stop_token_ids"),
    ({"logit_bias": {100: 2.0}}, "logit_bias"), ({"logit_bias": {-1: 2.0}}, "logit_bias"),
    ({"allowed_token_ids": [5, 100]}, "allowed_token_ids"),
])
def test_token_ids_checked_against_the_vocab(kwargs, field):
    with pytest.raises(ValueError, match=field) as err:
        SamplingParams(**kwargs).verify_for_model(vocab_size=100, can_detokenize=True)
    assert "100" in str(err.value)
    SamplingParams(stop_token_ids=[99], logit_bias={0: 1}).verify_for_model(100, True)


def test_truncation_keeps_the_last_tokens_and_children_share_one_set_of_prompt_logprobs():
    from actorserve.runtime.engine.sampling_params import truncate_prompt

    assert truncate_prompt([1, 2, 3, 4], 2, 100) == [3, 4]
    assert truncate_prompt([1, 2, 3, 4], 9, 100) == [1, 2, 3, 4]
    assert truncate_prompt(list(range(10)), -1, 4) == [7, 8, 9]  # room left for one token
    with pytest.raises(ValueError, match="truncate_prompt_tokens"):
        truncate_prompt([1, 2], 0, 100)
    p = SamplingParams(n=3, prompt_logprobs=2)
    assert [p.child(i).prompt_logprobs for i in range(3)] == [2, None, None]


def test_prompt_ids_checked():
    with pytest.raises(ValueError, match="prompt"):
        verify_prompt_token_ids([], 100)
    with pytest.raises(ValueError, match="prompt_token_ids"):
        verify_prompt_token_ids([1, 100], 100)


def test_children_of_a_seeded_request_get_distinct_seeds():
    p = SamplingParams(n=3, seed=10)
    assert [p.child(i).seed for i in range(3)] == [10, 11, 12]
    assert all(p.child(i).n == 1 for i in range(3))


# -- the bounds every way in shares (issue: any input, any fault) ------------------------------------------
from actorserve.runtime.engine.sampling_params import (MAX_N, RequestLimits, verify_prompt_text,  # noqa: E402
                                                       verify_request)

UNBOUNDED = [
    ("n", {"n": 10 ** 9}), ("n", {"n": 2 ** 70}), ("n", {"n": MAX_N + 1}), ("n", {"n": True}),
    ("seed", {"seed": 2 ** 64}), ("seed", {"seed": -2 ** 63 - 1}), ("top_k", {"top_k": 2 ** 31}),
    ("top_k", {"top_k": 2 ** 64 - 1}), ("max_tokens", {"max_tokens": 2 ** 40}), ("min_tokens", {"min_tokens": 2 ** 40}),
    ("temperature", {"temperature": float("inf")}), ("top_p", {"top_p": float("nan")}),
    ("presence_penalty", {"presence_penalty": float("nan")}), ("repetition_penalty", {"repetition_penalty": float("inf")}),
    ("stop", {"stop": ["x"] * 65}), ("stop", {"stop": ["x" * 1025]}), ("stop", {"stop": ["a\ud800"]}),
    ("stop_token_ids", {"stop_token_ids": list(range(4097))}), ("stop_token_ids", {"stop_token_ids": [2 ** 70]}),
    ("logit_bias", {"logit_bias": {i: 1.0 for i in range(4097)}}), ("logit_bias", {"logit_bias": {2 ** 70: 1.0}}),
    ("logit_bias", {"logit_bias": {1: float("nan")}}),
]


@pytest.mark.parametrize("field,kwargs", UNBOUNDED, ids=[f for f, _ in UNBOUNDED])
def test_every_value_is_bounded(field, kwargs):
    with pytest.raises(ValueError, match=field):
        SamplingParams(**kwargs)


def test_logit_bias_is_clamped_and_seeds_wrap_for_children():
    assert SamplingParams(logit_bias={1: 1e9, 2: -1e9, 3: 5}).logit_bias == {1: 100.0, 2: -100.0, 3: 5.0}
    p = SamplingParams(n=3, seed=2 ** 64 - 2)
    assert [p.child(i).seed for i in range(3)] == [2 ** 64 - 2, 2 ** 64 - 1, 0]
    SamplingParams(seed=-2 ** 63), SamplingParams(seed=2 ** 64 - 1), SamplingParams(n=MAX_N)


LIMITS = RequestLimits(vocab_size=100, max_model_len=64, max_n=8)


@pytest.mark.parametrize("ids,kwargs,words", [
    ([1] * 64, {}, "maximum context length is 64"), ([1] * 10, {"max_tokens": 55}, "you requested 65 tokens"),
    ([1, 2], {"n": 9}, "at most 8"), ([], {}, "must not be empty"), ([1, 100], {}, "outside the vocabulary"),
])
def test_verify_request_is_the_one_engine_check(ids, kwargs, words):
    with pytest.raises(ValueError, match=words):
        verify_request(ids, SamplingParams(**kwargs), LIMITS)
    verify_request([1] * 10, SamplingParams(max_tokens=54, n=8), LIMITS)


def test_a_prompt_text_too_long_for_any_tokenization_is_refused_untokenized():
    verify_prompt_text("x" * 2 * 64 * 4, max_model_len=64, max_token_chars=4)
    with pytest.raises(ValueError, match="prompt has 513 characters"):
        verify_prompt_text("x" * 513, max_model_len=64, max_token_chars=4)
    with pytest.raises(ValueError, match="surrogate"):
        verify_prompt_text("a\udc00", 64, 4)
