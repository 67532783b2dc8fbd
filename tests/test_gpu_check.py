"""scripts/gpu_check.sh on a machine without a GPU: it says so, checks nothing, and exits 2. And what it
would run on one (its dry run): every step under its own limit, within 8 minutes together, in the order
install, CUDA tests, families against transformers, CUDA graphs, the decode benchmark; every step that runs
a kernel runs triton compiled, never its interpreter (tests/kernels/conftest.py turns the interpreter
on for the whole process unless ACTORSERVE_TRITON_COMPILED is set)."""
import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def test_without_a_gpu_the_check_says_so_and_runs_nothing():
    if shutil.which("nvidia-smi") and subprocess.run(["nvidia-smi", "-L"], capture_output=True).returncode == 0:
        pytest.skip("this machine has a GPU: run the script itself")
    done = subprocess.run(["bash", str(ROOT / "scripts" / "gpu_check.sh")], capture_output=True, text=True,
                          timeout=60, env={"PYTHON": sys.executable, "PATH": "/usr/bin:/bin"})
    assert done.returncode == 2, done.stderr
    assert "no NVIDIA GPU" in done.stdout and "nothing was checked" in done.stdout


def test_the_steps_run_triton_compiled_in_order_within_eight_minutes(tmp_path):
    done = subprocess.run([sys.executable, str(ROOT / "scripts" / "gpu_check.py"), "--dry-run",
                           "--json", str(tmp_path / "gpu_check.json")], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    steps = json.loads(done.stdout)
    assert [s["name"] for s in steps] == ["install", "cuda-tests", "families", "cuda-graphs", "decode-bench"]
    assert sum(s["limit_s"] for s in steps) <= 8 * 60
    for step in steps[1:]:
        assert step["env"].get("ACTORSERVE_TRITON_COMPILED") == "1", step["name"]
    commands = {s["name"]: " ".join(s["command"]) for s in steps}
    assert "-m cuda tests" in commands["cuda-tests"] and "-m triton tests/kernels" in commands["cuda-tests"]
    assert "test_decoder_vs_transformers.py" in commands["families"]
    assert "bench/gpu_decode.py" in commands["decode-bench"] and str(tmp_path / "gpu_decode.json") in \
        commands["decode-bench"]


def test_the_decode_benchmark_runs_end_to_end_on_a_tiny_model(tmp_path):
    """What the GPU step runs, on this machine's CPU and the tests' tiny Llama: ours and transformers' on the
    same weights and prompts, the step against its bound, the figures written."""
    out = tmp_path / "bench.json"
    done = subprocess.run([sys.executable, str(ROOT / "bench" / "gpu_decode.py"), "--device", "cpu", "--models",
                           "tiny", "--output-len", "8", "--batch", "4", "--json", str(out)],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    figures = json.loads(out.read_text())["models"]["tiny"]
    assert figures["actorserve"]["batch4_tok_s"] > 0 and figures["transformers"]["batch4_tok_s"] > 0
    assert figures["batch1_bound_s"] > 0 and figures["batch1_step_over_bound"] > 0
    assert 0 <= figures["greedy_tokens_equal_before_first_difference"] <= 8
