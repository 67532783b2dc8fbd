"""Speculative decoding, the scheduler's side: which draft tokens a request's next step verifies.

The target model checks k draft tokens in one step (its rows for the last token and each draft), and the
rejection sampler (``runtime.model.sampling.rejection_sampler``) keeps the longest prefix it accepts plus one token
of its own; several tokens then cost one step. The scheduler reserves KV slots for the drafts, and gives
back the blocks of the rejected ones once the step is answered.

``ngram`` (prompt lookup) needs no second model: the last n tokens (n from ``prompt_lookup_max`` down to
``prompt_lookup_min``) are looked up earlier in the request's own tokens, and the tokens that followed
their most recent earlier occurrence are the draft. It pays where the output copies its input: edits,
summaries, code, RAG answers.

``draft_model`` runs a smaller model in the worker (``runtime.model.execution.draft_proposer``); here it only
reserves the slots, and the worker fills them at the start of the step. A request with a grammar is not
drafted for by it (its drafts would reach the scheduler's grammar check too late).
"""
from __future__ import annotations

from array import array
from typing import Optional, Sequence


# A draft slot whose token the worker's draft model proposes
TO_PROPOSE = -1


class NgramProposer:
    """Prompt lookup over a request's tokens (prompt and output), as vLLM's ``ngram`` method."""

    in_worker = False

    def __init__(self, num_speculative_tokens: int, prompt_lookup_min: int, prompt_lookup_max: int) -> None:
        self.k, self.min_n, self.max_n = num_speculative_tokens, prompt_lookup_min, prompt_lookup_max

    def propose(self, tokens: Sequence[int], limit: Optional[int] = None) -> list[int]:
        """Up to ``min(k, limit)`` draft tokens to follow ``tokens``, or none where no n-gram recurs."""
        k = self.k if limit is None else min(self.k, limit)
        if k <= 0 or len(tokens) <= self.min_n:
            return []
        # 4-byte token ids as bytes: bytes.rfind searches in C; a hit off a 4-byte boundary is skipped
        data = array("i", tokens).tobytes()
        end = len(tokens)
        for n in range(min(self.max_n, end - 1), self.min_n - 1, -1):
            suffix = data[4 * (end - n):]
            # an earlier occurrence starts at a token p <= end - n - 1, so it ends within data[:4 (end - 1)]
            limit = 4 * (end - 1)
            while (hit := data.rfind(suffix, 0, limit)) >= 0:
                if hit % 4 == 0:
                    start = hit // 4 + n
                    return list(tokens[start:start + k])
                limit = hit + 4 * n - 1  # next, an occurrence that starts before this misaligned one
        return []


class DraftSlots:
    """``draft_model`` in the scheduler: k draft slots a decode, their tokens left to the worker."""

    in_worker = True

    def __init__(self, num_speculative_tokens: int) -> None:
        self.k = num_speculative_tokens

    def propose(self, tokens: Sequence[int], limit: Optional[int] = None) -> list[int]:
        return [TO_PROPOSE] * (self.k if limit is None else min(self.k, limit))


def make_proposer(config) -> Optional[NgramProposer | DraftSlots]:
    """The proposer of a ``runtime.config.SpeculativeConfig`` (None: speculative decoding is off)."""
    if config is None:
        return None
    if config.method == "draft_model":
        return DraftSlots(config.num_speculative_tokens)
    return NgramProposer(config.num_speculative_tokens, config.prompt_lookup_min, config.prompt_lookup_max)


class SpecDecodeStats:
    """vLLM's ``spec_decode`` counters: steps that verified drafts, drafts proposed, drafts kept, and how
    many were kept at each position (the acceptance rate per position is kept / drafts there)."""

    def __init__(self, config) -> None:
        k = config.num_speculative_tokens if config is not None else 0
        self.num_drafts = 0
        self.num_draft_tokens = 0
        self.num_accepted_tokens = 0
        self.num_accepted_tokens_per_pos = [0] * k
        self.num_draft_tokens_per_pos = [0] * k

    def observe(self, proposed: int, kept: int) -> None:
        self.num_drafts += 1
        self.num_draft_tokens += proposed
        self.num_accepted_tokens += kept
        for i in range(proposed):
            self.num_draft_tokens_per_pos[i] += 1
        for i in range(kept):
            self.num_accepted_tokens_per_pos[i] += 1
