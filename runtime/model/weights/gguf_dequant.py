"""GGUF tensors to fp32 torch tensors, with the common block formats decoded in whole-tensor torch ops, the
others by the CPU kernels' decoder where it runs.

Runs where a GGUF model loads. gguf-py's ``dequantize`` loops over row groups in numpy, which is most of
a small model's load time; Q4_0, Q4_1 and Q8_0 (what llama.cpp's usual small-model files hold) are
decoded here with the same arithmetic in the same order (fp16 scales widened to fp32, one product, then
one sum for Q4_1), so the weights are the same bits (``tests/runtime/model/weights/test_gguf_dequant.py``). The
other block types go through the C decoder of ``kernels.gemm.gguf`` (the same bits again,
``tests/kernels/gemm/test_gguf.py``), or through gguf-py where that is not built.
"""
from __future__ import annotations

import numpy as np
import torch

_PLAIN = ("F32", "F16", "BF16")


def dequantize(data: np.ndarray, type_name: str, shape: tuple[int, ...]) -> torch.Tensor:
    """``data`` as ``GGUFFile.tensor_data`` maps it; ``shape`` the tensor's (row-major, slowest first)."""
    decode = _DECODERS.get(type_name)
    if decode is None:
        from actorserve.kernels.gemm import gguf

        rows = (int(np.prod(shape[:-1])), shape[-1])
        if not gguf.keeps(type_name, rows):
            return dequantize_ref(data, type_name, shape)
        blocks = torch.from_numpy(np.array(data, dtype=np.uint8).reshape(rows[0], -1))
        return gguf.GgufWeight([gguf.Segment(type_name, blocks, 0, rows[0])], rows[1]).dequantize().reshape(shape)
    blocks = torch.from_numpy(np.array(data, dtype=np.uint8).reshape(-1, _BLOCK_BYTES[type_name]))
    return decode(blocks).reshape(shape)


def dequantize_ref(data: np.ndarray, type_name: str, shape: tuple[int, ...]) -> torch.Tensor:
    """gguf-py's own decoding: the reference, and the path of every type not decoded here."""
    from gguf import GGMLQuantizationType
    from gguf.quants import dequantize as gguf_dequantize

    array = np.asarray(gguf_dequantize(data, GGMLQuantizationType[type_name]), dtype=np.float32).reshape(shape)
    return torch.from_numpy(array if array.flags.writeable else array.copy())


def _scale(blocks: torch.Tensor, at: int) -> torch.Tensor:
    return blocks[:, at:at + 2].contiguous().view(torch.float16).float()


def _nibbles(qs: torch.Tensor) -> torch.Tensor:
    """Each block's 32 4-bit values: the low nibbles of its 16 bytes, then the high ones."""
    return torch.cat([qs & 0x0F, qs >> 4], dim=1)


def _q4_0(blocks: torch.Tensor) -> torch.Tensor:
    return _scale(blocks, 0) * (_nibbles(blocks[:, 2:]).to(torch.int8) - 8).float()


def _q4_1(blocks: torch.Tensor) -> torch.Tensor:
    return _scale(blocks, 0) * _nibbles(blocks[:, 4:]).float() + _scale(blocks, 2)


def _q8_0(blocks: torch.Tensor) -> torch.Tensor:
    return blocks[:, 2:].contiguous().view(torch.int8).float() * _scale(blocks, 0)


_DECODERS = {"Q4_0": _q4_0, "Q4_1": _q4_1, "Q8_0": _q8_0}
_BLOCK_BYTES = {"Q4_0": 18, "Q4_1": 20, "Q8_0": 34}
