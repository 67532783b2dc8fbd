"""The skinny bf16 GEMM against torch's bf16 ``F.linear``, side by side on SmolLM2-135M's weight shapes.

    .venv/bin/python bench/skinny_gemm.py [--rows 1 2 4 8 16]

Thirty layers' worth of distinct weights (about 212 MB in bf16, far past the L3 cache) are multiplied in
turn, as a decode step does, so the figures are of weights streamed from memory, not of a cached matrix.
"""
from __future__ import annotations

import argparse
import time

import torch
from torch.nn import functional as F

from kernels.gemm import skinny

SHAPES = [(576, 960), (576, 576), (576, 3072), (1536, 576)]  # (in, out): qkv, o, gate_up, down


def _time(fn, repeat: int) -> float:
    for _ in range(2):
        fn()
    start = time.perf_counter()
    for _ in range(repeat):
        fn()
    return (time.perf_counter() - start) / repeat


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rows", type=int, nargs="+", default=[1, 2, 4, 8, 16])
    ap.add_argument("--repeat", type=int, default=8)
    args = ap.parse_args()
    if not skinny.available():
        raise SystemExit("the skinny bf16 kernel is not available here (needs a C compiler and AVX-512 BF16)")
    weights = [torch.randn(n, k).bfloat16() for _ in range(30) for (k, n) in SHAPES]
    head = torch.randn(49152, 576).bfloat16()
    size = sum(w.numel() * 2 for w in weights)
    print(f"{len(weights)} weights, {size / 1e6:.0f} MB bf16, {torch.get_num_threads()} threads")
    print("rows | layers: torch ms | kernel ms | ratio | kernel GB/s | lm_head: torch ms | kernel ms")
    for m in args.rows:
        xs = {k: torch.randn(m, k).bfloat16() for k, _ in SHAPES}
        run = {name: _time(lambda: [fn(xs[w.shape[1]], w) for w in weights], args.repeat)
               for name, fn in (("torch", F.linear), ("kernel", skinny.skinny_linear))}
        h = {name: _time(lambda: fn(xs[576], head), args.repeat)
             for name, fn in (("torch", F.linear), ("kernel", skinny.skinny_linear))}
        print(f"{m:4d} | {run['torch'] * 1e3:8.2f} | {run['kernel'] * 1e3:8.2f} | {run['torch'] / run['kernel']:5.2f}x"
              f" | {size / run['kernel'] / 1e9:6.1f} | {h['torch'] * 1e3:8.2f} | {h['kernel'] * 1e3:8.2f}")


if __name__ == "__main__":
    main()
