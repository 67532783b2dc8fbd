"""The GGUF container: header, metadata and tensor table parsed in one pass, tensor data memory-mapped.

Runs in a worker (or wherever a GGUF model is loaded). gguf-py's GGUFReader builds a numpy view per part
of every metadata field; a tokenizer's vocabulary and merges are hundreds of thousands of parts, which makes
opening a small model slow before any weight is read. This parser reads the same
format (versions 2 and 3, little-endian) with ``struct`` and keeps string arrays as Python lists; the
quantization types, block sizes and dequantization stay gguf-py's (``gguf.quants``).
"""
from __future__ import annotations

import struct
from dataclasses import dataclass
from typing import Any

import numpy as np

from actorserve.runtime.errors import ModelLoadError

_SCALARS = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?", 10: "<Q", 11: "<q", 12: "<d"}
_NUMPY = {0: np.uint8, 1: np.int8, 2: np.uint16, 3: np.int16, 4: np.uint32, 5: np.int32, 6: np.float32,
          7: np.bool_, 10: np.uint64, 11: np.int64, 12: np.float64}
_STRING, _ARRAY = 8, 9
_PLAIN = {"F32": np.float32, "F16": np.float16, "F64": np.float64, "I8": np.int8, "I16": np.int16,
          "I32": np.int32, "I64": np.int64}


@dataclass(frozen=True)
class TensorInfo:
    name: str
    shape: tuple[int, ...]  # GGUF order: the fastest-varying dimension first
    type_name: str  # a gguf.GGMLQuantizationType name: F32, Q4_1, ...
    offset: int  # bytes from the start of the file

    @property
    def dims(self) -> tuple[int, ...]:
        """The shape row-major (slowest first), as torch holds the tensor."""
        return tuple(int(d) for d in reversed(self.shape))


class _Cursor:
    def __init__(self, buf) -> None:
        self.buf, self.pos = buf, 0

    def scalar(self, fmt: str):
        value = struct.unpack_from(fmt, self.buf, self.pos)[0]
        self.pos += struct.calcsize(fmt)
        return value

    def string(self) -> str:
        n = self.scalar("<Q")
        if self.pos + n > len(self.buf):
            raise ValueError("a string runs past the end of the file")
        text = bytes(self.buf[self.pos:self.pos + n]).decode("utf-8", errors="replace")
        self.pos += n
        return text

    def value(self, kind: int) -> Any:
        if kind == _STRING:
            return self.string()
        if kind == _ARRAY:
            item, count = self.scalar("<I"), self.scalar("<Q")
            if item == _STRING:
                return [self.string() for _ in range(count)]
            if item in _NUMPY:
                size = np.dtype(_NUMPY[item]).itemsize * count
                if self.pos + size > len(self.buf):
                    raise ValueError("an array runs past the end of the file")
                array = np.frombuffer(self.buf, dtype=_NUMPY[item], count=count, offset=self.pos).copy()
                self.pos += size
                return array
            return [self.value(item) for _ in range(count)]
        if kind not in _SCALARS:
            raise ValueError(f"unknown metadata value type {kind}")
        return self.scalar(_SCALARS[kind])


class GGUFFile:
    """``fields``: metadata by key (numbers, strings, lists of strings, numpy arrays); ``tensors``: the
    tensor table in file order; ``tensor_data`` maps one tensor as gguf.quants.dequantize takes it."""

    def __init__(self, path: str) -> None:
        import gguf

        self.path = path
        try:
            self._map = np.memmap(path, mode="r")
            self._parse(gguf)
        except ModelLoadError:
            raise
        except (OSError, ValueError, struct.error, KeyError) as exc:
            raise ModelLoadError(f"{path} is not a readable GGUF file: {exc}") from exc

    def _parse(self, gguf) -> None:
        c = _Cursor(memoryview(self._map))  # plain byte slices: a memmap's own slicing is slow
        if bytes(self._map[:4]) != b"GGUF":
            raise ValueError("no GGUF magic")
        c.pos = 4
        version = c.scalar("<I")
        if version not in (2, 3):
            raise ValueError(f"GGUF version {version} (versions 2 and 3, little-endian, are read)")
        n_tensors, n_fields = c.scalar("<Q"), c.scalar("<Q")
        self.fields: dict[str, Any] = {}
        for _ in range(n_fields):
            key = c.string()
            self.fields[key] = c.value(c.scalar("<I"))
        infos = []
        for _ in range(n_tensors):
            name = c.string()
            dims = tuple(c.scalar("<Q") for _ in range(c.scalar("<I")))
            kind, offset = c.scalar("<I"), c.scalar("<Q")
            known = kind in gguf.GGMLQuantizationType._value2member_map_
            infos.append((name, dims, gguf.GGMLQuantizationType(kind).name if known else f"type {kind}", offset))
        alignment = int(self.fields.get("general.alignment", 32))
        start = -(-c.pos // alignment) * alignment
        self.tensors = [TensorInfo(n, d, k, start + o) for n, d, k, o in infos]
        if len({t.name for t in self.tensors}) != len(self.tensors):
            raise ValueError("a tensor name appears twice")

    def tensor_data(self, t: TensorInfo) -> np.ndarray:
        """The tensor's bytes, mapped: a typed array for plain types, else the quantized rows as uint8."""
        import gguf

        kind = gguf.GGMLQuantizationType[t.type_name]
        n = int(np.prod(t.shape)) if t.shape else 1
        dims = t.dims
        if t.type_name in _PLAIN:
            dtype = _PLAIN[t.type_name]
            nbytes, out_shape = n * np.dtype(dtype).itemsize, dims
        else:
            block, size = gguf.GGML_QUANT_SIZES[kind]
            dtype, nbytes = np.uint8, n * size // block
            out_shape = gguf.quant_shape_to_byte_shape(dims, kind)
        if t.offset + nbytes > len(self._map):
            raise ModelLoadError(f"{self.path}: tensor {t.name} runs past the end of the file")
        return self._map[t.offset:t.offset + nbytes].view(dtype).reshape(out_shape)
