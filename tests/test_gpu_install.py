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

import configparser
import json
import re
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
from packaging.requirements import Requirement

ROOT = Path(__file__).resolve().parents[1]
TORCH = "torch==2.13.0"
FLASHINFER = "flashinfer-python==0.7.2.post1"
# a glibc 2.28 host takes every older manylinux tag too (pip does not widen --platform by itself)
GPU_HOST = [*(a for v in range(28, 16, -1) for a in ("--platform", f"manylinux_2_{v}_x86_64")),
            "--platform", "manylinux2014_x86_64", "--python-version", "3.12", "--implementation", "cp",
            "--abi", "cp312", "--abi", "abi3", "--abi", "none", "--only-binary=:all:"]
HOST_MARKERS = {"platform_system": "Linux", "sys_platform": "linux", "platform_machine": "x86_64",
                "python_version": "3.12", "python_full_version": "3.12.0", "implementation_name": "cpython",
                "platform_python_implementation": "CPython", "os_name": "posix", "extra": ""}
CUDA_STACK = re.compile(r"^(nvidia-|cuda-|nccl|nvshmem)")  # what the index here does not serve


def _pins() -> dict[str, str]:
    pins = {}
    for line in (ROOT / "constraints.txt").read_text().splitlines():
        if line and not line.startswith("#"):
            name, version = line.split("==")
            pins[_canonical(name)] = version
    return pins


def _canonical(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def _dry_run(args: list[str], tmp: Path, report: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "pip", "install", "--dry-run", "--ignore-installed", "-q",
                           "--report", str(tmp / report), "--target", str(tmp / "target"), *GPU_HOST, *args],
                          capture_output=True, text=True, timeout=600)


def _project_requirements() -> list[str]:
    cfg = configparser.ConfigParser()
    cfg.read(ROOT / "setup.cfg")
    lines = cfg["options"]["install_requires"].splitlines()
    for extra in ("cuda", "test"):
        lines += cfg["options.extras_require"][extra].splitlines()
    return [x.strip() for x in lines if x.strip() and not x.strip().startswith("#")]


def _stand_in(metadata: dict, out: Path) -> Path:
    """A wheel of ``metadata``'s name and version that requires what it does, less NVIDIA's CUDA stack."""
    name, version = metadata["name"], metadata["version"]
    kept = [r for r in metadata.get("requires_dist", []) if not CUDA_STACK.match(_canonical(Requirement(r).name))]
    dist = f"{name.replace('-', '_')}-{version}.dist-info"
    wheel = out / f"{name.replace('-', '_')}-{version}-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w") as z:
        z.writestr(f"{dist}/METADATA", "\n".join(["Metadata-Version: 2.1", f"Name: {name}", f"Version: {version}",
                                                  *[f"Requires-Dist: {r}" for r in kept]]) + "\n")
        z.writestr(f"{dist}/WHEEL", "Wheel-Version: 1.0\nGenerator: actorserve-test\nRoot-Is-Purelib: true\n"
                                    "Tag: py3-none-any\n")
        z.writestr(f"{dist}/RECORD", "")
    return wheel


@pytest.mark.time_limit(900)
def test_torch_and_the_cuda_extra_resolve_for_a_linux_gpu_host_under_the_constraints(tmp_path):
    done = _dry_run(["--no-deps", TORCH, FLASHINFER], tmp_path, "heads.json")
    if done.returncode != 0 and ("No matching distribution" in done.stderr or "connection" in done.stderr.lower()):
        pytest.skip(f"the package index cannot be reached or lacks {TORCH}: {done.stderr.strip()[-300:]}")
    assert done.returncode == 0, done.stderr[-3000:]
    heads = {_canonical(i["metadata"]["name"]): i["metadata"] for i in json.loads((tmp_path / "heads.json")
                                                                                  .read_text())["install"]}
    torch_needs = [Requirement(r) for r in heads["torch"]["requires_dist"]]
    triton = [r for r in torch_needs if r.name == "triton" and r.marker.evaluate(HOST_MARKERS)]
    assert triton, "torch's Linux wheel names the triton it needs"
    pins = _pins()
    left_out = {_canonical(Requirement(r).name) for m in heads.values() for r in m.get("requires_dist", [])
                if CUDA_STACK.match(_canonical(Requirement(r).name))}
    assert not left_out & set(pins), "a pinned package is left out of the resolution"
    assert pins["triton"] in triton[0].specifier, f"constraints.txt pins triton {pins['triton']}; {TORCH} needs {triton[0]}"

    stand_ins = {n: _stand_in(m, tmp_path) for n, m in heads.items()}
    wanted = [r for r in _project_requirements() if _canonical(Requirement(r).name) not in stand_ins]
    wanted += [f"{n} @ {w.as_uri()}" for n, w in stand_ins.items()]
    done = _dry_run(["-c", str(ROOT / "constraints.txt"), *wanted], tmp_path, "all.json")
    assert done.returncode == 0, done.stderr[-4000:]
    resolved = {_canonical(i["metadata"]["name"]): i["metadata"]["version"]
                for i in json.loads((tmp_path / "all.json").read_text())["install"]}
    assert resolved["triton"] in triton[0].specifier
    assert {"torch", "flashinfer-python", "xgrammar", "transformers", "pyzmq", "msgspec"} <= set(resolved)
    off_pin = {n: (v, pins[n]) for n, v in resolved.items() if n in pins and v != pins[n]}
    assert not off_pin
