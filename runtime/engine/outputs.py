"""What users get back: vLLM-shaped RequestOutput / CompletionOutput / Logprob."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional, Union


@dataclass
class Logprob:
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


@dataclass
class RequestMetrics:
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


@dataclass
class SampleUpdate:
    """What one sample produced since its last update: the streaming delta."""

    index: int
    token_ids: list[int]
    text: str
    logprobs: Optional[list[dict[int, Logprob]]]
    finish_reason: Optional[str]
    stop_reason: Union[int, str, None]


@dataclass
class RequestUpdate:
    """One step's news for a request: the cumulative output and the per-sample deltas."""

    output: RequestOutput
    samples: list[SampleUpdate]
