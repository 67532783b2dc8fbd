"""Read a Hugging Face model directory: config.json and its safetensors files."""
from __future__ import annotations

import json
import os
from typing import Callable, Iterator

import torch

from actorserve.runtime.errors import ModelLoadError
from actorserve.runtime.model.architectures.arch_config import ArchConfig

_IGNORED_SUFFIXES = ("rotary_emb.inv_freq",)  # computed, not learned; some checkpoints carry it


def read_config(path: str) -> ArchConfig:
    config_path = os.path.join(path, "config.json")
    if not os.path.isfile(config_path):
        raise ModelLoadError(f"{path} has no config.json")
    with open(config_path) as f:
        raw = json.load(f)
    try:
        return ArchConfig.from_hf(raw)
    except (KeyError, ValueError) as exc:
        raise ModelLoadError(f"{config_path}: {exc}") from exc


def iter_tensors(path: str, wanted: Callable[[str], bool] = lambda name: True,
                 ) -> Iterator[tuple[str, torch.Tensor]]:
    """Named tensors of every safetensors file; ``wanted`` filters by name before a tensor is read."""
    from safetensors import safe_open

    files = sorted(f for f in os.listdir(path) if f.endswith(".safetensors"))
    if not files:
        raise ModelLoadError(f"{path} has no .safetensors files")
    for name in files:
        with safe_open(os.path.join(path, name), framework="pt") as f:
            for key in f.keys():
                if key.endswith(_IGNORED_SUFFIXES) or not _wanted_or_unknown(key, wanted):
                    continue
                yield key, f.get_tensor(key)


def _wanted_or_unknown(key: str, wanted: Callable[[str], bool]) -> bool:
    """Skip another stage's tensors, but let unknown names through so that the loader can refuse them."""
    known = key.startswith(("model.layers.", "model.embed_tokens.", "model.norm.", "lm_head."))
    return wanted(key) or not known
