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
import shutil
import subprocess
import tempfile
from pathlib import Path
from typing import Optional

log = logging.getLogger("actorserve")


def cache_dir() -> Path:
    root = os.environ.get("ACTORSERVE_KERNEL_CACHE")
    return Path(root) if root else Path.home() / ".cache" / "actorserve" / "kernels"


def compiler() -> Optional[str]:
    for name in (os.environ.get("CC"), "cc", "gcc", "clang"):
        if name and shutil.which(name):
            return shutil.which(name)
    return None


def _compiler_version(cc: str) -> str:
    try:
        return subprocess.run([cc, "--version"], capture_output=True, text=True, timeout=30).stdout
    except (OSError, subprocess.SubprocessError):
        return ""


def load(source: Path, flags: list[str]) -> Optional[ctypes.CDLL]:
    """The built library of ``source`` (compiled with ``flags``), or None where it cannot be built."""
    cc = compiler()
    if cc is None:
        log.info("no C compiler found; %s is not built, the torch path is used", source.name)
        return None
    text = source.read_bytes()
    key = hashlib.sha256(b"\0".join([text, " ".join(flags).encode(), _compiler_version(cc).encode()])).hexdigest()
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
