"""What users get back: vLLM-shaped RequestOutput / CompletionOutput / Logprob, and the pieces a stream
carries (SampleDelta, Logprob, RequestMetrics), which are msgspec Structs: the objects the engine makes are
the ones the ZMQ protocol sends (``RequestOutputDelta``) and a client puts in its RequestOutput."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional, Union

import msgspec


class Logprob(msgspec.Struct, array_like=True):
    """vLLM's Logprob (a token's logprob, its rank among the vocabulary, its text), naming its token too: a
    position's entries are a dict by token id in Python (vLLM's shape) and the list of its values on the
    wire, ``[token_id, logprob, rank, decoded_token]``."""

    token_id: int
    logprob: float
    rank: int
    decoded_token: Optional[str] = None


@dataclass
class CompletionOutput:
    index: int
    text: str = ""
    token_ids: list[int] = field(default_factory=list)
    cumulative_logprob: Optional[float] = None
    logprobs: Optional[list[dict[int, Logprob]]] = None
    finish_reason: Optional[str] = None  # "stop", "length", "abort"
    stop_reason: Union[int, str, None] = None

    def finished(self) -> bool:
        return self.finish_reason is not None


class RequestMetrics(msgspec.Struct, array_like=True):
    """Where a finished request's time went, measured in the engine (seconds), as vLLM's metrics split
    it: waiting for its first step, prefill (to the first token), decode (to the last), and the two."""

    queued_time: float
    prefill_time: float
    decode_time: float
    inference_time: float


@dataclass
class RequestOutput:
    request_id: str
    prompt: Optional[str]
    prompt_token_ids: list[int]
    outputs: list[CompletionOutput]
    finished: bool = False
    num_cached_tokens: int = 0
    # with SamplingParams.prompt_logprobs: one entry per prompt token, None for the first (vLLM's shape)
    prompt_logprobs: Optional[list[Optional[dict[int, Logprob]]]] = None
    metrics: Optional[RequestMetrics] = None  # once finished


class SampleDelta(msgspec.Struct, frozen=True):
    """What one of a request's n samples produced since its last delta: the streaming piece; its logprobs
    are each new token's entries, the sampled token first."""

    index: int
    token_ids: list[int]
    text: str
    logprobs: Optional[list[list[Logprob]]] = None
    finish_reason: Optional[str] = None
    stop_reason: Union[int, str, None] = None


@dataclass
class RequestUpdate:
    """One step's news for a request: the cumulative output and the per-sample deltas."""

    output: RequestOutput
    samples: list[SampleDelta]


def ranked(token: int, logprob: float, rank: int, top_ids: list[int], top_values: list[float]) -> list[Logprob]:
    """One position's entries as the sampler ranks them: the chosen token first (its rank among the whole
    vocabulary), then the top-N, ranks 1 to N; their text is the engine's to fill in."""
    return [Logprob(token, logprob, rank)] + [Logprob(t, v, r) for r, (t, v) in enumerate(zip(top_ids, top_values), 1)]


def logprob_entries(entries: Optional[list[Optional[dict[int, Logprob]]]]) -> Optional[list[Optional[list[Logprob]]]]:
    """Positions' entries as a stream sends them (None stays None: a prompt's first token has none)."""
    if entries is None:
        return None
    return [None if entry is None else list(entry.values()) for entry in entries]


def logprob_dict(entries: list[Logprob]) -> dict[int, Logprob]:
    """One position's sent entries as vLLM's dict by token id, of the same Logprob objects."""
    return {lp.token_id: lp for lp in entries}
