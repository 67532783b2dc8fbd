"""The product paths side by side on SmolLM2-135M's weight shapes: torch's ``F.linear`` on the plain bf16
weight, the same on a weight prepacked at load (``kernels.gemm.prepacked``), the skinny kernel
(``kernels.gemm.skinny``, up to 8 rows), the weight widened to fp32 a slab at a time (``kernels.gemm.widened``,
the path of CPUs without a bf16 GEMM), and the int8 product with its row passes (``kernels.gemm.int8``,
``--quantization int8``, in the form this CPU's gate gives it; the layers only, as the lm_head is not
quantized).

    .venv/bin/python bench/gemm_paths.py [--rows 1 2 4 8 16 32 64 256]
    ACTORSERVE_CPU_ISA=avx2 .venv/bin/python bench/gemm_paths.py   # an AVX2-only CPU, torch's libraries too

Thirty layers' worth of distinct weights (about 212 MB in bf16, far past the L3 cache) are multiplied in
turn, as a decode step does, so the figures are of weights streamed from memory, not of a cached matrix.
Each row is the best of a few repeats, the three paths interleaved.
"""
from __future__ import annotations

import argparse
import os
import time

import torch
from torch.nn import functional as F

from actorserve.kernels import capability
from actorserve.kernels.gemm import int8, prepacked, skinny, widened

SHAPES = [(576, 960), (576, 576), (576, 3072), (1536, 576)]  # (in, out): qkv, o, gate_up, down


def _time(fn, repeat: int) -> float:
    fn()
    best = float("inf")
    for _ in range(repeat):
        start = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - start)
    return best


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rows", type=int, nargs="+", default=[1, 2, 4, 8, 16, 32, 64, 256])
    ap.add_argument("--repeat", type=int, default=5)
    args = ap.parse_args()
    libraries = capability.hold_libraries(os.environ.get("ACTORSERVE_CPU_ISA"))  # before anything computes
    weights = [torch.randn(n, k).bfloat16() for _ in range(30) for (k, n) in SHAPES]
    packed = [prepacked.PackedWeight(w) for w in weights] if prepacked.available() else None
    quantized = [int8.Int8Weight(w) for w in weights] if int8.int_mm_available() else None
    head = torch.randn(49152, 576).bfloat16()
    head_packed = prepacked.PackedWeight(head) if packed else None
    size = sum(w.numel() * 2 for w in weights)
    print(f"{len(weights)} weights, {size / 1e6:.0f} MB bf16, {torch.get_num_threads()} threads; "
          f"prepacked: {packed is not None}, skinny kernel: {skinny.available()}; {capability.current().describe()}"
          + (f"; {' '.join(f'{k}={v}' for k, v in libraries.items())}" if libraries else ""))
    print("rows | 120 linears: plain ms | prepacked ms | skinny ms | widened ms | int8 ms "
          "| lm_head: plain ms | prepacked ms | skinny ms | widened ms")
    nan = float("nan")
    for m in args.rows:
        xs = {k: torch.randn(m, k).bfloat16() for k, _ in SHAPES}
        repeat = args.repeat if m <= 64 else 2
        plain = _time(lambda: [F.linear(xs[w.shape[1]], w) for w in weights], repeat)
        pk = (_time(lambda: [prepacked.packed_linear(xs[p.in_features], p) for p in packed], repeat)
              if packed else nan)
        sk = (_time(lambda: [skinny.skinny_linear(xs[w.shape[1]], w) for w in weights], repeat)
              if skinny.available() and m <= skinny.MAX_ROWS else nan)
        wd = _time(lambda: [widened.widened_linear(xs[w.shape[1]], w) for w in weights], repeat)
        i8 = _time(lambda: [q.apply(xs[q.in_features]) for q in quantized], repeat) if quantized else nan
        h_plain = _time(lambda: F.linear(xs[576], head), repeat)
        h_pk = _time(lambda: prepacked.packed_linear(xs[576], head_packed), repeat) if packed else nan
        h_sk = (_time(lambda: skinny.skinny_linear(xs[576], head), repeat)
                if skinny.available() and m <= skinny.MAX_ROWS else nan)
        h_wd = _time(lambda: widened.widened_linear(xs[576], head), repeat)
        print(f"{m:4d} | {plain * 1e3:8.2f} | {pk * 1e3:8.2f} | {sk * 1e3:8.2f} | {wd * 1e3:8.2f} | {i8 * 1e3:8.2f} "
              f"| {h_plain * 1e3:8.2f} | {h_pk * 1e3:8.2f} | {h_sk * 1e3:8.2f} | {h_wd * 1e3:8.2f}")


if __name__ == "__main__":
    main()
