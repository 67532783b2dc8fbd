"""Every wire type, one tagged union, one protocol version.

Runs in every process. The frontend sends AddRequest / AbortRequest to the scheduler and receives
RequestOutputDelta; the scheduler sends ExecuteBatch to the first worker and receives StepResult from the
last (which announces itself with WorkerReady once loaded). Control-plane pings (HealthPing /
HealthPong) and typed errors (ErrorReply) travel the same way.
Structs are decoded by type; nothing is pickled. The params a request carries are the Python API's own
SamplingParams and BeamSearchParams, whose checks run as they are decoded (the codec tells a value they
refuse from a message of the wrong shape). A new message means a Struct here, a member of ``Message``, a
``handle_*`` on the receiving actor and a round-trip test.
"""
from __future__ import annotations

from typing import Optional, Union

import msgspec

from actorserve.runtime.engine.beam_search import BeamSearchParams
from actorserve.runtime.engine.outputs import Logprob, RequestMetrics, SampleDelta
from actorserve.runtime.engine.sampling_params import SamplingParams

PROTOCOL_VERSION = 1


class AddRequest(msgspec.Struct, tag="add_request", frozen=True):
    request_id: str
    params: SamplingParams
    prompt_token_ids: Optional[list[int]] = None
    prompt: Optional[str] = None  # tokenized by the receiver when no ids are given
    beam_search: Optional[BeamSearchParams] = None  # a beam search instead of sampling (params unused)
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


class RequestOutputDelta(msgspec.Struct, tag="request_output", frozen=True):
    request_id: str
    samples: list[SampleDelta]
    finished: bool
    prompt_token_ids: Optional[list[int]] = None  # sent with the first delta only
    num_cached_tokens: int = 0
    # with the first delta only, when asked for: one entry per prompt token, None for the first
    prompt_logprobs: Optional[list[Optional[list[Logprob]]]] = None
    timings: Optional[RequestMetrics] = None  # on the last message


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


# -- one engine step: what the scheduler hands the first worker and what comes back from the last; in one
# process these are passed as they are --------------------------------------------------------------------

class NewRequest(msgspec.Struct, frozen=True):
    """A request the workers see for the first time: its params, and what the engine derived for it from
    the model (the EOS id, None where EOS is ignored; each bad word's tokens, as the tokenizer splits it)."""

    request_id: str
    prompt_token_ids: list[int]
    params: SamplingParams
    eos_token_id: Optional[int] = None
    bad_words_token_ids: Optional[list[list[int]]] = None


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
    without drafts); and their logprobs, for the requests that asked: a token's entries, the sampled
    token first, then the top-N (``outputs.ranked``)."""

    step: int
    sampled: dict[str, list[int]]
    logprobs: dict[str, list[list[Logprob]]]
    prompt_logprobs: dict[str, PromptLogprobs] = {}


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
