"""actorserve: an actor-model LLM inference and serving runtime.

The public face: ``LLM`` (offline), ``AsyncEngine`` (embedded async), ``ZmqClient`` (the wire protocol's
reference client), ``SamplingParams`` (and its ``StructuredOutputsParams``), ``BeamSearchParams`` (for
``LLM.beam_search``), the output types and the errors.

``actorserve`` is the only import root. The design card keeps the implementation in folders at the top of
the repository (``runtime/``, ``kernels/``, ``frontend/``); installs map them to ``actorserve.runtime``,
``actorserve.kernels`` and ``actorserve.frontend`` (setup.cfg's ``package_dir``). Those folders hold no
``__init__.py``, so with the repository root on ``sys.path`` (``python -m`` from the root, pytest) they are
only namespace portions, and a real distribution of the same top-level name (Hugging Face's ``kernels``,
which transformers imports) still wins. In a source checkout this package's path also names the root, so
the mapped folders resolve without an install as they do with one.
"""
import os as _os

_root = _os.path.dirname(_os.path.dirname(_os.path.abspath(__file__)))
# the checkout's root, or None where this package is installed: children put it on their path
SOURCE_ROOT = _root if _os.path.isfile(_os.path.join(_root, "setup.cfg")) else None
if SOURCE_ROOT is not None:
    __path__.append(SOURCE_ROOT)  # actorserve.runtime is <root>/runtime

# The public names load on first use (PEP 562), so that a child process started as
# ``python -m actorserve.runtime.actors.child`` imports only what its actor needs, and imports it once.
_PUBLIC = {
    "LLM": "actorserve.llm", "AsyncEngine": "actorserve.runtime.async_engine",
    "ZmqClient": "actorserve.runtime.client", "SamplingParams": "actorserve.runtime.engine.sampling_params",
    "StructuredOutputsParams": "actorserve.runtime.engine.sampling_params",
    "BeamSearchParams": "actorserve.runtime.engine.beam_search",
    "BeamSearchOutput": "actorserve.runtime.engine.beam_search",
    "BeamSearchSequence": "actorserve.runtime.engine.beam_search",
    "RequestOutput": "actorserve.runtime.engine.outputs", "CompletionOutput": "actorserve.runtime.engine.outputs",
    "Logprob": "actorserve.runtime.engine.outputs", "ActorServeError": "actorserve.runtime.errors",
    "EngineDeadError": "actorserve.runtime.errors", "EngineStartError": "actorserve.runtime.errors",
    "ModelLoadError": "actorserve.runtime.errors", "EngineSleepingError": "actorserve.runtime.errors",
    "EngineOverloadedError": "actorserve.runtime.errors",
}
__all__ = list(_PUBLIC)
__version__ = "0.1.0"


def __getattr__(name: str):
    if name not in _PUBLIC:
        raise AttributeError(f"module 'actorserve' has no attribute {name!r}")
    import importlib

    value = getattr(importlib.import_module(_PUBLIC[name]), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted([*globals(), *_PUBLIC])
