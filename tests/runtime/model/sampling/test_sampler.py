"""The sampler by distribution (chi-square on a narrow vocab) and its per-request seeds."""
import math

import pytest
import torch

from actorserve.runtime.engine.sampling_params import SamplingParams
from actorserve.runtime.model.sampling.sampler import Sampler, SamplingRow

LOGITS = torch.tensor([2.0, 1.5, 1.0, 0.5, 0.0, -0.5, -1.0, -2.0])
SAMPLES = 20_000


def spec(**kw):
    return SamplingParams(**{"temperature": 1.0, **kw})


def draw(s, n=SAMPLES, seed=0):
    rows = [SamplingRow(s, None, [], []) for _ in range(n)]
    tokens, _ = Sampler(seed)(LOGITS.repeat(n, 1), rows)
    return torch.bincount(torch.tensor(tokens), minlength=len(LOGITS)).double()


def chi_square_p(counts, probs):
    keep = probs > 0
    assert counts[~keep].sum() == 0, "sampled a token that should have been filtered out"
    exp = probs[keep] * counts.sum()
    stat = ((counts[keep] - exp) ** 2 / exp).sum()
    df = int(keep.sum()) - 1
    return float(torch.special.gammaincc(torch.tensor(df / 2.0), stat / 2.0))


def expected(temperature=1.0, top_k=0, top_p=1.0, min_p=0.0):
    probs = (LOGITS.double() / temperature).softmax(-1)
    order = probs.argsort(descending=True)
    keep = torch.ones_like(probs, dtype=torch.bool)
    if min_p:
        keep &= probs >= min_p * probs.max()
    if top_k:
        keep[order[top_k:]] = False
    p = torch.where(keep, probs, 0.0)
    p = p / p.sum()
    if top_p < 1.0:
        sorted_p = p[order]
        before = sorted_p.cumsum(0) - sorted_p
        drop = before >= top_p
        drop[0] = False
        p[order[drop]] = 0.0
        p = p / p.sum()
    return p


CASES = [
    {}, {"temperature": 0.5}, {"temperature": 2.0}, {"top_k": 3}, {"top_p": 0.7},
    {"min_p": 0.2}, {"temperature": 0.7, "top_k": 5, "top_p": 0.9},
]


@pytest.mark.parametrize("kw", CASES, ids=[str(c) or "plain" for c in CASES])
def test_distribution(kw):
    counts = draw(spec(**kw))
    probs = expected(**kw)
    assert chi_square_p(counts, probs) > 1e-3


def test_distribution_test_rejects_a_wrong_temperature():
    counts = draw(spec(temperature=1.0))
    assert chi_square_p(counts, expected(temperature=1.3)) < 1e-6


def test_greedy_rows_take_the_argmax_beside_sampled_rows():
    rows = [SamplingRow(spec(temperature=0.0), None, [], []), SamplingRow(spec(), None, [], [])] * 50
    tokens, _ = Sampler(0)(LOGITS.repeat(100, 1), rows)
    assert all(t == 0 for t in tokens[::2])
    assert len(set(tokens[1::2])) > 1


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
def test_plain_greedy_rows_rank_the_logits_in_their_dtype(dtype):
    """A plain greedy batch takes the argmax of the model-dtype logits (no fp32 copy); the same rows with
    anything that reads or alters the logits still get it from the fp32 path."""
    logits = torch.randn(64, 1000, generator=torch.Generator().manual_seed(0)).to(dtype)
    logits[3, 10] = logits[3, 20] = logits[3].max() + 1  # a tie: the first index wins on both paths
    want = logits.float().argmax(-1).tolist()
    plain = [SamplingRow(spec(temperature=0.0), None, [], []) for _ in range(64)]
    assert Sampler()(logits, plain)[0] == want
    with_logprobs = [SamplingRow(spec(temperature=0.0, logprobs=1), None, [], []) for _ in range(64)]
    tokens, lps = Sampler()(logits, with_logprobs)
    assert tokens == want and all(lp is not None for lp in lps)
    assert want[3] == 10


