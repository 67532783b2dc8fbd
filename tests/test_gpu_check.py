"""scripts/gpu_check.sh on a machine without a GPU: it says so, checks nothing, and exits 2."""
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def test_without_a_gpu_the_check_says_so_and_runs_nothing():
    if shutil.which("nvidia-smi") and subprocess.run(["nvidia-smi", "-L"], capture_output=True).returncode == 0:
        pytest.skip("this machine has a GPU: run the script itself")
    done = subprocess.run(["bash", str(ROOT / "scripts" / "gpu_check.sh")], capture_output=True, text=True,
                          timeout=60)
    assert done.returncode == 2
    assert "no NVIDIA GPU" in done.stdout and "nothing was checked" in done.stdout
