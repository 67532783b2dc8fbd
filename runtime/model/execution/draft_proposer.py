"""Speculative decoding's ``draft_model`` method: a smaller model with the target's vocabulary proposes
the draft tokens, in the worker, at the start of the step that verifies them.

The draft keeps a paged KV cache of its own, addressed by the target's block tables. It runs over every
token the step computes, prompt chunks too, so a block the target caches holds the draft's KV as well and
a prefix-cache hit serves both. A decode with ``propose = k`` slots runs its token (after any kept draft
the draft never fed: the last of a run kept whole), then k - 1 single-token steps, each feeding the draft
just proposed. Those tokens sit in the slots the scheduler reserved for the target's verification, so the
draft needs none of its own; the KV it writes for drafts the target rejects is overwritten, as the
target's is, when those positions are computed again.

A greedy request takes the draft's argmax. A sampled one draws from the draft's distribution (the
sampler's processing, with the drafts before as history), which goes to the rejection sampler as q. Its
noise comes from the draft's own stream (``sampler.noise_stream(seed, "draft")``, or the proposer's shared
one for unseeded requests): were it the target's, the residual drawn after a rejection could reuse the
noise that chose the rejected draft, and the output would lean towards the draft's choices.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Optional

import msgspec
import torch

from actorserve.runtime.transport.messages import ScheduledChunk, SchedulerOutput
from actorserve.runtime.model.sampling.sampler import Sampler, SamplingRow, noise_stream


@dataclass
class _DraftState:
    """What the draft's cache holds of one request: the KV of its true tokens below ``fed``, and of the
    drafts it proposed last (from ``drafts_at``), all but the last of them."""

    generator: Optional[torch.Generator]
    fed: int = 0
    drafts: list[int] = field(default_factory=list)
    drafts_at: int = -1


class DraftModelProposer:
    def __init__(self, runner, seed: int = 0) -> None:
        self.runner = runner  # the draft model's ModelRunner: its weights, KV cache and attention plans
        # its shared stream serves the unseeded requests
        self.sampler = Sampler(seed, role="draft", device=runner.device)
        self._states: dict[str, _DraftState] = {}

    @torch.inference_mode()
    def propose(self, batch: SchedulerOutput, rows: dict[str, SamplingRow]
                ) -> tuple[SchedulerOutput, dict[str, torch.Tensor]]:
        """The batch with every ``propose`` slot filled by a draft token, and the distributions [k, V] the
        drafts of each sampled request were drawn from."""
        for rid in batch.finished_request_ids:
            self._states.pop(rid, None)
        for new in batch.new_requests:
            seed = new.params.seed
            self._states[new.request_id] = _DraftState(
                None if seed is None else noise_stream(seed, "draft", self.runner.device))
        feeds = [self._feed(chunk) for chunk in batch.chunks]
        proposing = [c for c in batch.chunks if c.propose > 0]
        logits = self._run(batch.step, feeds)
        if not proposing:
            return batch, {}
        drafts: dict[str, list[int]] = {c.request_id: [] for c in proposing}
        dists: dict[str, list[torch.Tensor]] = {c.request_id: [] for c in proposing}
        active = proposing
        while True:
            draft_rows = [rows[c.request_id] for c in active]
            probs, argmax, _ = self.sampler.distributions(
                logits, [dataclasses.replace(r, generator=None, output_ids=r.output_ids + drafts[c.request_id])
                         for c, r in zip(active, draft_rows)])
            for i, (c, r) in enumerate(zip(active, draft_rows)):
                if r.params.greedy:
                    token = int(argmax[i])
                else:
                    dists[c.request_id].append(probs[i])
                    token = self.sampler.draw(probs[i], self._states[c.request_id].generator)
                drafts[c.request_id].append(token)
            active = [c for c in active if len(drafts[c.request_id]) < c.propose]
            if not active:
                break
            logits = self._run(batch.step, [ScheduledChunk(c.request_id, [drafts[c.request_id][-1]],
                                                           c.start + len(drafts[c.request_id]), c.block_ids, True)
                                            for c in active])
        chunks = []
        for c in batch.chunks:
            new = drafts.get(c.request_id)
            if new is not None:
                state = self._states[c.request_id]
                state.drafts, state.drafts_at = new, c.start + 1
                c = msgspec.structs.replace(c, token_ids=c.token_ids + new, num_draft=len(new), propose=0)
            chunks.append(c)
        return (msgspec.structs.replace(batch, chunks=chunks),
                {rid: torch.stack(d) for rid, d in dists.items() if d})

    def _feed(self, chunk: ScheduledChunk) -> ScheduledChunk:
        """What the draft runs of a chunk: its tokens, after the kept drafts the draft has not fed."""
        state = self._states[chunk.request_id]
        start, tokens = chunk.start, list(chunk.token_ids)
        if state.fed < start and state.drafts and state.fed == state.drafts_at:
            # positions drafts_at .. start - 1 are kept drafts; all but the last draft were fed
            fed = min(start, state.drafts_at + len(state.drafts) - 1)
            tokens = state.drafts[fed - state.drafts_at:start - state.drafts_at] + tokens
            start = fed
        # (else a recompute from ``start``, or a cached prefix: its blocks hold the draft's KV too)
        state.fed = chunk.start + len(chunk.token_ids)
        if chunk.propose:
            state.drafts, state.drafts_at = [], -1
        # a decode's tokens are attended as decode rows (as the target's drafted decodes are), so that a
        # decode step stays on the draft's decode fast path
        return ScheduledChunk(chunk.request_id, tokens, start, chunk.block_ids, chunk.propose > 0,
                              num_draft=len(tokens) - 1 if chunk.propose else 0)

    def _run(self, step: int, chunks: list[ScheduledChunk]) -> Optional[torch.Tensor]:
        """The draft's logits at the last token of each sampling chunk, in the chunks' order."""
        inputs = self.runner.prepare_inputs(SchedulerOutput(step, [], chunks, []))
        last_rows = {c.request_id: first + len(c.token_ids) - 1 for c, first in inputs.chunk_rows if c.sample}
        if not last_rows:
            self.runner.run_layers(inputs)  # its KV only
            return None
        rows = torch.tensor([last_rows[c.request_id] for c in chunks if c.sample], dtype=torch.long,
                            device=self.runner.device)
        return self.runner.forward(dataclasses.replace(inputs, logits_indices=rows))
