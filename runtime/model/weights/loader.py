"""Turn a model path (or None: the embedded SmolLM2) into a loaded CausalLM and its tokenizer.

Every parameter is written exactly once; a parameter the checkpoint lacks, a tensor with no place, or a
shape mismatch is a ModelLoadError naming it, never silently uninitialised memory.
"""
from __future__ import annotations

import json
import os
from dataclasses import dataclass
from typing import Any, Iterable, Optional, Union

import torch

from actorserve.kernels.gemm.gguf import Segment
from actorserve.runtime.errors import ModelLoadError
from actorserve.runtime.model_files import resolve_model_path
from actorserve.runtime.heap import trim_heap
from actorserve.runtime.model.weights import gguf_weights, hf_weights
from actorserve.runtime.model.weights import quantization as quantization_methods
from actorserve.runtime.model.architectures.arch_config import ArchConfig
from actorserve.runtime.model.architectures.decoder import CausalLM, Stage
from actorserve.runtime.model.weights.gguf_weights import StoredBlocks
from actorserve.runtime.model.architectures.layers import Embedding, Linear
from actorserve.runtime.text.tokenizer import load_tokenizer

_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


@dataclass
class LoadedModel:
    model: CausalLM
    cfg: ArchConfig
    tokenizer: Optional[Any]
    path: str


def checkpoint_dtype(path: str) -> str:
    """What ``dtype="auto"`` means for this checkpoint: an HF directory's ``dtype`` (or ``torch_dtype``)
    from config.json; float32 for a GGUF file (its blocks are computed against fp32, the reference) or a
    config that names none."""
    if not os.path.isdir(path):
        return "float32"
    with open(os.path.join(path, "config.json")) as f:
        config = json.load(f)
    named = config.get("dtype") or config.get("torch_dtype") or "float32"
    return {"bfloat16": "bfloat16", "float16": "float16"}.get(str(named).removeprefix("torch."), "float32")


def _refuse_remote_code(path: str) -> None:
    """A config.json that maps its classes to the checkpoint's own code (``auto_map``) needs that code run:
    vLLM runs it with --trust-remote-code; actorserve runs no model code it does not ship."""
    config_path = os.path.join(path, "config.json")
    if not os.path.isfile(config_path):
        return
    with open(config_path) as f:
        auto_map = json.load(f).get("auto_map")
    if auto_map:
        raise ModelLoadError(f"{path} needs its own model code (auto_map in config.json: {sorted(auto_map)}); "
                             "actorserve runs only the architectures it implements, with or without "
                             "--trust-remote-code")


def read_arch_config(path: str):
    """(reader or None, ArchConfig) for a GGUF file or an HF directory."""
    if os.path.isdir(path):
        _refuse_remote_code(path)
        return None, hf_weights.read_config(path)
    if path.endswith(".gguf"):
        return gguf_weights.open_gguf(path)
    raise ModelLoadError(f"{path} is neither a .gguf file nor a model directory")


def _materialize(net: torch.nn.Module, device: str, dtype: torch.dtype) -> torch.nn.Module:
    """``to_empty(device).to(dtype)`` with one allocation of each tensor, by ``torch.empty`` of its shape:
    ``to_empty``'s ``empty_like`` of a meta tensor imports sympy (torch's symbolic shapes), a resident
    cost of hundreds of modules that serving never uses."""
    return net._apply(lambda t: torch.empty(t.shape, device=device,
                                            dtype=dtype if t.is_floating_point() else t.dtype))


