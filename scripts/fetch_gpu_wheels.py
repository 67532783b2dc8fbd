"""The wheels an offline GPU machine needs beside what its image holds, fetched here into ``gpu-wheels/``
(ignored by git; it travels with the working tree, which may hold 64 MiB in all), for scripts/gpu_check.sh.

The image (``scripts/gpu_image_packages.txt``: the device library's list) holds Python 3.12, torch, triton,
transformers, pytest, uvloop and more, but no pyzmq, msgspec, fastapi, uvicorn, gguf, xgrammar. What travels
is the resolution, for Linux x86-64 and CPython 3.12, of the project's requirements with the ``test`` extra
under constraints.txt, less every package the image holds; torch, triton and transformers are stood in for
at the image's versions so that nothing of theirs is resolved here. flashinfer-python cannot travel: it
requires NVIDIA's CUDA Python stack (cuda-python, nvidia-cutlass-dsl...), which the image lacks and this
index does not serve; the GPU check runs the triton attention backend.

    python scripts/fetch_gpu_wheels.py [--dest gpu-wheels]

``--dest`` ends up holding the wheels and ``requirements.txt`` (each travelled package at its version),
which the GPU check installs with ``pip install --no-index --find-links gpu-wheels -r ...``.
"""
from __future__ import annotations

import argparse
import configparser
import json
import re
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

from packaging.requirements import Requirement

ROOT = Path(__file__).resolve().parents[1]
IMAGE_LIST = ROOT / "scripts" / "gpu_image_packages.txt"
# the image's own versions of the packages too large to resolve here (its pip list)
IMAGE_VERSIONS = {"torch": "2.11.0", "triton": "3.6.0", "transformers": "5.17.0"}
LIMIT_BYTES = 48 << 20  # of the tree's 64 MiB: the rest is the source tree itself
GPU_HOST = [*(a for v in range(28, 16, -1) for a in ("--platform", f"manylinux_2_{v}_x86_64")),
            "--platform", "manylinux2014_x86_64", "--python-version", "3.12", "--implementation", "cp",
            "--abi", "cp312", "--abi", "abi3", "--abi", "none", "--only-binary=:all:"]
# the same host, as requirement markers see it
GPU_HOST_MARKERS = {"platform_system": "Linux", "sys_platform": "linux", "platform_machine": "x86_64",
                    "python_version": "3.12", "python_full_version": "3.12.3", "implementation_name": "cpython",
                    "platform_python_implementation": "CPython", "os_name": "posix", "extra": ""}


def canonical(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def image_packages() -> set[str]:
    return {canonical(line.split("#")[0].strip()) for line in IMAGE_LIST.read_text().splitlines()
            if line.split("#")[0].strip()}


def project_requirements(extras=("test",)) -> list[str]:
    cfg = configparser.ConfigParser()
    cfg.read(ROOT / "setup.cfg")
    lines = cfg["options"]["install_requires"].splitlines()
    for extra in extras:
        lines += cfg["options.extras_require"][extra].splitlines()
    return [x.strip() for x in lines if x.strip() and not x.strip().startswith("#")]


def stand_in_wheel(name: str, version: str, out: Path, requires=()) -> Path:
    """An empty wheel of ``name`` at ``version`` requiring ``requires``: a package pip is not to fetch (what
    the image holds; what this index cannot serve), for pip's resolver."""
    stem = f"{name.replace('-', '_')}-{version}"
    wheel = out / f"{stem}-py3-none-any.whl"
    metadata = ["Metadata-Version: 2.1", f"Name: {name}", f"Version: {version}",
                *(f"Requires-Dist: {r}" for r in requires)]
    with zipfile.ZipFile(wheel, "w") as z:
        z.writestr(f"{stem}.dist-info/METADATA", "\n".join(metadata) + "\n")
        z.writestr(f"{stem}.dist-info/WHEEL", "Wheel-Version: 1.0\nGenerator: actorserve\nRoot-Is-Purelib: true\n"
                                              "Tag: py3-none-any\n")
        z.writestr(f"{stem}.dist-info/RECORD", "")
    return wheel


def resolve(work: Path) -> dict[str, str]:
    """{name: version} of every package the requirements bring that the image does not hold."""
    image = image_packages()
    pins = [line for line in (ROOT / "constraints.txt").read_text().splitlines()
            if line and not line.startswith("#") and canonical(line.split("==")[0]) not in image]
    (work / "pins.txt").write_text("\n".join(pins) + "\n")
    stand_ins = [f"{n} @ {stand_in_wheel(n, v, work).as_uri()}" for n, v in IMAGE_VERSIONS.items()]
    wanted = [r for r in project_requirements() if canonical(Requirement(r).name) not in IMAGE_VERSIONS]
    done = subprocess.run([sys.executable, "-m", "pip", "install", "--dry-run", "--ignore-installed", "-q",
                           "--report", str(work / "report.json"), "--target", str(work / "target"), *GPU_HOST,
                           "-c", str(work / "pins.txt"), *wanted, *stand_ins], capture_output=True, text=True)
    if done.returncode != 0:
        raise SystemExit(f"fetch_gpu_wheels: pip could not resolve the GPU host's requirements:\n{done.stderr}")
    installed = {canonical(i["metadata"]["name"]): i["metadata"]["version"]
                 for i in json.loads((work / "report.json").read_text())["install"]}
    return {n: v for n, v in sorted(installed.items()) if n not in image}


def fetch(dest: Path) -> dict[str, str]:
    dest.mkdir(parents=True, exist_ok=True)
    for old in dest.glob("*.whl"):
        old.unlink()
    with tempfile.TemporaryDirectory() as tmp:
        travel = resolve(Path(tmp))
    done = subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "-q", "-d", str(dest), *GPU_HOST,
                           *(f"{n}=={v}" for n, v in travel.items())], capture_output=True, text=True)
    if done.returncode != 0:
        raise SystemExit(f"fetch_gpu_wheels: pip could not download the wheels:\n{done.stderr}")
    (dest / "requirements.txt").write_text("".join(f"{n}=={v}\n" for n, v in travel.items()))
    size = sum(p.stat().st_size for p in dest.glob("*.whl"))
    if size > LIMIT_BYTES:
        raise SystemExit(f"fetch_gpu_wheels: {size / 2**20:.1f} MiB of wheels, past {LIMIT_BYTES >> 20} MiB")
    return travel


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dest", type=Path, default=ROOT / "gpu-wheels")
    args = parser.parse_args(argv)
    travel = fetch(args.dest)
    size = sum(p.stat().st_size for p in args.dest.glob("*.whl"))
    print(f"{len(travel)} wheels, {size / 2**20:.1f} MiB, in {args.dest}: {', '.join(travel)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
