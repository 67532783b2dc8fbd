"""What the scheduler hands a worker each step and what comes back.

These are msgspec Structs so that the same values cross the process boundary unchanged once the transport
carries them; in one process they are passed as they are.
"""
from __future__ import annotations

from typing import Optional

import msgspec

from actorserve.runtime.engine.sampling_params import is_greedy


class SamplingSpec(msgspec.Struct, frozen=True):
    """The parts of SamplingParams that the sampler needs, sent once per request."""

    temperature: float
    top_p: float
    top_k: int
    min_p: float
    seed: Optional[int]
    presence_penalty: float
    frequency_penalty: float
    repetition_penalty: float
    logit_bias: Optional[dict[int, float]]
    min_tokens: int
    stop_token_ids: list[int]  # with the EOS id below, masked until min_tokens are out
    eos_token_id: Optional[int]
    logprobs: Optional[int]
    prompt_logprobs: Optional[int] = None
    allowed_token_ids: Optional[list[int]] = None
    bad_words_token_ids: Optional[list[list[int]]] = None  # each word's tokens, as the tokenizer splits it

    @property
    def greedy(self) -> bool:
        return is_greedy(self.temperature)


class NewRequest(msgspec.Struct, frozen=True):
    request_id: str
    prompt_token_ids: list[int]
    sampling: SamplingSpec


class ScheduledChunk(msgspec.Struct, frozen=True):
    """Tokens of one request to run this step, starting at position ``start``; the last ``num_draft`` of
    them are draft tokens (speculative decoding) for the sampler to verify. ``propose``: the worker's
    draft model proposes that many drafts and appends them first (their KV slots are allocated)."""

    request_id: str
    token_ids: list[int]
    start: int
    block_ids: list[int]
    sample: bool  # this chunk reaches the request's last token: sample the next one (and verify the drafts)
    num_draft: int = 0
    propose: int = 0
    # structured outputs: the tokens its grammar allows next (int32 words; bit j of word i is token 32 i + j)
    grammar_bitmask: Optional[bytes] = None
    state_slot: int = -1  # the request's slot in the worker's recurrent-state cache (hybrid models; else -1)


class SchedulerOutput(msgspec.Struct, frozen=True):
    step: int
    new_requests: list[NewRequest]
    chunks: list[ScheduledChunk]
    finished_request_ids: list[str]  # the worker drops its per-request sampling state for these
    # (source, destination) KV blocks to copy in every layer before the step runs: a forked beam's own copy
    # of its parent's last, partly filled block (copy-on-write)
    block_copies: list[tuple[int, int]] = []

    @property
    def num_tokens(self) -> int:
        return sum(len(c.token_ids) for c in self.chunks)


class TokenLogprobs(msgspec.Struct, frozen=True):
    """The sampled token's logprob and rank, and the top-N alternatives, from the raw logits."""

    logprob: float
    rank: int
    top_token_ids: list[int]
    top_logprobs: list[float]


class PromptLogprobs(msgspec.Struct, frozen=True):
    """Logprobs of the prompt tokens at positions ``start``, ``start + 1``, ...: what one chunk's rows
    predicted for the tokens that follow them (a chunk never covers position 0, which has none)."""

    start: int
    logprobs: list[float]
    ranks: list[int]
    top_token_ids: list[list[int]]
    top_logprobs: list[list[float]]


class ModelRunnerOutput(msgspec.Struct, frozen=True):
    """Each sampled request's new tokens: the drafts it kept, then one of the model's own (one token
    without drafts); and their logprobs, for the requests that asked."""

    step: int
    sampled: dict[str, list[int]]
    logprobs: dict[str, list[TokenLogprobs]]
    prompt_logprobs: dict[str, PromptLogprobs] = {}