def load_model(model: Optional[str], dtype: str = "float32", max_positions: Optional[int] = None,
               device: str = "cpu", tokenizer: Optional[str] = None, skip_tokenizer: bool = False,
               pp_rank: int = 0, pp_size: int = 1, quantization: Optional[str] = None) -> LoadedModel:
    """The model, or one pipeline stage of it (only that stage's tensors are read), its weights loaded and
    prepared by the quantization method of this load (``runtime.model.weights.quantization``)."""
    path = resolve_model_path(model)
    reader, cfg = read_arch_config(path)
    dtype = checkpoint_dtype(path) if dtype == "auto" else dtype
    try:
        method = quantization_methods.select(quantization, dtype, device, reader is not None)
    except ValueError as e:
        raise ModelLoadError(str(e)) from None
    positions = max_positions or cfg.max_position_embeddings
    stage = Stage.of(cfg.num_layers, pp_rank, pp_size)
    with torch.device("meta"):
        net = CausalLM(cfg, positions, stage)
    layout = net.checkpoint_layout()
    wanted = lambda name: name == gguf_weights.ROPE_FREQS or stage.owns(name, cfg.tie_word_embeddings)  # noqa: E731
    held = _held_weights(net, layout, reader, wanted, method) if reader is not None else set()
    for param in held:  # never allocated dense: the blocks are the weight
        net.get_submodule(param.rsplit(".", 1)[0]).weight = None
    net = _materialize(net, device, _DTYPES[method.load_dtype(dtype)])
    if reader is not None:
        keep = lambda name, type_name, shape: name in layout and layout[name][0] in held  # noqa: E731
        tensors = gguf_weights.iter_tensors(reader, cfg, wanted, keep)
    else:
        tensors = hf_weights.iter_tensors(path, wanted)
    freq_factors = load_weights(net, tensors, layout)
    if reader is None and cfg.norm_offset:  # (GGUF files store Gemma's norms as 1 + w already)
        net.offset_norms()
    if net.lm_head is None and stage.last and net.model.embed_tokens.blocks is not None:
        net.hold_tied_head(net.model.embed_tokens.blocks)  # the lookups' blocks, one copy for both
    method.prepare(net, _DTYPES[dtype])
    net.init_buffers(freq_factors)
    net.eval().requires_grad_(False)
    net.prepack()
    trim_heap()  # the blocks as read and what preparing replaced: freed, but kept by the allocator
    tok = None if skip_tokenizer else load_tokenizer(tokenizer or path)
    return LoadedModel(net, cfg, tok, path)


def load_weights(net: CausalLM, tensors: Iterable[tuple[str, Union[torch.Tensor, StoredBlocks]]],
                 layout: Optional[dict[str, tuple[str, int, int]]] = None) -> Optional[torch.Tensor]:
    """Copy named checkpoint tensors into the model (fused parameters by row range); returns GGUF rope
    frequency factors if the file had them. Each checkpoint tensor the model needs must come exactly once.
    The ``StoredBlocks`` of a linear or of the embedding table become row segments of its ``GgufWeight``
    (``hold_blocks``); its weight was left unallocated (``layout``, taken before, still names it)."""
    params = dict(net.named_parameters())
    layout = layout or net.checkpoint_layout()
    written: set[str] = set()
    stored: dict[str, list[Segment]] = {}
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
        if isinstance(tensor, StoredBlocks):
            expected = (end - start, _columns(net.get_submodule(param.rsplit(".", 1)[0])))
            if tuple(tensor.shape) != expected:
                raise ModelLoadError(f"{name}: checkpoint shape {tuple(tensor.shape)} != model {expected}")
            stored.setdefault(param, []).append(Segment(tensor.type_name, tensor.blocks, start, end - start))
        else:
            target = params[param][start:end]
            if tuple(target.shape) != tuple(tensor.shape):
                raise ModelLoadError(f"{name}: checkpoint shape {tuple(tensor.shape)} != model {tuple(target.shape)}")
            with torch.no_grad():
                target.copy_(tensor)
        written.add(name)
    missing = sorted(set(layout) - written)
    if missing:
        raise ModelLoadError(f"the checkpoint did not provide {len(missing)} parameters: {', '.join(missing[:8])}")
    for param, segments in stored.items():
        net.get_submodule(param.rsplit(".", 1)[0]).hold_blocks(sorted(segments, key=lambda s: s.start))
    return freq_factors


def _columns(module: torch.nn.Module) -> int:
    return module.embedding_dim if isinstance(module, Embedding) else module.in_features


def _held_weights(net: CausalLM, layout: dict[str, tuple[str, int, int]], reader, wanted,
                  method: quantization_methods.QuantMethod) -> set[str]:
    """The weights (parameter names) of Linears and of the embedding table that every one of their
    checkpoint tensors can fill as stored blocks (``method.keeps``); a fused weight with one part of
    another type is decoded whole."""
    linear_weights = {f"{n}.weight" for n, m in net.named_modules() if isinstance(m, (Linear, Embedding))}
    parts: dict[str, list[bool]] = {}
    for t in reader.tensors:
        name = gguf_weights.hf_name_or_none(t.name, net.cfg)
        if name is None or not wanted(name) or name not in layout or layout[name][0] not in linear_weights:
            continue
        parts.setdefault(layout[name][0], []).append(method.keeps(t.type_name, t.dims))
    expected = {}
    for param, _, _ in layout.values():
        expected[param] = expected.get(param, 0) + 1
    return {p for p, ok in parts.items() if all(ok) and len(ok) == expected[p]}




