"""The GPU install resolves: pip, asked for a Linux x86-64 CUDA host with Python 3.12 (a dry run), resolves
``torch==2.13.0``, the project's requirements with the ``cuda`` and ``test`` extras, and every dependency of
those, under constraints.txt (the one set of pins, for CPU and GPU hosts alike).

PyPI's Linux ``torch==2.13.0`` is a CUDA build that requires ``triton==3.7.1``; a pin of another triton is a
ResolutionImpossible on every GPU host, though it resolves on a CPU one (the CPU wheel requires no triton).

The index this suite runs against serves no package of NVIDIA's CUDA stack (cuDNN, NCCL, cuda-python...),
so torch and flashinfer-python are stood in for by wheels of their own names and versions whose metadata is
theirs, as the index gives it for the GPU host, less those packages; everything else resolves for real.
constraints.txt pins none of the packages left out, so none of them can take part in a conflict of pins.
"""
from __future__ import annotations

import importlib.util
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
from packaging.requirements import Requirement

ROOT = Path(__file__).resolve().parents[1]
_spec = importlib.util.spec_from_file_location("fetch_gpu_wheels", ROOT / "scripts" / "fetch_gpu_wheels.py")
fetch_gpu_wheels = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(fetch_gpu_wheels)
canonical, GPU_HOST = fetch_gpu_wheels.canonical, fetch_gpu_wheels.GPU_HOST
HOST_MARKERS = fetch_gpu_wheels.GPU_HOST_MARKERS
TORCH = "torch==2.13.0"
FLASHINFER = "flashinfer-python==0.7.2.post1"
CUDA_STACK = re.compile(r"^(nvidia-|cuda-|nccl|nvshmem)")  # what the index here does not serve


def _pins() -> dict[str, str]:
    pins = {}
    for line in (ROOT / "constraints.txt").read_text().splitlines():
        if line and not line.startswith("#"):
            name, version = line.split("==")
            pins[canonical(name)] = version
    return pins


def _dry_run(args: list[str], tmp: Path, report: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "pip", "install", "--dry-run", "--ignore-installed", "-q",
                           "--report", str(tmp / report), "--target", str(tmp / "target"), *GPU_HOST, *args],
                          capture_output=True, text=True, timeout=600)


def _stand_in(metadata: dict, out: Path) -> Path:
    """A wheel of ``metadata``'s name and version that requires what it does, less NVIDIA's CUDA stack."""
    kept = [r for r in metadata.get("requires_dist", []) if not CUDA_STACK.match(canonical(Requirement(r).name))]
    return fetch_gpu_wheels.stand_in_wheel(metadata["name"], metadata["version"], out, kept)


@pytest.mark.time_limit(900)
def test_torch_and_the_cuda_extra_resolve_for_a_linux_gpu_host_under_the_constraints(tmp_path):
    done = _dry_run(["--no-deps", TORCH, FLASHINFER], tmp_path, "heads.json")
    if done.returncode != 0 and ("No matching distribution" in done.stderr or "connection" in done.stderr.lower()):
        pytest.skip(f"the package index cannot be reached or lacks {TORCH}: {done.stderr.strip()[-300:]}")
    assert done.returncode == 0, done.stderr[-3000:]
    heads = {canonical(i["metadata"]["name"]): i["metadata"] for i in json.loads((tmp_path / "heads.json")
                                                                                  .read_text())["install"]}
    torch_needs = [Requirement(r) for r in heads["torch"]["requires_dist"]]
    triton = [r for r in torch_needs if r.name == "triton" and r.marker.evaluate(HOST_MARKERS)]
    assert triton, "torch's Linux wheel names the triton it needs"
    pins = _pins()
    left_out = {canonical(Requirement(r).name) for m in heads.values() for r in m.get("requires_dist", [])
                if CUDA_STACK.match(canonical(Requirement(r).name))}
    assert not left_out & set(pins), "a pinned package is left out of the resolution"
    assert pins["triton"] in triton[0].specifier, \
        f"constraints.txt pins triton {pins['triton']}; {TORCH} needs {triton[0]}"

    stand_ins = {n: _stand_in(m, tmp_path) for n, m in heads.items()}
    wanted = [r for r in fetch_gpu_wheels.project_requirements(("cuda", "test"))
              if canonical(Requirement(r).name) not in stand_ins]
    wanted += [f"{n} @ {w.as_uri()}" for n, w in stand_ins.items()]
    done = _dry_run(["-c", str(ROOT / "constraints.txt"), *wanted], tmp_path, "all.json")
    assert done.returncode == 0, done.stderr[-4000:]
    resolved = {canonical(i["metadata"]["name"]): i["metadata"]["version"]
                for i in json.loads((tmp_path / "all.json").read_text())["install"]}
    assert resolved["triton"] in triton[0].specifier
    assert {"torch", "flashinfer-python", "xgrammar", "transformers", "pyzmq", "msgspec"} <= set(resolved)
    off_pin = {n: (v, pins[n]) for n, v in resolved.items() if n in pins and v != pins[n]}
    assert not off_pin
