"""Verifying draft tokens: exact in distribution, as the speculative-sampling theorem gives it.

A request that carries k draft tokens d_1 .. d_k has k + 1 rows of target logits: row j predicts the
token after d_j (row 0 the one after the last real token). Each row is processed as the sampler
processes a row (bias, bans, penalties, temperature, min_p, top-k, top-p) with the history that row
would have had: the output so far and the drafts before it. Then, in order:

- greedy: d_j is kept while it is row j - 1's argmax; the first row whose argmax differs gives that
  argmax instead, and if every draft is kept the last row gives one more token (the bonus);
- sampled: d_j is kept with probability min(1, p(d_j) / q(d_j)), where q is the distribution the draft
  was drawn from (a draft model's), or one-hot where it was proposed without sampling (ngram, or a
  greedy draft model), making it p(d_j); a rejected draft is replaced by a draw from the residual
  max(0, p - q) normalised (p without d_j where q is one-hot). The tokens that come out are distributed as
  the target's own samples would be, whatever q is.

The acceptance draws and the residual's noise come from the request's target stream: its own generator
where it is seeded (so its output does not depend on the batch), else the sampler's. A request with a
grammar has each row masked to what the grammar allows there (its drafts were checked against it before
the step), so every token that comes out is one the grammar takes.
"""
from __future__ import annotations

import dataclasses
from typing import Optional

import torch

from actorserve.runtime.engine.outputs import Logprob
from actorserve.runtime.model.sampling.sampler import Sampler, SamplingRow


def verify(sampler: Sampler, logits: torch.Tensor, rows: list[SamplingRow], drafts: list[list[int]],
           masks: Optional[list[Optional[torch.Tensor]]] = None,
           draft_probs: Optional[list[Optional[torch.Tensor]]] = None,
           ) -> tuple[list[list[int]], list[list[Optional[list[Logprob]]]]]:
    """``logits`` holds, request by request, the ``len(drafts[i]) + 1`` rows of request i; ``masks[i]``,
    where given, the bool masks [rows, vocab] of what request i's grammar allows at each of them;
    ``draft_probs[i]``, where given, the distributions [drafts, vocab] request i's drafts were drawn from
    (None: one-hot, the drafts were chosen without sampling). Returns
    each request's tokens (the drafts it kept, then one of the target's) and their logprobs (None where the
    request asked for none)."""
    expanded: list[SamplingRow] = []
    for i, (row, draft) in enumerate(zip(rows, drafts)):
        mask = masks[i] if masks is not None else None
        for j in range(len(draft) + 1):  # row j has seen the drafts before it, and has its grammar's mask
            expanded.append(dataclasses.replace(row, output_ids=row.output_ids + draft[:j],
                                                allowed=None if mask is None else mask[j]))
    probs, argmax, state = sampler.distributions(logits, expanded)
    tokens: list[list[int]] = []
    token_rows: list[int] = []  # the row each token that came out was drawn at, for its logprobs
    at = 0
    for i, (row, draft) in enumerate(zip(rows, drafts)):
        q = draft_probs[i] if draft_probs is not None else None
        greedy = row.params.greedy
        out: list[int] = []
        for j in range(len(draft) + 1):
            r = at + j
            if greedy:
                best = int(argmax[r])
                out.append(best)
                if j == len(draft) or best != draft[j]:
                    break
                continue
            if j < len(draft):
                d = draft[j]
                p_d = float(probs[r, d])
                if sampler.uniform(row.generator) < (p_d if q is None else p_d / float(q[j, d])):
                    out.append(d)
                    continue
                if q is None:
                    residual = probs[r].clone()
                    residual[d] = 0.0
                else:
                    residual = (probs[r] - q[j, :probs.shape[1]]).clamp_(min=0.0)
                if float(residual.sum()) > 0.0:  # (else p <= q everywhere: p = q, and d was kept above)
                    out.append(sampler.draw(residual, row.generator))
                    break
                out.append(d)
                continue
            out.append(sampler.draw(probs[r], row.generator))
        tokens.append(out)
        token_rows.extend(range(at, at + len(out)))
        at += len(draft) + 1
    logprobs = iter(sampler.logprobs_of(state, token_rows, [t for out in tokens for t in out]))
    return tokens, [[next(logprobs) for _ in out] for out in tokens]
