"""Typed errors raised to users of every process; each says what went wrong in words a caller can act on."""


class ActorServeError(Exception):
    """Base of every error this project raises on purpose."""


class ModelLoadError(ActorServeError):
    """The model could not be loaded: missing file, unknown architecture, or a parameter left unwritten."""


class EngineDeadError(ActorServeError):
    """The engine stopped (a process died or was shut down); in-flight and new requests fail with this."""


class EngineStartError(EngineDeadError):
    """The engine failed before it was ready (a bad model path, out of memory, a process that died while
    loading). Every caller that was waiting for the start gets it; an engine whose start failed stays
    failed (make a new one to try again)."""


class EngineOverloadedError(ActorServeError):
    """The engine's queue is full (``max_waiting_seqs`` sequences wait for a place in the batch): the request is
    refused, nothing of it queued, and may be sent again once the queue drains (HTTP: 503 with Retry-After)."""


class EngineSleepingError(ActorServeError):
    """The engine is asleep (sleep mode): its weights or KV cache are released until ``wake_up``. A request
    that arrives meanwhile is refused with this, unless the engine queues them (sleep_queue_requests)."""
