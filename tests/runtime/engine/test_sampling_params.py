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
])
def test_token_ids_checked_against_the_vocab(kwargs, field):
    with pytest.raises(ValueError, match=field) as err:
        SamplingParams(**kwargs).verify_for_model(vocab_size=100, can_detokenize=True)
    assert "100" in str(err.value)
    SamplingParams(stop_token_ids=[99], logit_bias={0: 1}).verify_for_model(100, True)


def test_prompt_ids_checked():
    with pytest.raises(ValueError, match="prompt"):
        verify_prompt_token_ids([], 100)
    with pytest.raises(ValueError, match="prompt_token_ids"):
        verify_prompt_token_ids([1, 100], 100)


def test_children_of_a_seeded_request_get_distinct_seeds():
    p = SamplingParams(n=3, seed=10)
    assert [p.child(i).seed for i in range(3)] == [10, 11, 12]
    assert all(p.child(i).n == 1 for i in range(3))
