"""The config checked against the project's registries and this machine: once, by whoever starts an engine.

``runtime.config`` sits at the bottom of the import graph and knows no registry. Here the names it carries
are checked by the registries that own them (the quantization method, the draft model's too, the
attention backend and the reasoning parser), and the CPU paths the capability gates choose are filled in, so that every worker
installs the one answer the launcher got instead of probing again.
"""
from __future__ import annotations

import dataclasses
from typing import Any, Optional

from actorserve.kernels import capability
from actorserve.kernels.attention import selector
from actorserve.runtime.config import EngineConfig
from actorserve.runtime.model.weights import quantization
from actorserve.runtime.text.reasoning_parsers import REASONING_PARSERS

# The registries whose names a config field takes (``option(registry=...)``): each name, and what it is
REGISTRIES: dict[str, dict[str, str]] = {
    "quantization": {m.name: m.summary for m in quantization.METHODS.values()},
    "attention_backend": {name: "" for name in selector.NAMES},
    "reasoning_parser": {name: "" for name in REASONING_PARSERS},
}


def resolve(config: EngineConfig) -> EngineConfig:
    """``config`` with its registry names checked (ValueError naming the known ones) and its CPU paths
    decided; a config resolved already comes back as it is."""
    quantization.check_name(config.model.quantization)
    parser = config.scheduler.reasoning_parser
    if parser is not None and parser not in REASONING_PARSERS:
        raise ValueError(f"reasoning_parser {parser!r} is not known: give one of {', '.join(REASONING_PARSERS)}")
    spec = config.scheduler.speculative_config
    if spec is not None:
        quantization.check_name(spec.quantization, "speculative_config quantization")
    selector.check_name(config.device.attention_backend)
    if config.device.cpu_paths is not None:
        return config
    device = dataclasses.replace(config.device, cpu_paths=capability.paths_for(config.device))
    return dataclasses.replace(config, device=device)


def engine_config(model: Optional[str] = None, **engine_args: Any) -> EngineConfig:
    """vLLM-style flat keyword arguments as the checked, resolved config tree; an unknown name is a
    TypeError."""
    return resolve(EngineConfig.from_engine_args(model, **engine_args))
