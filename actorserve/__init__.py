"""actorserve: an actor-model LLM inference and serving runtime.

The public face: ``LLM`` (offline), ``AsyncEngine`` (embedded async), ``ZmqClient`` (the wire protocol's
reference client), ``SamplingParams``, the output types and the errors.
"""
from actorserve.llm import LLM
from runtime.async_engine import AsyncEngine
from runtime.client import ZmqClient
from runtime.engine.outputs import CompletionOutput, Logprob, RequestOutput
from runtime.engine.sampling_params import SamplingParams
from runtime.errors import ActorServeError, EngineDeadError, ModelLoadError

__all__ = ["LLM", "AsyncEngine", "ZmqClient", "SamplingParams", "RequestOutput", "CompletionOutput", "Logprob",
           "ActorServeError", "EngineDeadError", "ModelLoadError"]
__version__ = "0.1.0"
