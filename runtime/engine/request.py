"""Per-request state kept by the scheduler: tokens, progress, status, and why it finished."""
from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import Any, Optional

from actorserve.runtime.engine.sampling_params import SamplingParams


class RequestStatus(enum.Enum):
    WAITING = "waiting"
    RUNNING = "running"
    PREEMPTED = "preempted"
    FINISHED_STOPPED = "stop"
    FINISHED_LENGTH = "length"
    FINISHED_ABORTED = "abort"

    @property
    def finished(self) -> bool:
        return self in (RequestStatus.FINISHED_STOPPED, RequestStatus.FINISHED_LENGTH, RequestStatus.FINISHED_ABORTED)


@dataclass
class Request:
    request_id: str
    prompt_token_ids: list[int]
    params: SamplingParams
    arrival: int  # a monotonically increasing admission number: FCFS order
    max_total_tokens: int  # prompt + output may not exceed this (max_model_len)
    eos_token_id: Optional[int] = None
    output_token_ids: list[int] = field(default_factory=list)
    num_computed_tokens: int = 0
    num_cached_tokens: int = 0  # prompt tokens served by the prefix cache on first admission
    status: RequestStatus = RequestStatus.WAITING
    stop_reason: Optional[object] = None  # the stop string or stop token id that ended it
    num_preemptions: int = 0
    # Prefill of this request waits until this sibling (an n>1 request's first sample) has its prompt cached.
    wait_for: Optional["Request"] = None
    bad_words_token_ids: Optional[list[list[int]]] = None  # params.bad_words, tokenized by the engine
    grammar: Optional[Any] = None  # its structured outputs' state (runtime.engine.structured_outputs.GrammarState)
    paused: bool = False  # its client is not taking its outputs: not scheduled until resumed (flow control)

    def token_slice(self, start: int, end: int) -> list[int]:
        """Tokens [start, end) of prompt + output, without building the whole list (this runs every step)."""
        p = len(self.prompt_token_ids)
        if end <= p:
            return self.prompt_token_ids[start:end]
        if start >= p:
            return self.output_token_ids[start - p:end - p]
        return self.prompt_token_ids[start:] + self.output_token_ids[:end - p]

    @property
    def num_tokens(self) -> int:
        return len(self.prompt_token_ids) + len(self.output_token_ids)

    @property
    def prompt_done(self) -> bool:
        return self.num_computed_tokens >= len(self.prompt_token_ids)
