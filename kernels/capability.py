"""What this CPU and this torch can do, decided once per process: the gates of every CPU fast path.

Runs wherever kernels run (worker, in-process engine, tests). The launcher resolves ``CpuPaths`` while it
resolves the config (``runtime.resolve``); each worker installs the paths it was handed
(``use``) before it loads a model, and logs them; a process that was handed none (a kernel called
directly) detects them on first ask, from the same override.

Each path has its own predicate, so that one missing instruction switches off only what needs it:

- ``kernel_isa``: which build of the C kernels (decode attention, the fused row kernels, the skinny GEMM,
  the int8 row passes) runs: ``"avx512_bf16"`` where the CPU has AVX-512 BF16, else ``"avx2"`` where it
  has AVX2 with FMA (an AVX-512 CPU without BF16 too), else None. Each source is one text built per ISA
  (kernels/simd.h). The decode fast path runs on these, so it follows them.
- ``q8_isa``: which build of the q8 products (GGUF weights by int8-quantized activations, the opt-in
  ``gguf_q8`` method): ``"avx512_vnni"`` where the CPU has AVX-512 VNNI, else ``"avx2"`` where it has AVX2
  with FMA, else None. Its own predicate: VNNI is not implied by BF16 nor the reverse.
- ``prepacked_bf16``: oneDNN's blocked bf16 weights. torch refuses to reorder a bf16 weight unless the CPU
  has AVX-512 BW/VL/DQ or AVX-NE-CONVERT, and says so only by raising at load; this asks first.
- ``int_mm``: ``torch._int_mm``, the int8 product, checked by running it once; without it the int8 layers
  multiply in int32 with torch's generic product (slow, exact, the same result).
- ``int_mm_exact``: that product is exact for every int8 value. oneDNN shifts the activations to unsigned
  bytes, and without a 4-way integer dot (AVX-512 VNNI, AVX-VNNI, AMX) it adds pairs of byte products in
  16 bits with saturation (``vpmaddubsw``): 255 x 127 twice does not fit, and the sums come out wrong. So
  it is checked on values that saturate, and under the override it holds only with VNNI in the masked
  features. Without it the int8 layers take their own C product, which cannot saturate, or where the C
  kernels are off split each weight into two parts narrow enough for oneDNN (``kernels.gemm.int8``): the
  same integers either way.
- ``bf16_gemm``: oneDNN multiplies bf16 matrices on this CPU (torch's own test, as for prepacking, but
  with the C kernels on or off). Without it torch's bf16 product is a scalar loop, and bf16 products of
  more rows than the skinny kernel takes are widened to fp32 instead (``kernels.gemm.widened``).

The instruction sets come from CPUID through torch (``torch.cpu._is_*_supported``), which also checks that
the OS saves the wide registers; /proc/cpuinfo can disagree with CPUID under emulators. The ISA override
(``ACTORSERVE_CPU_ISA``: ``avx512``, ``avx2`` or ``generic``) makes every predicate see the lesser CPU, so
the paths of an AVX2-only machine run, and are tested, on an AVX-512 one. It never raises a CPU's level.

torch's own libraries pick their instructions themselves, each once, at its first use in a process: oneDNN
(the bf16 and int8 products) by ``ONEDNN_MAX_CPU_ISA``, MKL (the fp32 GEMM) by ``MKL_ENABLE_INSTRUCTIONS``,
ATen's vectorised operators by ``ATEN_CPU_CAPABILITY``. Under the override, a lesser CPU is only
emulated whole where those hold the libraries at its level too (``library_env``): the engine's worker
processes start with them; a process that computed before it read the override (an in-process engine)
keeps its libraries' level, and the worker says so in its log (``libraries_above``).
"""
from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Optional

from actorserve.runtime.config import ISAS, CpuPaths, DeviceConfig, env_cpu_isa, env_cpu_kernels

log = logging.getLogger("actorserve")


@dataclass(frozen=True)
class CpuFeatures:
    """The instruction-set facts the gates read, after the override has masked them."""

    isa: str  # "avx512" (F, BW, VL, DQ), "avx2" (with FMA) or "generic"
    avx512_bf16: bool
    avx_ne_convert: bool
    avx512_vnni: bool = False


