"""The GPU checks of actorserve, in one unattended run of under 8 minutes on one GPU, offline (docs/gpu.md).
scripts/gpu_check.sh runs it. In order, each under its own time limit, a failing step not
stopping the others:

1. ``install``: the wheels of ``gpu-wheels/`` (scripts/fetch_gpu_wheels.py, run beforehand where there is
   a network) with ``--no-index``, then the project itself, beside the image's torch and triton;
2. ``cuda-tests``: the ``cuda``-marked tests and the triton kernels' tests, triton compiled (never its
   interpreter: ``ACTORSERVE_TRITON_COMPILED`` is set for every step);
3. ``families``: every model family on a tiny random config, logits through prefill and 16 greedy decodes
   against transformers on the same GPU;
4. ``cuda-graphs``: decode steps replayed from CUDA graphs against eager ones;
5. ``decode-bench``: bench/gpu_decode.py on random-initialised Llama-3.2-1B and Qwen3-MoE shapes: batch 1
   and 64, the batch-1 step against its bound, transformers' generate beside it.

It writes ``gpu_check.json`` (each step's status, seconds and output tail; the benchmark's figures) and
prints a summary. Exit status: 0 when every step passed, 1 when one failed, 2 when there is no GPU here.

    python scripts/gpu_check.py [--json gpu_check.json] [--steps cuda-tests families ...] [--dry-run]
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
WHEELS = ROOT / "gpu-wheels"
BENCH_JSON = "gpu_decode.json"


@dataclass
class Step:
    name: str
    command: list[str]
    limit_s: int
    env: dict[str, str] = field(default_factory=dict)


TOTAL_LIMIT_S = 480  # the steps' limits together: the device's 15 minutes hold a start-up and a rerun beside it


def steps(python: str, out_dir: Path) -> list[Step]:
    compiled = {"ACTORSERVE_TRITON_COMPILED": "1", "TRITON_DEFAULT_FP_FUSION": "1"}
    pytest = [python, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-rs"]
    if WHEELS.joinpath("requirements.txt").exists():
        install = ["bash", "-c", f"{python} -m pip install -q --no-index --find-links {WHEELS} "
                                 f"-r {WHEELS / 'requirements.txt'} && "
                                 f"{python} -m pip install -q --no-index --no-deps --no-build-isolation -e {ROOT}"]
    else:  # a host with a network: the extras, keeping its torch
        install = [python, "-m", "pip", "install", "-q", "-e", f"{ROOT}[cuda,test]"]
    return [
        Step("install", install, 60),
        Step("cuda-tests", ["bash", "-c", " ".join([
            *pytest, "-m", "cuda", "tests",
            "--ignore", "tests/runtime/model/architectures/test_decoder_vs_transformers.py",
            "--ignore", "tests/runtime/model/execution/test_cuda_graphs.py", "; a=$?;",
            # (the compile check needs no GPU: make test runs it)
            *pytest, "-m", "triton", "tests/kernels", "--ignore", "tests/kernels/test_compiled_for_gpus.py",
            "; exit $((a | $?))"])], 120, compiled),
        Step("families", [*pytest, "-m", "cuda", "tests/runtime/model/architectures/test_decoder_vs_transformers.py"],
             60, compiled),
        Step("cuda-graphs", [*pytest, "-m", "cuda", "tests/runtime/model/execution/test_cuda_graphs.py"], 45, compiled),
        Step("decode-bench", [python, str(ROOT / "bench" / "gpu_decode.py"), "--json", str(out_dir / BENCH_JSON)],
             180, compiled),
    ]


def gpus() -> int:
    if shutil.which("nvidia-smi") is None:
        return 0
    done = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True)
    return sum(line.startswith("GPU") for line in done.stdout.splitlines()) if done.returncode == 0 else 0


def run_step(step: Step) -> dict:
    print(f"\n== {step.name} (at most {step.limit_s} s): {' '.join(step.command)}", flush=True)
    start = time.monotonic()
    try:
        done = subprocess.run(step.command, cwd=ROOT, env={**os.environ, **step.env}, capture_output=True, text=True,
                              timeout=step.limit_s)
        status, output = ("passed" if done.returncode == 0 else "failed"), done.stdout + done.stderr
    except subprocess.TimeoutExpired as e:
        status = "timed out"
        output = (e.stdout or b"").decode(errors="replace") + (e.stderr or b"").decode(errors="replace")
    seconds = time.monotonic() - start
    print(output[-4000:], flush=True)
    print(f"== {step.name}: {status} in {seconds:.0f} s", flush=True)
    return {"name": step.name, "status": status, "seconds": round(seconds, 1), "output_tail": output[-6000:]}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--json", type=Path, default=ROOT / "gpu_check.json")
    ap.add_argument("--steps", nargs="+", help="run only these (default: every step)")
    ap.add_argument("--dry-run", action="store_true", help="print the steps as JSON and run nothing")
    args = ap.parse_args(argv)
    plan = [s for s in steps(sys.executable, args.json.parent) if not args.steps or s.name in args.steps]
    if args.dry_run:
        print(json.dumps([asdict(s) for s in plan], indent=1))
        return 0
    if gpus() < 1:
        print("gpu_check: no NVIDIA GPU on this machine (nvidia-smi lists none): nothing was checked.")
        return 2
    import torch  # (the image's)

    results = {"torch": torch.__version__, "cuda": torch.version.cuda,
               "gpu": torch.cuda.get_device_name(0) if torch.cuda.is_available() else None, "steps": []}
    if results["gpu"] is None:
        print("gpu_check: torch sees no CUDA device (a CPU build of torch?): install a CUDA build of torch first.")
        return 1
    for step in plan:
        results["steps"].append(run_step(step))
        args.json.write_text(json.dumps(results, indent=1))  # (what ran so far, should a later step hang the run)
    bench = args.json.parent / BENCH_JSON
    if bench.exists():
        results["decode_bench"] = json.loads(bench.read_text())
    args.json.write_text(json.dumps(results, indent=1))
    print(f"\n== summary ({results['gpu']}, torch {results['torch']}): written to {args.json}")
    for s in results["steps"]:
        print(f"  {s['name']:14} {s['status']:10} {s['seconds']:6.0f} s")
    if "decode_bench" in results:
        sys.path.insert(0, str(ROOT / "bench"))
        from gpu_decode import summary

        print(summary(results["decode_bench"]))
    return 0 if all(s["status"] == "passed" for s in results["steps"]) else 1


if __name__ == "__main__":
    sys.exit(main())
