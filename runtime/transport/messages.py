"""Every wire type, one tagged union, one protocol version.

Runs in every process. The frontend sends AddRequest / AbortRequest to the scheduler and receives
RequestOutputDelta; the scheduler sends ExecuteBatch to the first worker and receives StepResult from the
last (which announces itself with WorkerReady once loaded). Control-plane pings (HealthPing /
HealthPong) and typed errors (ErrorReply) travel the same way.
Structs are frozen and decoded by type; nothing is pickled. A new message means a Struct here, a member of
``Message``, a ``handle_*`` on the receiving actor and a round-trip test.
"""
from __future__ import annotations

import dataclasses
import typing
from typing import Any, Optional, Union

import msgspec

from actorserve.runtime.engine.batch import ModelRunnerOutput, SchedulerOutput
from actorserve.runtime.engine.beam_search import BeamSearchParams

PROTOCOL_VERSION = 1


class WireSamplingParams(msgspec.Struct, frozen=True, omit_defaults=True, forbid_unknown_fields=True):
    """SamplingParams as a client sends them; unset fields take vLLM's defaults, an unknown one is refused
    (a misspelt parameter must not be silently ignored). Ranges are SamplingParams' to check."""

    n: int = 1
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    min_p: float = 0.0
    seed: Optional[int] = None
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    repetition_penalty: float = 1.0
    logit_bias: Optional[dict[int, float]] = None
    stop: Optional[list[str]] = None
    stop_token_ids: Optional[list[int]] = None
    ignore_eos: bool = False
    max_tokens: Optional[int] = 16
    min_tokens: int = 0
    logprobs: Optional[int] = None
    prompt_logprobs: Optional[int] = None
    skip_special_tokens: bool = True
    include_stop_str_in_output: bool = False
    allowed_token_ids: Optional[list[int]] = None
    bad_words: Optional[list[str]] = None
    truncate_prompt_tokens: Optional[int] = None
    # structured outputs: one of json (a schema object or its text), regex, choice, grammar, json_object
    structured_outputs: Optional[dict[str, Any]] = None


def _wire_shape(name: str, cls) -> type:
    """A dataclass's fields as a wire Struct, derived (not a copy that could drift): types checked when
    decoded, an unknown field refused; the dataclass checks the ranges when the receiver builds it."""
    hints = typing.get_type_hints(cls)
    fields = [(f.name, hints[f.name]) if f.default is dataclasses.MISSING else (f.name, hints[f.name], f.default)
              for f in dataclasses.fields(cls)]
    return msgspec.defstruct(name, fields, frozen=True, omit_defaults=True, forbid_unknown_fields=True,
                             module=__name__)


# BeamSearchParams as a client sends them
WireBeamSearchParams = _wire_shape("WireBeamSearchParams", BeamSearchParams)


class AddRequest(msgspec.Struct, tag="add_request", frozen=True):
    request_id: str
    params: WireSamplingParams
    prompt_token_ids: Optional[list[int]] = None
    prompt: Optional[str] = None  # tokenized by the receiver when no ids are given
    beam_search: Optional[WireBeamSearchParams] = None  # a beam search instead of sampling (params unused)
    version: int = PROTOCOL_VERSION
    api_key: Optional[str] = None  # required when the server has one (docs/protocol.md)


class AbortRequest(msgspec.Struct, tag="abort_request", frozen=True):
    request_id: str
    api_key: Optional[str] = None


class PauseRequest(msgspec.Struct, tag="pause_request", frozen=True):
    """Flow control: a client that has fallen behind a request's outputs pauses it (``paused`` true) and
    resumes it once it has caught up."""

    request_id: str
    paused: bool = True
    api_key: Optional[str] = None


class TokenLogprob(msgspec.Struct, frozen=True, array_like=True):
    token_id: int
    logprob: float
    rank: int
    decoded_token: Optional[str]


class SampleDelta(msgspec.Struct, frozen=True):
    """What one of a request's n samples produced since the last delta."""

    index: int
    token_ids: list[int]
    text: str
    logprobs: Optional[list[list[TokenLogprob]]] = None
    finish_reason: Optional[str] = None
    stop_reason: Union[int, str, None] = None