def _supported(name: str) -> bool:
    import torch

    probe = getattr(torch.cpu, name, None)
    try:
        return bool(probe()) if probe is not None else False
    except RuntimeError:
        return False


def _avx_ne_convert() -> bool:
    """AVX-NE-CONVERT (CPUID leaf 7, sub-leaf 1, EDX bit 5), which torch accepts for bf16 weights; read from
    /proc/cpuinfo, torch having no probe of its own."""
    try:
        with open("/proc/cpuinfo") as f:
            return any(line.startswith("flags") and "avx_ne_convert" in line.split() for line in f)
    except OSError:
        return False


def hardware_features() -> CpuFeatures:
    if _supported("_is_avx512_supported"):
        isa = "avx512"
    elif _supported("_is_avx2_supported"):
        isa = "avx2"
    else:
        isa = "generic"
    return CpuFeatures(isa, avx512_bf16=isa == "avx512" and _supported("_is_avx512_bf16_supported"),
                       avx_ne_convert=isa != "generic" and _avx_ne_convert(),
                       avx512_vnni=isa == "avx512" and _supported("_is_vnni_supported"))


def masked(features: CpuFeatures, override: Optional[str]) -> CpuFeatures:
    """The features a CPU of level ``override`` would have, where that is below this one's."""
    if override is None or ISAS.index(override) >= ISAS.index(features.isa):
        return features
    return CpuFeatures(override, avx512_bf16=False,
                       avx_ne_convert=features.avx_ne_convert and override != "generic")


def _onednn_says_bf16() -> Optional[bool]:
    """torch's own test of oneDNN's bf16 support on this CPU, at the level oneDNN runs at in this process
    (mkldnn_bf16_device_check); None where this torch has no oneDNN or no such test."""
    import torch

    check = getattr(torch.ops.mkldnn, "_is_mkldnn_bf16_supported", None)
    if not torch.backends.mkldnn.is_available() or check is None:
        return None
    try:
        return bool(check())
    except RuntimeError:
        return False


def _bf16_gemm(features: CpuFeatures) -> bool:
    """oneDNN multiplies bf16 matrices: torch says so, and the masked features agree."""
    import torch

    return (torch.backends.mkldnn.is_available() and _onednn_says_bf16() is not False
            and (features.isa == "avx512" or features.avx_ne_convert))


def _onednn_bf16(features: CpuFeatures) -> bool:
    """torch's own test for bf16 weights in oneDNN (mkldnn_bf16_device_check), on the masked features."""
    import torch

    return (hasattr(torch.ops.mkldnn, "_reorder_linear_weight") and hasattr(torch.ops.mkldnn, "_linear_pointwise")
            and _bf16_gemm(features))


def _int_mm_runs() -> bool:
    import torch

    if not hasattr(torch, "_int_mm"):
        return False
    try:
        a = torch.ones(32, 64, dtype=torch.int8)
        return bool((torch._int_mm(a, a.t().contiguous()) == 64).all())
    except RuntimeError:
        return False


def _int_mm_exact() -> bool:
    """``torch._int_mm`` on values whose byte-pair sums saturate 16 bits where there is no VNNI."""
    import torch

    try:
        a = torch.full((32, 64), 127, dtype=torch.int8)
        return bool((torch._int_mm(a, a.t().contiguous()) == 64 * 127 * 127).all())
    except RuntimeError:
        return False


def kernel_isa(features: CpuFeatures) -> Optional[str]:
    """The best build of the C kernels these features run."""
    if features.avx512_bf16:
        return "avx512_bf16"
    return "avx2" if features.isa in ("avx2", "avx512") else None


def q8_isa(features: CpuFeatures) -> Optional[str]:
    """The best build of the q8 products these features run."""
    if features.isa == "avx512" and features.avx512_vnni:
        return "avx512_vnni"
    return "avx2" if features.isa in ("avx2", "avx512") else None


