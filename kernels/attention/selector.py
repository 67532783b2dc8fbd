"""Which attention backend serves a model: each backend declares what it supports (devices, dtypes, KV cache
dtypes, head sizes, block sizes, sliding windows, whether CUDA graphs may capture it); the selector walks the
device's backends in priority order and takes the first that supports the model, or checks the one
``--attention-backend`` forces and says why it cannot serve.

Adding a backend is its class and one entry here. Backend modules are imported only when chosen: the
triton and FlashInfer ones need their optional packages. This module itself imports no torch, so that
the config (which lists the names) stays light for the frontend.
"""
from __future__ import annotations

import importlib
import importlib.util
import logging
import os
import shutil
from dataclasses import dataclass
from typing import TYPE_CHECKING, Callable, Optional

from actorserve.runtime.config import cuda_home, triton_interpreted

if TYPE_CHECKING:
    import torch

log = logging.getLogger("actorserve")


@dataclass(frozen=True)
class AttentionNeeds:
    """What a model asks of its attention backend."""

    device: str  # a device type: "cpu" or "cuda"
    dtype: torch.dtype
    num_heads: int
    num_kv_heads: int
    head_dim: int
    block_size: int
    sliding_window: Optional[int] = None
    capture: bool = False  # CUDA graphs will capture its decode steps
    kv_dtype: Optional[torch.dtype] = None  # what the KV cache holds (None: dtype)


@dataclass(frozen=True)
class BackendEntry:
    name: str
    target: str  # "module:Class", imported when chosen
    devices: tuple[str, ...]
    dtypes: tuple[str, ...]  # torch's names, without "torch."
    head_size: Callable[[int], bool]
    block_size: Callable[[int], bool]
    sliding_window: bool
    capturable: bool
    # the backend's own gate beyond the declarations above (its package, its build, the machine)
    available: Callable[[AttentionNeeds], Optional[str]]
    max_group: int = 0  # the most query heads a KV head serves (0: any)
    # the (compute, cache) dtypes it takes beyond a cache of the compute dtype (--kv-cache-dtype)
    narrower_kv: tuple[tuple[str, str], ...] = ()

    def refusal(self, needs: AttentionNeeds) -> Optional[str]:
        """None where this backend serves ``needs``; else why not, in words."""
        if needs.device not in self.devices:
            return f"it runs on {'/'.join(self.devices)}, not {needs.device}"
        dtype = str(needs.dtype).removeprefix("torch.")
        if dtype not in self.dtypes:
            return f"it takes {', '.join(self.dtypes)}, not {dtype}"
        kv = dtype if needs.kv_dtype is None else str(needs.kv_dtype).removeprefix("torch.")
        if kv != dtype and (dtype, kv) not in self.narrower_kv:
            return f"it keeps a {dtype} model's K and V in {dtype}, not {kv}"
        if not self.head_size(needs.head_dim):
            return f"it does not take a head size of {needs.head_dim}"
        if not self.block_size(needs.block_size):
            return f"it does not take a KV block size of {needs.block_size}"
        if needs.num_heads % needs.num_kv_heads:
            return f"{needs.num_heads} query heads do not group over {needs.num_kv_heads} KV heads"
        if self.max_group and needs.num_heads // needs.num_kv_heads > self.max_group:
            return f"it groups at most {self.max_group} query heads a KV head"
        if needs.sliding_window is not None and not self.sliding_window:
            return "it has no sliding window"
        if needs.capture and not self.capturable:
            return "CUDA graphs cannot capture it"
        return self.available(needs)

    def load(self) -> type:
        module, cls = self.target.split(":")
        return getattr(importlib.import_module(module), cls)


def _cpu_c(needs: AttentionNeeds) -> Optional[str]:
    from actorserve.kernels.attention import cpu_decode

    if not cpu_decode.available(needs.dtype, needs.kv_dtype):
        return "its C kernels are off on this CPU (capability gates, ACTORSERVE_CPU_KERNELS, or no compiler)"
    return None


def _triton(needs: AttentionNeeds) -> Optional[str]:
    if importlib.util.find_spec("triton") is None:
        return "triton is not installed (pip install -e '.[cuda]')"
    if needs.device == "cpu" and not triton_interpreted():
        return "on the CPU it runs only in triton's interpreter (TRITON_INTERPRET=1), for tests"
    if needs.device == "cuda" and not _cuda():
        return "torch sees no CUDA device"
    return None


def _flashinfer(needs: AttentionNeeds) -> Optional[str]:
    if importlib.util.find_spec("flashinfer") is None:
        return "flashinfer-python is not installed (pip install -e '.[cuda]')"
    if not _cuda():
        return "torch sees no CUDA device"
    return flashinfer_kernels_refusal()


