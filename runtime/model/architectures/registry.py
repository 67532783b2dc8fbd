"""The model registry: which architectures load, by the names checkpoints give them (an HF config's
``architectures`` and ``model_type``, a GGUF file's ``general.architecture``), each mapped to its family.

A family is one module of ``runtime.model.architectures.models``: its names and the switches of
``ArchConfig`` it sets, which the shared decoder (``runtime.model.architectures.decoder``) reads. What a
checkpoint names and no family claims is a ``ModelLoadError`` that lists what is supported. Importing this
module imports no torch.
"""
from __future__ import annotations

import importlib
from typing import Any

from actorserve.runtime.errors import ModelLoadError
from actorserve.runtime.model.architectures import models
from actorserve.runtime.model.architectures.family import Family

__all__ = ["FAMILIES", "Family", "NAMES", "family_of_gguf", "family_of_hf", "markdown", "supported"]


FAMILIES: tuple[Family, ...] = tuple(
    importlib.import_module(f"{models.__name__}.{name}").FAMILY for name in models.MODULES)
NAMES = tuple(f.name for f in FAMILIES)


def supported() -> str:
    return "; ".join(f"{', '.join(f.hf_architectures)} ({f.models})" for f in FAMILIES)


def markdown() -> str:
    """docs/python-api.md's list of supported architectures (``python -m
    actorserve.runtime.model.architectures.registry`` prints it; a test checks the docs against it)."""
    return "\n".join(f"- `{arch}`: {f.models}" + (f" (GGUF `{'`, `'.join(f.gguf_architectures)}`)"
                                                   if f.gguf_architectures else "")
                     for f in FAMILIES for arch in f.hf_architectures)


def family_of_hf(config: dict[str, Any]) -> Family:
    """The family of an HF config.json: by its ``architectures``, else its ``model_type``."""
    named = [a for a in config.get("architectures") or [] if isinstance(a, str)]
    for family in FAMILIES:
        if any(a in family.hf_architectures for a in named):
            return family
    model_type = config.get("model_type")
    if not named:
        for family in FAMILIES:
            if model_type in family.hf_model_types:
                return family
    what = ", ".join(named) or repr(model_type)
    raise ModelLoadError(f"unsupported architecture {what}; supported: {supported()}")


def family_of_gguf(arch: str) -> Family:
    for family in FAMILIES:
        if arch in family.gguf_architectures:
            return family
    gguf = sorted(a for f in FAMILIES for a in f.gguf_architectures)
    raise ModelLoadError(f"unsupported GGUF architecture {arch!r}; supported: {', '.join(gguf)}")


if __name__ == "__main__":
    print(markdown())
