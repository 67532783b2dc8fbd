"""Build a kernel's C source into a shared library on first use, once per source, flags and compiler.

The libraries are small single-file C (no torch headers), so a build takes about a second with the system
compiler; they are loaded with ctypes. The cache lives under ``$ACTORSERVE_KERNEL_CACHE`` (default
``~/.cache/actorserve/kernels``), named by a hash of everything that went into the build, and is written
atomically so that several worker processes may build the same library at once. Where there is no
compiler or the build fails, ``load`` returns None and the caller keeps its torch path.
"""
from __future__ import annotations

import ctypes
import hashlib
import logging
import os
import re
import shutil
import subprocess
import tempfile
from pathlib import Path
from typing import Any, Optional

from actorserve.kernels import capability
from actorserve.runtime.config import c_compiler_names, kernel_cache_dir

log = logging.getLogger("actorserve")


def cache_dir() -> Path:
    return Path(kernel_cache_dir())


def compiler() -> Optional[str]:
    for name in c_compiler_names():
        if shutil.which(name):
            return shutil.which(name)
    return None


def _compiler_version(cc: str) -> str:
    try:
        return subprocess.run([cc, "--version"], capture_output=True, text=True, timeout=30).stdout
    except (OSError, subprocess.SubprocessError):
        return ""


def _local_headers(source: Path, text: bytes) -> list[bytes]:
    """The contents of the ``#include "..."`` headers beside the source, so that editing one rebuilds."""
    names = re.findall(rb'^\s*#\s*include\s+"([^"]+)"', text, flags=re.M)
    return [(source.parent / name.decode()).read_bytes() for name in names]


def load(source: Path, flags: list[str]) -> Optional[ctypes.CDLL]:
    """The built library of ``source`` (compiled with ``flags``), or None where it cannot be built."""
    cc = compiler()
    if cc is None:
        log.info("no C compiler found; %s is not built, the torch path is used", source.name)
        return None
    try:
        text = source.read_bytes()
        headers = _local_headers(source, text)
    except OSError as e:
        log.warning("reading %s or its headers failed (%s); the torch path is used", source.name, e)
        return None
    key = hashlib.sha256(b"\0".join([text, *headers, " ".join(flags).encode(),
                                     _compiler_version(cc).encode()])).hexdigest()
    target = cache_dir() / f"{source.stem}-{key[:16]}.so"
    if not target.exists():
        try:
            target.parent.mkdir(parents=True, exist_ok=True)
            with tempfile.TemporaryDirectory(dir=target.parent) as tmp:
                out = Path(tmp) / target.name
                proc = subprocess.run([cc, *flags, "-shared", "-fPIC", str(source), "-o", str(out)],
                                      capture_output=True, text=True, timeout=300)
                if proc.returncode != 0:
                    log.warning("building %s failed; the torch path is used:\n%s", source.name, proc.stderr[-2000:])
                    return None
                os.replace(out, target)
        except (OSError, subprocess.SubprocessError) as e:
            log.warning("building %s failed (%s); the torch path is used", source.name, e)
            return None
    try:
        return ctypes.CDLL(str(target))
    except OSError as e:
        log.warning("loading %s failed (%s); the torch path is used", target, e)
        return None


# -ffp-contract=off: GCC would otherwise fuse a written multiply and add into one FMA (its default outside
# ISO C mode), which rounds once where torch's sequence rounds twice, and the kernels match torch to the bit.
# The ISA flags pick the branch of kernels/simd.h a source is built against (capability.kernel_isa names it).
ISA_FLAGS = {
    "avx512_bf16": ["-mavx512f", "-mavx512bw", "-mavx512vl", "-mavx512bf16", "-mf16c"],
    "avx2": ["-mavx2", "-mfma", "-mf16c"],
    # the q8 products' build (capability.q8_isa): AVX-512 with VNNI, its own source's branch
    "avx512_vnni": ["-mavx2", "-mfma", "-mf16c", "-mavx512f", "-mavx512bw", "-mavx512vl", "-mavx512vnni"],
}
COMMON_FLAGS = ["-O3", "-ffp-contract=off", "-fopenmp"]


def flags_for(isa: str) -> list[str]:
    return COMMON_FLAGS + ISA_FLAGS[isa]


# The element types a source written against kernels/simd.h's ``elem`` is built for, by torch dtype name:
# the define that picks it, and the suffix of the exported names (simd.h's ELEM).
ELEMENTS = {"bfloat16": ([], "_bf16"), "float32": (["-DACTORSERVE_ELEM_F32"], "_f32"),
            # fp32 rows over a bf16 KV cache (the attention kernel's ``kv_elem``, kernels/simd.h)
            "float32/bfloat16": (["-DACTORSERVE_ELEM_F32", "-DACTORSERVE_KV_BF16"], "_f32")}


class CpuKernelLibrary:
    """One C source, built for this process's ISA (``capability.current().kernel_isa``, or the field of
    ``CpuPaths`` that ``gate`` names) and loaded at most once per process, with its functions' ctypes
    signatures declared; None where the gate says no (a CPU, or an ISA override, below AVX2, or
    ``ACTORSERVE_CPU_KERNELS=0``), or the build fails.

    A source written for an element type (``element``, a key of ``ELEMENTS``) is built for that one, and
    its functions, exported as ``name_bf16`` or ``name_f32``, are also reachable by the plain ``name``
    that ``signatures`` gives: a caller holds the library of its dtype and never spells the suffix."""

    def __init__(self, source: Path, signatures: dict[str, tuple[Any, list[Any]]],
                 element: Optional[str] = None, gate: str = "kernel_isa") -> None:
        self.source, self.signatures, self.gate = source, signatures, gate
        self.defines, self.suffix = ELEMENTS[element] if element is not None else ([], "")
        self._lib: Optional[ctypes.CDLL] = None
        self._paths: Optional[capability.CpuPaths] = None  # the gates this answer was decided under

    def get(self) -> Optional[ctypes.CDLL]:
        paths = capability.current()
        if paths is not self._paths:
            self._paths = paths
            isa = getattr(paths, self.gate)
            self._lib = self._load(isa) if isa else None
        return self._lib

    def _load(self, isa: str) -> Optional[ctypes.CDLL]:
        lib = load(self.source, flags_for(isa) + self.defines)
        if lib is not None:
            for name, (restype, argtypes) in self.signatures.items():
                fn = getattr(lib, name + self.suffix)
                fn.restype, fn.argtypes = restype, argtypes
                setattr(lib, name, fn)
        return lib
