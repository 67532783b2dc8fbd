"""Typed errors raised to users of every process; each says what went wrong in words a caller can act on."""


class ActorServeError(Exception):
    """Base of every error this project raises on purpose."""


class ModelLoadError(ActorServeError):
    """The model could not be loaded: missing file, unknown architecture, or a parameter left unwritten."""


class EngineDeadError(ActorServeError):
    """The engine stopped (a process died or was shut down); in-flight and new requests fail with this."""
