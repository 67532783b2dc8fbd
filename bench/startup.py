"""Start-up time: from ``actorserve serve`` to the first token, and what it is spent on.

Runs the server as a user would (a fresh process, the default model, the default KV budget unless told),
times the port opening, the ``serving`` line and a one-token completion; then times the pieces one at a
time in fresh interpreters: the imports of each process, the tokenizer, the GGUF read and dequantize, the
KV cache allocation. Prints one JSON object.

    .venv/bin/python bench/startup.py [--runs 3] [--kv-cache-memory BYTES] [-- extra serve flags]
"""
from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import time
import urllib.request

PIECES = {
    "import_frontend": "import actorserve.frontend.app, actorserve.frontend.server",
    "import_child": "import actorserve.runtime.actors.child, actorserve.runtime.actors.worker_actor, "
                    "actorserve.runtime.actors.scheduler_actor",
    "tokenizer": "from actorserve.runtime.model_files import resolve_model_path; "
                 "from actorserve.runtime.text.tokenizer import load_tokenizer; "
                 "import time; t = time.perf_counter(); load_tokenizer(resolve_model_path(None)); "
                 "print(time.perf_counter() - t)",
    "gguf_read_dequantize": "from actorserve.runtime.model.weights.loader import load_model; import time; "
                            "t = time.perf_counter(); load_model(None, DTYPE, skip_tokenizer=True); "
                            "print(time.perf_counter() - t)",
    "kv_cache_allocation": "import torch, time; from actorserve.runtime.model.execution.runner import _zeroed_caches; "
                           "t = time.perf_counter(); _zeroed_caches((KV // 60,), torch.uint8, torch.device('cpu'), 30); "
                           "print(time.perf_counter() - t)",
}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def serve_once(extra: list[str]) -> dict:
    port = free_port()
    t0 = time.perf_counter()
    proc = subprocess.Popen([sys.executable, "-m", "actorserve.cli", "serve", "--port", str(port), *extra],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env={**os.environ, "PYTHONUNBUFFERED": "1"})
    marks = {}
    try:
        for line in proc.stdout:
            if b"listening" in line and "port_open" not in marks:
                marks["port_open"] = time.perf_counter() - t0
            if b"serving" in line:
                marks["ready"] = time.perf_counter() - t0
                break
        body = json.dumps({"model": "SmolLM2-135M-Instruct", "prompt": "Hello", "max_tokens": 1}).encode()
        req = urllib.request.Request(f"http://127.0.0.1:{port}/v1/completions", data=body,
                                     headers={"Content-Type": "application/json"})
        urllib.request.urlopen(req, timeout=120).read()
        marks["first_token"] = time.perf_counter() - t0
    finally:
        proc.terminate()
        proc.wait(30)
    return marks


def piece(code: str) -> float:
    t = time.perf_counter()
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    whole = time.perf_counter() - t
    last = out.stdout.strip().splitlines()[-1:] if out.stdout.strip() else []
    return float(last[0]) if last else whole


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--runs", type=int, default=3)
    p.add_argument("--dtype", default="float32")
    p.add_argument("--kv-cache-memory", type=int, default=None)
    p.add_argument("extra", nargs="*")
    a = p.parse_args()
    extra = ["--dtype", a.dtype, *(["--kv-cache-memory", str(a.kv_cache_memory)] if a.kv_cache_memory else []), *a.extra]
    runs = [serve_once(extra) for _ in range(a.runs)]
    kv = a.kv_cache_memory or 1 << 30
    pieces = {name: round(statistics.median(piece(code.replace("DTYPE", repr(a.dtype)).replace("KV", str(kv)))
                                            for _ in range(a.runs)), 3) for name, code in PIECES.items()}
    summary = {k: round(statistics.median(r[k] for r in runs), 3) for k in runs[0]}
    print(json.dumps({"serve": summary, "runs": runs, "pieces_s": pieces, "flags": extra}, indent=1))


if __name__ == "__main__":
    main()