def detect(isa_override: Optional[str] = None, kernels_enabled: bool = True) -> CpuPaths:
    if isa_override is not None and isa_override not in ISAS:
        raise ValueError(f"the CPU ISA override must be one of {ISAS}, got {isa_override!r}")
    real = hardware_features()
    seen = masked(real, isa_override)
    int_mm = _int_mm_runs()
    return CpuPaths(isa=seen.isa, hardware_isa=real.isa, kernels_enabled=kernels_enabled,
                    kernel_isa=kernel_isa(seen) if kernels_enabled else None,
                    q8_isa=q8_isa(seen) if kernels_enabled else None,
                    prepacked_bf16=kernels_enabled and _onednn_bf16(seen),
                    int_mm=int_mm, int_mm_exact=int_mm and _int_mm_exact() and (seen == real or seen.avx512_vnni),
                    bf16_gemm=_bf16_gemm(seen))


# The variables that hold each of torch's libraries at a level, read once by each at its first use
_LIBRARY_ENV = {
    "avx2": {"ONEDNN_MAX_CPU_ISA": "AVX2", "MKL_ENABLE_INSTRUCTIONS": "AVX2", "ATEN_CPU_CAPABILITY": "avx2"},
    "generic": {"ONEDNN_MAX_CPU_ISA": "SSE41", "MKL_ENABLE_INSTRUCTIONS": "SSE4_2", "ATEN_CPU_CAPABILITY": "default"},
}


def library_env(override: Optional[str], hardware_isa: str) -> dict[str, str]:
    """The environment that starts a process with torch's libraries at the override's level; empty where
    the override is not below this CPU's level (ATen takes its variable on trust: a level above the CPU's
    would be an illegal instruction)."""
    if override is None or ISAS.index(override) >= ISAS.index(hardware_isa):
        return {}
    return dict(_LIBRARY_ENV[override])


def libraries_above(isa: str) -> list[str]:
    """Which of torch's libraries run above ``isa`` in this process (ATen, oneDNN), as torch reports them."""
    import torch

    above = []
    aten = torch.backends.cpu.get_cpu_capability().lower()
    if ISAS.index(isa) < ISAS.index("avx512") and aten.startswith("avx512") or isa == "generic" and aten != "default":
        above.append(f"ATen ({aten})")
    if isa != "avx512" and _onednn_says_bf16():
        above.append("oneDNN (bf16 GEMM)")
    return above


class _Installed:
    """The paths of this process: installed once by a worker from its config, or detected on first ask."""

    paths: Optional[CpuPaths] = None


def use(paths: CpuPaths) -> None:
    """Install the paths the launcher resolved, before any kernel is built or any weight prepacked."""
    _Installed.paths = paths


def current() -> CpuPaths:
    if _Installed.paths is None:
        _Installed.paths = detect(env_cpu_isa(), env_cpu_kernels())
    return _Installed.paths


def paths_for(device: DeviceConfig) -> CpuPaths:
    """The paths a device config carries, or the gates' answer for it where it carries none."""
    return device.cpu_paths if device.cpu_paths is not None else detect(device.cpu_isa, device.cpu_kernels)


def hold_libraries(isa: Optional[str]) -> dict[str, str]:
    """For a benchmark process under ``ACTORSERVE_CPU_ISA``: torch's libraries held at that level too, in
    this process (before anything computes) and the ones it starts, so that the lesser CPU is emulated
    whole, peers included. Returns the variables in force; raises where a library already runs above. An
    unset or empty variable (``isa`` None or "") holds nothing, as the engine's config reads it."""
    import os

    if not isa:
        return {}
    if isa not in ISAS:
        raise ValueError(f"ACTORSERVE_CPU_ISA must be one of {ISAS}, got {isa!r}")
    env = library_env(isa, hardware_features().isa)
    held = {name: os.environ.setdefault(name, value) for name, value in env.items()}  # the caller's own win
    above = libraries_above(isa)
    if above:
        raise RuntimeError(f"ACTORSERVE_CPU_ISA={isa}: torch's {' and '.join(above)} already run above it")
    return held
