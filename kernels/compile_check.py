"""Every triton kernel compiled for a GPU it is not run on: sm_80 and sm_90, bf16 and fp16, at the shapes of
real models, through the kernels' own host wrappers, on a machine with no GPU and no CUDA driver.

triton compiles for an explicit ``GPUTarget`` without a driver; the host wrappers launch through whatever
driver is active. ``StandInDriver`` is that driver: it names the target, gives CPU tensors' addresses to
triton's specialisation (alignment, divisibility), and loads and launches nothing. Each compiled kernel's
PTX then goes through ptxas (the one triton ships) for its register count and spills, which a GPU's
driver would report at load. ``python -m actorserve.kernels.compile_check`` prints the table and
exits 1 where a kernel is over ``REGISTER_BUDGET`` or spills; tests/kernels/test_compiled_for_gpus.py
runs it.

TRITON_INTERPRET must be off before any kernel module is imported (triton decides at ``@triton.jit``), so
this runs in a process of its own, never beside the interpreted tests.
"""
from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
from dataclasses import asdict, dataclass
from typing import Callable, Iterator

from actorserve.runtime.config import triton_interpreted

# The most registers a thread of any kernel may use: at 4 warps a program, 168 or fewer keep three
# programs resident on an SM (65536 registers), and none may spill (a spill is local memory traffic on
# every iteration of an inner loop).
REGISTER_BUDGET = 168
ARCHS = (80, 90)
DTYPES = ("bfloat16", "float16")


@dataclass(frozen=True)
class ModelShape:
    """What the kernels see of a model: attention heads, hidden sizes, experts, linear-attention heads."""

    name: str
    hidden: int
    intermediate: int
    heads: int
    kv_heads: int
    head_dim: int
    vocab: int
    softcap: float = 0.0
    window: int = 0
    experts: int = 0
    top_k: int = 0
    expert_intermediate: int = 0
    linear_k_heads: int = 0  # gated delta-net layers (Qwen3-Next)
    linear_v_heads: int = 0
    linear_head_dim: int = 0


# From the models' config.json files
SHAPES = (
    ModelShape("Llama-3-8B", 4096, 14336, 32, 8, 128, 128256),
    ModelShape("Qwen3-32B", 5120, 25600, 64, 8, 128, 151936),
    ModelShape("Qwen2.5-7B", 3584, 18944, 28, 4, 128, 152064),
    ModelShape("Gemma-2-9B", 3584, 14336, 16, 8, 256, 256000, softcap=50.0, window=4096),
    ModelShape("Qwen3-Next-80B-A3B", 2048, 5120, 16, 2, 256, 151936, experts=512, top_k=10,
               expert_intermediate=512, linear_k_heads=16, linear_v_heads=32, linear_head_dim=128),
    ModelShape("Mixtral-8x7B", 4096, 14336, 32, 8, 128, 32000, experts=8, top_k=2, expert_intermediate=14336),
)
BLOCK_SIZES = (16, 32, 64)  # the KV block sizes the triton attention backend is compiled at here


@dataclass
class KernelReport:
    arch: int
    dtype: str
    model: str
    kernel: str
    constants: str  # the compile-time constants it was specialised at
    registers: int
    spill_stores: int
    spill_loads: int
    stack: int

    def fault(self) -> str:
        """Why this compile is over budget ('' where it is not)."""
        if self.spill_stores or self.spill_loads:
            return f"spills ({self.spill_stores} bytes stored, {self.spill_loads} loaded a thread)"
        if self.registers > REGISTER_BUDGET:
            return f"{self.registers} registers a thread (budget {REGISTER_BUDGET})"
        return ""


