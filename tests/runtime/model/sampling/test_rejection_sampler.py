"""The rejection sampler: greedy keeps exactly the drafts the target's argmax agrees with; sampled, the
tokens that come out are distributed as the target's own samples (chi-square, p > 0.001), whatever the
drafts; a seeded request's tokens do not depend on the batch."""
import math

import pytest
import torch

from actorserve.runtime.engine.sampling_params import SamplingParams
from actorserve.runtime.model.sampling.rejection_sampler import verify
from actorserve.runtime.model.sampling.sampler import Sampler, SamplingRow

V = 8


def spec(**kw) -> SamplingParams:
    return SamplingParams(**{"temperature": 1.0, **kw})


def row(s: SamplingParams, seed=None) -> SamplingRow:
    return SamplingRow(s, None if seed is None else torch.Generator().manual_seed(seed), [1, 2], [])


def test_greedy_keeps_the_agreeing_drafts_then_the_targets_token():
    logits = torch.full((4, V), -5.0)
    logits[0, 3] = logits[1, 4] = logits[2, 1] = logits[3, 6] = 5.0  # the target's argmax per row
    r = row(spec(temperature=0.0))
    assert verify(Sampler(), logits, [r], [[3, 4, 2]])[0] == [[3, 4, 1]]  # third draft rejected
    assert verify(Sampler(), logits, [r], [[3, 4, 1]])[0] == [[3, 4, 1, 6]]  # all kept, and the bonus
    assert verify(Sampler(), logits[:1], [r], [[]])[0] == [[3]]  # no drafts: one token
    assert verify(Sampler(), logits, [r], [[0, 4, 1]])[0] == [[3]]


def test_each_row_sees_the_drafts_before_it():
    """A repetition penalty at row j counts the drafts before j as output: here it turns the argmax."""
    logits = torch.tensor([[2.0, 1.9, 0, 0, 0, 0, 0, 0]] * 2)
    r = row(spec(temperature=0.0, presence_penalty=1.0))
    assert verify(Sampler(), logits, [r], [[0]])[0] == [[0, 1]]  # row 1 has seen token 0: 1.0 < 1.9


def _chi_square_p(counts: torch.Tensor, probs: torch.Tensor) -> float:
    n = counts.sum()
    expected = probs * n
    keep = expected > 0
    stat = float((((counts - expected) ** 2)[keep] / expected[keep]).sum())
    return chi_square_tail(stat, int(keep.sum()) - 1)


def chi_square_tail(stat: float, dof: int) -> float:
    """P(X >= stat) for X ~ chi-square(dof), by the Wilson-Hilferty cube-root normal approximation."""
    z = ((stat / dof) ** (1 / 3) - (1 - 2 / (9 * dof))) / math.sqrt(2 / (9 * dof))
    return 0.5 * math.erfc(z / math.sqrt(2))


@pytest.mark.parametrize("draft", [[3, 5], [0, 0], [7, 2]])  # likely, unlikely and impossible-ish drafts
def test_sampled_tokens_follow_the_target_distribution(draft):
    torch.manual_seed(0)
    base = torch.tensor([1.0, 0.2, -1.0, 2.0, 0.5, 1.5, -0.5, -30.0])
    n = 30000
    # every request: rows for after the prompt, after draft[0], after draft[1]; the target's distribution
    # at row j depends on j only, so the first token follows p0, and the second (where the first draft
    # was kept) p1
    per_row = [base, base.roll(1), base.roll(2)]
    logits = torch.stack(per_row * n)
    rows = [row(spec(temperature=0.8))] * n
    tokens, _ = verify(Sampler(seed=1), logits, rows, [draft] * n)
    p = [torch.softmax(x / 0.8, dim=-1) for x in per_row]
    first = torch.bincount(torch.tensor([t[0] for t in tokens]), minlength=V).float()
    assert _chi_square_p(first, p[0]) > 1e-3
    seconds = [t[1] for t in tokens if t[0] == draft[0] and len(t) > 1]
    if len(seconds) > 1000:
        second = torch.bincount(torch.tensor(seconds), minlength=V).float()
        assert _chi_square_p(second, p[1]) > 1e-3
    kept = sum(t[0] == draft[0] for t in tokens) / n  # a draft is kept with the target's probability of it
    assert abs(kept - float(p[0][draft[0]])) < 0.015


def test_a_wrong_acceptance_rule_fails_the_chi_square():
    """The test above can fail: keeping every draft (q taken as p) skews the first token far off p."""
    base = torch.tensor([1.0, 0.2, -1.0, 2.0, 0.5, 1.5, -0.5, -30.0])
    p = torch.softmax(base, dim=-1)
    skewed = torch.bincount(torch.full((30000,), 5), minlength=V).float()
    assert _chi_square_p(skewed, p) < 1e-3


def test_a_seeded_request_does_not_depend_on_the_batch():
    logits = torch.randn(3, V, generator=torch.Generator().manual_seed(3))
    noise = torch.randn(9, V)
    alone = verify(Sampler(seed=5), logits, [row(spec(seed=7), seed=7)], [[2, 4]])[0]
    batch = torch.cat([noise[:3], logits, noise[3:]])
    others = [row(spec()), row(spec(temperature=0.0))]
    mixed = verify(Sampler(seed=9), batch, [others[0], row(spec(seed=7), seed=7), others[1]],
                   [[1, 1], [2, 4], [0, 3, 5, 6, 7]])[0]
    assert mixed[1] == alone[0]


def test_logprobs_come_from_each_tokens_own_row():
    logits = torch.randn(3, V, generator=torch.Generator().manual_seed(4))
    r = row(spec(temperature=0.0, logprobs=2))
    draft = [int(logits[0].argmax()), int(logits[1].argmax())]
    tokens, logprobs = verify(Sampler(), logits, [r], [draft])
    assert tokens[0] == draft + [int(logits[2].argmax())]
    for j, (token, lp) in enumerate(zip(tokens[0], logprobs[0])):
        assert lp[0].logprob == pytest.approx(float(logits[j].log_softmax(-1)[token]), abs=1e-6) and lp[0].rank == 1
