"""The quantization methods: for each scheme, in one place, how its weights load, how they are prepared,
which kernel computes with them, and which capability that needs.

``quantization`` in the config names a method (``--quantization``), or is None: then a GGUF file's own
blocks are kept where their method's gate holds, and every other checkpoint loads dense in ``dtype``.
The loader asks the chosen method three things: which checkpoint tensors to take as stored blocks rather
than decoded (``keeps``), which dtype to load the dense weights in (``load_dtype``), and what to do to the
loaded model (``prepare``). The kernels stay in ``kernels.gemm``: a method names its weight kind there
(``Int8Weight``, ``GgufWeight``), and ``Linear.forward`` sends each product to its weight's own ``apply``.
Adding a scheme is a class here, its registry entry, and its weight kind and kernel.

Importing this module does not import torch: the config reads the method names from it.
"""
from __future__ import annotations

from typing import Optional


class QuantMethod:
    name: str = ""
    summary: str = ""

    def check(self, dtype: str, device: str, gguf_file: bool) -> Optional[str]:
        """Why this method cannot run this model here, or None where it can."""
        return None

    def keeps(self, type_name: str, shape: tuple[int, ...]) -> bool:
        """Whether a checkpoint tensor of this GGUF type and shape loads as its stored blocks."""
        return False

    def load_dtype(self, dtype: str) -> str:
        """The dtype the dense weights load in."""
        return dtype

    def prepare(self, net, dtype) -> None:
        """After every weight is loaded: quantize, or convert, what the method computes with; ``dtype`` is
        the model's torch dtype."""


class W8A8Int8(QuantMethod):
    """vLLM's dynamic int8 (compressed-tensors W8A8): weights per output channel at load, activations per
    row at each product (``kernels.gemm.int8``); quantized from the fp32 weights, then the rest of the
    model converted to ``dtype``. Needs only torch (``torch._int_mm`` where it runs, else int32 products)."""

    name = "int8"
    summary = "the layers' weights as int8, activations quantized per row (W8A8, approximate)"

    def load_dtype(self, dtype: str) -> str:
        return "float32"

    def prepare(self, net, dtype) -> None:
        net.quantize_int8()
        net.to(dtype)


class GgufBlocks(QuantMethod):
    """A GGUF file's quantized blocks, held as stored and decoded in registers by each product
    (``kernels.gemm.gguf``): the reference decoder's fp32 weights, at about the file's size. Needs an fp32
    model on the CPU and the C kernels (``capability.CpuPaths.kernel_isa``, a C compiler)."""

    name = "gguf"
    summary = "a GGUF file's quantized weights kept as stored, computed in fp32 (the default for GGUF in fp32)"

    def check(self, dtype: str, device: str, gguf_file: bool) -> Optional[str]:
        from actorserve.kernels.gemm import gguf

        if not gguf_file:
            return "it needs a .gguf model"
        if dtype != "float32" or device != "cpu":
            return f"it computes in float32 on the CPU (got {dtype} on {device})"
        if not gguf.available():
            return "its kernels need a CPU with AVX2 and a C compiler (and ACTORSERVE_CPU_KERNELS not 0)"
        return None

    def keeps(self, type_name: str, shape: tuple[int, ...]) -> bool:
        from actorserve.kernels.gemm import gguf

        return gguf.keeps(type_name, shape)


class GgufQ8(GgufBlocks):
    """The GGUF blocks multiplied by activations quantized to int8 per block of 32, as llama.cpp's q8 dot
    products do (``kernels.gemm.gguf_q8``): integer products, several times the fp32 arithmetic's pace on
    batches and prefills, approximate. Weights of every block type take them: Q4_0, Q4_1 and Q8_0 repacked
    at load into as many bytes, the others as the file stores them. Needs what ``gguf`` needs and
    ``capability.CpuPaths.q8_isa``."""

    name = "gguf_q8"
    summary = ("a GGUF file's quantized weights kept as stored, multiplied by activations quantized to int8 "
               "per block of 32 (llama.cpp's q8 dot products; approximate)")

    def check(self, dtype: str, device: str, gguf_file: bool) -> Optional[str]:
        from actorserve.kernels.gemm import gguf_q8

        why = super().check(dtype, device, gguf_file)
        if why is None and not gguf_q8.available():
            return "its kernels need a CPU with AVX2 and a C compiler (and ACTORSERVE_CPU_KERNELS not 0)"
        return why

    def prepare(self, net, dtype) -> None:
        net.hold_q8_products()


METHODS: dict[str, QuantMethod] = {m.name: m for m in (W8A8Int8(), GgufBlocks(), GgufQ8())}
NAMES = tuple(METHODS)


def check_name(name: Optional[str], field: str = "quantization") -> None:
    """A config's method name: None or a method of this registry."""
    if name is not None and name not in METHODS:
        raise ValueError(f"{field} must be one of {(None, *NAMES)}, got {name!r}")


class Dense(QuantMethod):
    """No quantization: every weight decoded (a GGUF file's too) and loaded in ``dtype``."""


def select(quantization: Optional[str], dtype: str, device: str, gguf_file: bool) -> QuantMethod:
    """The method of this load: the named one (ValueError where it cannot run this model here), or for
    None the GGUF blocks where their gate holds, else dense."""
    if quantization is None:
        blocks = METHODS["gguf"]
        return blocks if blocks.check(dtype, device, gguf_file) is None else Dense()
    check_name(quantization)
    method = METHODS[quantization]
    why = method.check(dtype, device, gguf_file)
    if why is not None:
        raise ValueError(f"quantization={quantization!r} cannot run this model here: {why}")
    return method