class StandInDriver:
    """triton's active driver for compiling only: the target is ``arch``; a launch records nothing and runs
    nothing (the arguments are CPU tensors)."""

    def __init__(self, arch: int) -> None:
        import torch
        from triton.backends.compiler import GPUTarget

        self.target = GPUTarget("cuda", arch, 32)
        self._torch = torch
        shared = 232448 if arch >= 90 else 166912  # an H100's and an A100's shared memory a block

        class Utils:
            @staticmethod
            def load_binary(name, kernel, shared_bytes, device):
                return 0, 0, 0, 0, 1024  # module, function, registers, spills, threads: read from ptxas instead

            @staticmethod
            def unload_module(module):
                pass

            @staticmethod
            def get_device_properties(device):
                return {"max_shared_mem": shared, "multiprocessor_count": 132, "max_num_regs": 65536,
                        "warpSize": 32, "sm_clock_rate": 0, "mem_clock_rate": 0, "mem_bus_width": 0}

        self.utils = Utils()

    @staticmethod
    def launcher_cls(src, metadata) -> Callable[..., None]:
        return lambda *args, **kwargs: None

    @classmethod
    def is_active(cls) -> bool:
        return True

    def get_current_target(self):
        return self.target

    def get_active_torch_device(self):
        return self._torch.device("cpu")

    def get_current_device(self) -> int:
        return 0

    def get_current_stream(self, device=None) -> int:
        return 0

    def set_current_device(self, device) -> None:
        pass

    def get_device_capability(self, device=0) -> tuple[int, int]:
        return divmod(self.target.arch, 10)

    def get_benchmarker(self):
        raise RuntimeError("the stand-in driver runs nothing")

    def map_python_to_cpp_type(self, ty: str) -> str:
        raise RuntimeError("the stand-in driver builds no launcher")


def _calls(shape: ModelShape, dtype) -> Iterator[tuple[str, Callable[[], object]]]:
    """Each host wrapper called as the model's forward pass calls it, on empty CPU tensors (nothing is run)."""
    import torch

    from actorserve.kernels.moe import fused_moe_triton as fused_moe
    from actorserve.kernels.linear_attention import gated_delta_triton as gated_delta
    from actorserve.kernels.elementwise import rotary_kv_triton as rotary_kv
    from actorserve.kernels.elementwise import rows_triton as rows
    from actorserve.kernels.sampling import top_k_top_p_triton as sampling
    from actorserve.kernels.attention import unified_attention_triton as unified_attention

    t = 4  # tokens of a step: runtime sizes are arguments, only their divisibility by 16 specialises
    e = lambda *size, dt=dtype: torch.empty(*size, dtype=dt)  # noqa: E731
    h, kvh, d = shape.heads, shape.kv_heads, shape.head_dim
    yield "rms_norm", lambda: rows.rms_norm(e(t, shape.hidden), e(shape.hidden), 1e-6)
    yield "rms_norm", lambda: rows.rms_norm(e(t, shape.hidden), e(shape.hidden), 1e-6, e(t, shape.hidden))
    yield "rms_norm", lambda: rows.rms_norm(e(t, h, d), e(d), 1e-6)  # Qwen3's and Gemma's q/k norms
    yield "silu_mul", lambda: rows.silu_mul(e(t, 2 * shape.intermediate))
    table = (e(t, 1, d), e(t, 1, d))
    slots = torch.zeros(t, dtype=torch.int64)
    for block_size in BLOCK_SIZES:
        cache = e(kvh, 64, block_size, d)
        yield "rotary_and_write_kv", lambda: rotary_kv.rotary_and_write_kv(e(t, h, d), e(t, kvh, d), e(t, kvh, d),
                                                                           table, cache, cache, slots)
        tables = torch.zeros(t, 8, dtype=torch.int32)
        seq = torch.zeros(t, dtype=torch.int32)
        yield "unified_attention", lambda: unified_attention.unified_attention(
            e(t, h, d), cache, cache, tables, seq, seq, d ** -0.5, shape.window, shape.softcap)
    yield "top_k_top_p_sample", lambda: sampling.top_k_top_p_sample(
        e(t, shape.vocab, dt=torch.float32), torch.zeros(t, dtype=torch.int32), torch.ones(t),
        e(t, shape.vocab, dt=torch.float32))
    if shape.experts:
        experts = torch.zeros(t, shape.top_k, dtype=torch.int64)
        yield "fused_moe", lambda: fused_moe.fused_moe(
            e(t, shape.hidden), e(shape.experts, 2 * shape.expert_intermediate, shape.hidden),
            e(shape.experts, shape.hidden, shape.expert_intermediate), experts, e(t, shape.top_k))
    if shape.linear_v_heads:
        hk, hv, dl = shape.linear_k_heads, shape.linear_v_heads, shape.linear_head_dim
        states = torch.empty(8, hv, dl, dl, dtype=torch.float32)
        gates = e(t, hv, dt=torch.float32)
        yield "recurrent_step", lambda: gated_delta.recurrent_step(
            e(t, hk, dl), e(t, hk, dl), e(t, hv, dl), gates, gates, states, torch.arange(t))
        yield "recurrent_varlen", lambda: gated_delta.recurrent_varlen(
            e(t, hk, dl), e(t, hk, dl), e(t, hv, dl), gates, gates, [0, 1, t], states, [0, 1], [True, False])


