"""The C paged decode kernel (``kernels.attention.cpu_decode``) on SmolLM2-135M's attention shape (3 KV heads
of 64 dims, 3 query heads each, blocks of 16 tokens), with each sequence's blocks in order in the pool or
shuffled through it (as a long-running server's are), in bf16 and fp32 caches.

    .venv/bin/python bench/attention_paths.py [--shapes 16x1024 64x256 2x4096 16x40]
    ACTORSERVE_CPU_ISA=avx2 .venv/bin/python bench/attention_paths.py   # an AVX2-only CPU

Eight layers' worth of distinct caches are read in turn, as a decode step does. Each figure is the best of a
few repeats, in microseconds a layer.
"""
from __future__ import annotations

import argparse
import os
import random

import torch

from actorserve.kernels import capability
from actorserve.kernels.attention import cpu_decode
from gemm_paths import _time  # the same timing as the product paths (run from bench/)

KV_HEADS, GROUP, HEAD_DIM, BLOCK = 3, 3, 64, 16
LAYERS = 8


def _layer(lens: list[int], dtype: torch.dtype, shuffled: bool, seed: int):
    rng = random.Random(seed)
    counts = [-(-n // BLOCK) for n in lens]
    order = list(range(sum(counts)))
    if shuffled:
        rng.shuffle(order)
    k_cache = torch.randn(KV_HEADS, len(order), BLOCK, HEAD_DIM).to(dtype)
    v_cache = torch.randn(KV_HEADS, len(order), BLOCK, HEAD_DIM).to(dtype)
    tables = torch.zeros(len(lens), max(counts), dtype=torch.int64)
    at = 0
    for b, c in enumerate(counts):
        tables[b, :c] = torch.tensor(order[at:at + c])
        at += c
    q = torch.randn(len(lens), KV_HEADS * GROUP, HEAD_DIM).to(dtype)
    return q, k_cache, v_cache, tables, torch.tensor(lens, dtype=torch.int64)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--shapes", nargs="+", default=["16x1024", "64x256", "2x4096", "16x40"],
                    help="sequences x tokens")
    ap.add_argument("--repeat", type=int, default=7)
    args = ap.parse_args()
    capability.hold_libraries(os.environ.get("ACTORSERVE_CPU_ISA"))
    if not cpu_decode.available():
        raise SystemExit("the C paged decode kernel is off on this machine")
    print(f"{torch.get_num_threads()} threads; us a layer")
    print("cache | sequences x tokens | blocks in order | shuffled")
    for dtype in (torch.bfloat16, torch.float32):
        for shape in args.shapes:
            seqs, tokens = (int(v) for v in shape.split("x"))
            cells = []
            for shuffled in (False, True):
                layers = [_layer([tokens] * seqs, dtype, shuffled, seed) for seed in range(LAYERS)]
                t = _time(lambda: [cpu_decode.paged_decode(*layer, HEAD_DIM ** -0.5) for layer in layers], args.repeat)
                cells.append(f"{t / LAYERS * 1e6:8.1f}")
            print(f"{str(dtype).removeprefix('torch.')} | {shape} | {' | '.join(cells)}")


if __name__ == "__main__":
    main()