def test_seeded_rows_do_not_depend_on_the_batch():
    def run(batch_size, position):
        gen = torch.Generator().manual_seed(1234)
        out = []
        sampler = Sampler(99)
        for _ in range(20):
            rows = [SamplingRow(spec(), None, [], []) for _ in range(batch_size)]
            rows[position] = SamplingRow(spec(seed=1234), gen, [], [])
            tokens, _ = sampler(LOGITS.repeat(batch_size, 1), rows)
            out.append(tokens[position])
        return out

    assert run(1, 0) == run(7, 3) == run(16, 15)


def test_penalties_bias_and_min_tokens():
    s = spec(temperature=0.0, logit_bias={7: 100.0})
    tokens, _ = Sampler()(LOGITS[None], [SamplingRow(s, None, [], [])])
    assert tokens == [7]
    s = spec(temperature=0.0, min_tokens=2, stop_token_ids=[1])
    tokens, _ = Sampler()(LOGITS[None], [SamplingRow(s, None, [], [5], eos_token_id=0)])
    assert tokens == [2]
    s = spec(temperature=0.0, frequency_penalty=0.3)
    tokens, _ = Sampler()(LOGITS[None], [SamplingRow(s, None, [], [0, 0, 0])])  # 2 - 0.9 < 1.5
    assert tokens == [1]
    s = spec(temperature=0.0, repetition_penalty=2.0)
    tokens, _ = Sampler()(LOGITS[None], [SamplingRow(s, None, [0], [])])  # 2 / 2 < 1.5
    assert tokens == [1]
    s = spec(temperature=0.0, presence_penalty=1.5)
    tokens, _ = Sampler()(LOGITS[None], [SamplingRow(s, None, [], [0, 1])])
    assert tokens == [2]


def test_logprobs_are_raw_and_ranked():
    s = spec(temperature=0.0, logprobs=3, logit_bias={5: 50.0})
    tokens, lps = Sampler()(LOGITS[None], [SamplingRow(s, None, [], [])])
    raw = LOGITS.log_softmax(-1)
    chosen, *top = lps[0]
    assert tokens == [5] and (chosen.token_id, chosen.rank) == (5, 6)
    assert math.isclose(chosen.logprob, float(raw[5]), rel_tol=1e-6)
    assert [e.token_id for e in top] == [0, 1, 2] and [e.rank for e in top] == [1, 2, 3]
    assert [e.logprob for e in top] == pytest.approx(raw[:3].tolist())


def test_allowed_token_ids_limit_the_draw_but_not_the_logprobs():
    s = spec(allowed_token_ids=[2, 5], logprobs=1)
    counts = draw(s, n=2000)
    assert counts[2] > 0 and counts[5] > 0 and counts.sum() == counts[2] + counts[5]
    row = SamplingRow(spec(temperature=0.0, allowed_token_ids=[3, 6], logprobs=1), None, [], [])
    tokens, logprobs = Sampler(0)(LOGITS[None, :], [row])
    assert tokens == [3]
    assert [e.token_id for e in logprobs[0][1:]] == [0]  # from the raw logits, as vLLM's default logprobs


def test_bad_words_ban_the_token_that_would_complete_them():
    greedy = dict(temperature=0.0)
    one = SamplingRow(spec(**greedy), None, [], [], bad_words_token_ids=[[0]])
    assert Sampler(0)(LOGITS[None, :], [one])[0] == [1]
    # the two-token word [4, 0]: banned only right after a 4
    after = SamplingRow(spec(**greedy), None, [], [7, 4], bad_words_token_ids=[[4, 0]])
    before = SamplingRow(spec(**greedy), None, [], [4, 7], bad_words_token_ids=[[4, 0]])
    assert Sampler(0)(LOGITS.repeat(2, 1), [after, before])[0] == [1, 0]