def flashinfer_kernels_refusal() -> Optional[str]:
    """flashinfer-python builds its kernels with nvcc at their first use, unless flashinfer-jit-cache holds
    them prebuilt: on a host with neither the first attention call would raise. Where they are to be built,
    the first step of each shape takes minutes, said here once."""
    if importlib.util.find_spec("flashinfer_jit_cache") is not None:
        return None
    nvcc = nvcc_path()
    if nvcc is None:
        return ("its kernels are neither prebuilt (pip install flashinfer-jit-cache) nor buildable here "
                "(no nvcc on PATH or under CUDA_HOME)")
    log.warning("flashinfer: its kernels are built with %s at their first use (minutes; "
                "flashinfer-jit-cache holds them prebuilt)", nvcc)
    return None


def nvcc_path() -> Optional[str]:
    """The CUDA compiler FlashInfer's JIT would run, as torch's extension builder finds it."""
    home = cuda_home()
    if home and os.path.exists(os.path.join(home, "bin", "nvcc")):
        return os.path.join(home, "bin", "nvcc")
    return shutil.which("nvcc") or next((p for p in ("/usr/local/cuda/bin/nvcc",) if os.path.exists(p)), None)


def _cuda() -> bool:
    import torch

    return torch.cuda.is_available()


def _always(needs: AttentionNeeds) -> Optional[str]:
    return None


def _power_of_two(n: int) -> bool:
    return n > 0 and n & (n - 1) == 0


_FLOATS = ("float32", "float16", "bfloat16")
_FP32_OVER_BF16 = (("float32", "bfloat16"),)  # an fp32 model over a bf16 KV cache
BACKENDS: dict[str, BackendEntry] = {b.name: b for b in (
    BackendEntry("flashinfer", "actorserve.kernels.attention.flashinfer:FlashInferBackend", ("cuda",),
                 ("float16", "bfloat16"), lambda d: d in (64, 128, 256), lambda b: b in (16, 32, 64),
                 # (its CUDA-graph wrappers, with fixed index buffers, are not wired yet)
                 sliding_window=True, capturable=False, available=_flashinfer),
    BackendEntry("triton", "actorserve.kernels.attention.unified_attention_triton:TritonAttentionBackend",
                 ("cuda", "cpu"), _FLOATS, lambda d: 0 < d <= 256, _power_of_two, sliding_window=True, capturable=True,
                 available=_triton, narrower_kv=_FP32_OVER_BF16),
    BackendEntry("cpu_c", "actorserve.kernels.attention.cpu_decode:CpuDecodeBackend", ("cpu",),
                 ("bfloat16", "float32"), lambda d: d % 32 == 0 and d <= 256, lambda b: b > 0,
                 sliding_window=True, capturable=False, available=_cpu_c, max_group=16,  # (its C source's)
                 narrower_kv=_FP32_OVER_BF16),
    BackendEntry("torch", "actorserve.kernels.attention.torch_ref:TorchRefBackend", ("cpu", "cuda"), _FLOATS,
                 lambda d: d > 0, lambda b: b > 0, sliding_window=True, capturable=False, available=_always,
                 narrower_kv=_FP32_OVER_BF16),
)}
NAMES = tuple(BACKENDS)
# what each device tries, best first (triton serves the CPU only when forced, in its interpreter)
PRIORITY = {"cuda": ("flashinfer", "triton", "torch"), "cpu": ("cpu_c", "torch")}


class AttentionBackendError(ValueError):
    """The forced backend cannot serve the model, or none can."""


def check_name(name: Optional[str]) -> None:
    """A config's forced backend: None or a backend of this registry."""
    if name is not None and name not in BACKENDS:
        raise ValueError(f"attention_backend must be one of {NAMES}, got {name!r}")


def select(needs: AttentionNeeds, forced: Optional[str] = None) -> type:
    """The backend class ``choose`` names."""
    return BACKENDS[choose(needs, forced)].load()


def choose(needs: AttentionNeeds, forced: Optional[str] = None) -> str:
    """The backend for ``needs``: ``forced`` if it serves them (else AttentionBackendError saying why), or
    the device's first that does. The choice, and why better ones were passed over, are logged."""
    if forced is not None:
        entry = BACKENDS.get(forced)
        if entry is None:
            raise AttentionBackendError(f"unknown attention backend {forced!r}; known: {', '.join(NAMES)}")
        why = entry.refusal(needs)
        if why is not None:
            raise AttentionBackendError(f"attention backend {forced!r} cannot serve this model: {why}")
        log.info("attention backend: %s (forced)", forced)
        return forced
    passed: list[str] = []
    for name in PRIORITY.get(needs.device, ("torch",)):
        why = BACKENDS[name].refusal(needs)
        if why is None:
            log.info("attention backend: %s%s", name, f" (not {'; not '.join(passed)})" if passed else "")
            return name
        passed.append(f"{name}: {why}")
    raise AttentionBackendError(f"no attention backend serves this model on {needs.device}: {'; '.join(passed)}")