class RequestTimings(msgspec.Struct, frozen=True, array_like=True):
    """RequestMetrics: seconds queued, in prefill, in decode, and in inference (prefill + decode)."""

    queued: float
    prefill: float
    decode: float
    inference: float


class RequestOutputDelta(msgspec.Struct, tag="request_output", frozen=True):
    request_id: str
    samples: list[SampleDelta]
    finished: bool
    prompt_token_ids: Optional[list[int]] = None  # sent with the first delta only
    num_cached_tokens: int = 0
    # with the first delta only, when asked for: one entry per prompt token, None for the first
    prompt_logprobs: Optional[list[Optional[list[TokenLogprob]]]] = None
    timings: Optional[RequestTimings] = None  # on the last message


class ErrorReply(msgspec.Struct, tag="error", frozen=True):
    """A typed failure: kind is the exception class name (ValueError, EngineDeadError, ProtocolError)."""

    kind: str
    message: str
    request_id: Optional[str] = None
    nonce: Optional[int] = None  # the control request (sleep, wake_up) it answers


class HealthPing(msgspec.Struct, tag="health_ping", frozen=True):
    nonce: int
    api_key: Optional[str] = None


class HealthPong(msgspec.Struct, tag="health_pong", frozen=True):
    nonce: int
    num_running: int
    num_waiting: int
    kv_cache_usage: float
    num_preemptions: int = 0
    # tokens per engine step: counts per bucket (stats.ITERATION_TOKEN_BUCKETS, then above them), and the sum
    step_token_counts: list[int] = []
    step_token_sum: int = 0
    # speculative decoding (runtime.engine.spec_decode.SpecDecodeStats): steps with drafts, drafts, kept ones,
    # and kept ones by position (a list of num_speculative_tokens: empty where speculation is off)
    spec_num_drafts: int = 0
    spec_num_draft_tokens: int = 0
    spec_num_accepted_tokens: int = 0
    spec_accepted_per_pos: list[int] = []


class SleepRequest(msgspec.Struct, tag="sleep", frozen=True):
    """Sleep mode (an operator's call): a client asks the scheduler, which passes it round the worker ring
    once nothing is in flight; each stage adds the bytes it released to ``released``."""

    nonce: int
    level: int = 1
    api_key: Optional[str] = None
    released: dict[str, int] = {}
    error: Optional[str] = None  # round the ring: a stage failed, and the later ones only pass it on


class WakeUpRequest(msgspec.Struct, tag="wake_up", frozen=True):
    """Restore the released memory of ``tags`` (weights, kv_cache; None: both), round the same ring."""

    nonce: int
    tags: Optional[list[str]] = None
    api_key: Optional[str] = None
    error: Optional[str] = None  # as SleepRequest's


class SleepStatusRequest(msgspec.Struct, tag="is_sleeping", frozen=True):
    nonce: int
    api_key: Optional[str] = None


class SleepStatus(msgspec.Struct, tag="sleep_status", frozen=True):
    """The answer to the three above; from the last stage to the scheduler, and from it to the client.
    ``error``: a stage failed to sleep or wake (the engine stays as that stage left it)."""

    nonce: int
    sleeping: bool
    level: Optional[int] = None
    released: dict[str, int] = {}
    error: Optional[str] = None


class ExecuteBatch(msgspec.Struct, tag="execute_batch", frozen=True):
    batch: SchedulerOutput


class StepResult(msgspec.Struct, tag="step_result", frozen=True):
    result: ModelRunnerOutput


class WorkerReady(msgspec.Struct, tag="worker_ready", frozen=True):
    """A worker loaded its stage and sized its KV cache; the scheduler builds its engine from this."""

    rank: int
    vocab_size: int
    eos_token_id: Optional[int]
    max_model_len: int
    num_kv_blocks: int
    sliding_window: Optional[int] = None  # ModelFacts.sliding_window
    num_state_slots: int = 0  # ModelFacts.num_state_slots


class Shutdown(msgspec.Struct, tag="shutdown", frozen=True):
    """Stop the engine: taken only from the launcher's control channel, never from a client."""

    reason: str = ""


Message = Union[AddRequest, AbortRequest, PauseRequest, RequestOutputDelta, ErrorReply, HealthPing, HealthPong,
                SleepRequest, WakeUpRequest, SleepStatusRequest, SleepStatus,
                ExecuteBatch, StepResult, WorkerReady, Shutdown]