def _jit_functions() -> list:
    from triton.runtime.jit import JITFunction

    from actorserve.kernels.moe import fused_moe_triton as fused_moe
    from actorserve.kernels.linear_attention import gated_delta_triton as gated_delta
    from actorserve.kernels.elementwise import rotary_kv_triton as rotary_kv
    from actorserve.kernels.elementwise import rows_triton as rows
    from actorserve.kernels.sampling import top_k_top_p_triton as sampling
    from actorserve.kernels.attention import unified_attention_triton as unified_attention

    found = []
    for module in (fused_moe, gated_delta, rotary_kv, rows, sampling, unified_attention):
        found += [v for v in vars(module).values() if isinstance(v, JITFunction)]
    return found


_RESOURCES = re.compile(r"(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads")
_REGISTERS = re.compile(r"Used (\d+) registers")


def _ptxas_usage(ptx: str, arch: int, name: str) -> tuple[int, int, int, int]:
    """(registers, spill stores, spill loads, stack bytes) of kernel ``name`` in ``ptx``, from ptxas -v."""
    from triton.backends.nvidia.compiler import get_ptxas

    gpu = f"sm_{arch}a" if arch >= 90 else f"sm_{arch}"
    with tempfile.TemporaryDirectory() as tmp:
        src = os.path.join(tmp, "k.ptx")
        with open(src, "w") as f:
            f.write(ptx)
        done = subprocess.run([get_ptxas(arch).path, "-v", f"--gpu-name={gpu}", src, "-o", os.path.join(tmp, "k.o")],
                              capture_output=True, text=True, check=True)
    log = done.stderr[done.stderr.index(f"'{name}'"):]
    stack, stores, loads = (int(x) for x in _RESOURCES.search(log).groups())
    return int(_REGISTERS.search(log).group(1)), stores, loads, stack


def compile_all(archs=ARCHS, dtypes=DTYPES, shapes=SHAPES, wrappers=None) -> list[KernelReport]:
    """Every kernel of every shape (or of the host ``wrappers`` named), compiled for each arch and dtype; one
    report a distinct compile."""
    if triton_interpreted():
        raise RuntimeError("compile_check needs TRITON_INTERPRET off before the kernels are imported")
    import torch
    from triton.runtime import driver

    reports: list[KernelReport] = []
    for arch in archs:  # (the stand-in stays active: a machine without a GPU has no driver to go back to)
        driver.set_active(StandInDriver(arch))
        for dtype_name in dtypes:
            dtype = getattr(torch, dtype_name)
            seen: set[int] = set()  # the compiles reported (a later shape's calls may reuse them)
            for shape in shapes:
                for wrapper, call in _calls(shape, dtype):
                    if wrappers is None or wrapper in wrappers:
                        call()
                for fn in _jit_functions():
                    for cache in fn.device_caches.values():
                        for kernel in cache[0].values():
                            if id(kernel) in seen:
                                continue
                            seen.add(id(kernel))
                            usage = _ptxas_usage(kernel.asm["ptx"], arch, kernel.metadata.name)
                            constants = ", ".join(f"{k}={v}" for k, v in sorted(
                                (p.name, kernel.src.constants.get((i,)))
                                for i, p in enumerate(fn.params) if p.is_constexpr))
                            reports.append(KernelReport(arch, dtype_name, shape.name, fn.__name__, constants,
                                                        *usage))
            for fn in _jit_functions():  # the next dtype's or arch's compiles are told apart from these
                fn.device_caches.clear()
    return reports


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--arch", type=int, action="append", help="an sm_ number (default: 80 and 90)")
    parser.add_argument("--dtype", action="append", choices=DTYPES)
    parser.add_argument("--json", help="write the reports here")
    args = parser.parse_args(argv)
    reports = compile_all(tuple(args.arch or ARCHS), tuple(args.dtype or DTYPES))
    faults = 0
    for r in reports:
        fault = r.fault()
        faults += bool(fault)
        print(f"sm_{r.arch} {r.dtype:8} {r.model:20} {r.kernel:20} regs {r.registers:3} "
              f"spills {r.spill_stores}/{r.spill_loads}  {r.constants}{'  <- ' + fault if fault else ''}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump([asdict(r) | {"fault": r.fault()} for r in reports], f, indent=1)
    print(f"{len(reports)} compiles, {faults} over budget (registers <= {REGISTER_BUDGET}, no spills)")
    return 1 if faults else 0


if __name__ == "__main__":
    sys.exit(main())
