"""fp32 products from GGUF weights, side by side on SmolLM2-135M's shapes: the dense fp32 weight (what
dequantizing at load gives, torch's ``F.linear``), our kernel on the file's blocks (``kernels.gemm.gguf``,
Q4_1 as the default file's layers and Q8_0 as its embedding table), and torch's own CPU weight-only ops on
the nearest layouts they take: ``_weight_int4pack_mm_for_cpu`` (4-bit groups of 32 with a scale and a
zero point each, as Q4_1 has) and ``_weight_int8pack_mm`` (8-bit with one scale per output channel,
coarser than Q8_0's per-block scales, so not the file's values). Beside them, the opt-in q8 products
(``kernels.gemm.gguf_q8``: the same blocks repacked, by activations quantized to int8 per block of 32,
approximate).

    .venv/bin/python bench/gguf_paths.py [--rows 1 2 4 8]

Thirty layers' worth of distinct weights (far past the L3 cache) are multiplied in turn, as a decode step
does; the lm_head (49152 x 576) is timed on its own. Each figure is the best of a few repeats.
"""
from __future__ import annotations

import argparse

import numpy as np
import torch
from torch.nn import functional as F

from actorserve.kernels.gemm import gguf, gguf_q8
from actorserve.kernels.gemm.gguf import GgufWeight, Segment
from gemm_paths import SHAPES, _time  # the same shapes and timing as the bf16 paths (run from bench/)

HEAD = (576, 49152)


def _blocks(type_name: str, n: int, k: int, rng) -> GgufWeight:
    nbytes = gguf.TYPES[type_name][2]
    raw = rng.integers(0, 256, size=(n * (k // 32), nbytes), dtype=np.uint8)
    raw[:, 0:4] = (rng.standard_normal((n * (k // 32), 2)) * 0.02).astype(np.float16).view(np.uint8)
    return GgufWeight([Segment(type_name, torch.from_numpy(raw.reshape(n, -1).copy()), 0, n)], k)


def _int4pack(w: torch.Tensor):
    """torch's int4 weight-only layout of w [N, K]: groups of 32, a scale and a zero point per group."""
    n, k = w.shape
    g = w.reshape(n, k // 32, 32)
    lo, hi = g.amin(-1, keepdim=True), g.amax(-1, keepdim=True)
    scale = ((hi - lo) / 15).clamp(min=1e-8)
    q = ((g - lo) / scale).round().clamp(0, 15).to(torch.int32).reshape(n, k)
    zero = lo + 8 * scale  # torch's form: w = (q - 8) * scale + zero
    scales_zeros = torch.stack([scale.squeeze(-1), zero.squeeze(-1)], dim=-1).transpose(0, 1).contiguous()
    packed = torch.ops.aten._convert_weight_to_int4pack_for_cpu(q, 2)
    return packed, scales_zeros


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rows", type=int, nargs="+", default=[1, 2, 4, 8, 16, 64])
    ap.add_argument("--repeat", type=int, default=5)
    args = ap.parse_args()
    rng = np.random.default_rng(0)
    q41 = [_blocks("Q4_1", n, k, rng) for _ in range(30) for (k, n) in SHAPES]
    q80 = [_blocks("Q8_0", n, k, rng) for _ in range(30) for (k, n) in SHAPES]
    dense = [w.dequantize() for w in q41]
    head_q80 = _blocks("Q8_0", HEAD[1], HEAD[0], rng)
    head = head_q80.dequantize()
    q8 = gguf_q8.available()
    q41_q8 = [gguf_q8.GgufQ8Weight(w) for w in q41] if q8 else []
    q80_q8 = [gguf_q8.GgufQ8Weight(w) for w in q80] if q8 else []
    head_q8 = gguf_q8.GgufQ8Weight(head_q80) if q8 else None
    try:
        int4 = [_int4pack(w) for w in dense]
    except (RuntimeError, AttributeError) as e:
        print(f"torch int4pack unavailable: {e}")
        int4 = None
    int8 = [(w.to(torch.int8), torch.ones(w.shape[0])) for w in dense]
    print(f"{len(dense)} weights: {sum(w.numel() * 4 for w in dense) / 1e6:.0f} MB fp32, "
          f"{sum(w.nbytes for w in q41) / 1e6:.0f} MB Q4_1; {torch.get_num_threads()} threads")
    print("rows | 120 linears: fp32 ms | Q4_1 ms | Q8_0 ms | torch int4pack ms | torch int8pack ms "
          "| Q4_1 q8 ms | Q8_0 q8 ms | lm_head: fp32 ms | Q8_0 ms | Q8_0 q8 ms")
    nan = float("nan")
    for m in args.rows:
        xs = {k: torch.randn(m, k) for k, _ in SHAPES}
        r = args.repeat
        t_dense = _time(lambda: [F.linear(xs[w.shape[1]], w) for w in dense], r)
        t_q41 = _time(lambda: [w.apply(xs[w.in_features]) for w in q41], r)
        t_q80 = _time(lambda: [w.apply(xs[w.in_features]) for w in q80], r)
        t_int4 = (_time(lambda: [torch.ops.aten._weight_int4pack_mm_for_cpu(xs[w.shape[1]], p, 32, sz)
                                 for w, (p, sz) in zip(dense, int4)], r) if int4 else nan)
        t_int8 = _time(lambda: [torch._weight_int8pack_mm(xs[q.shape[1]], q, s) for q, s in int8], r)
        h_dense = _time(lambda: F.linear(xs[576], head), r)
        h_q80 = _time(lambda: head_q80.apply(xs[576]), r)
        t_q41_q8 = _time(lambda: [w.apply(xs[w.in_features]) for w in q41_q8], r) if q8 else nan
        t_q80_q8 = _time(lambda: [w.apply(xs[w.in_features]) for w in q80_q8], r) if q8 else nan
        h_q8 = _time(lambda: head_q8.apply(xs[576]), r) if q8 else nan
        print(f"{m:4d} | {t_dense * 1e3:8.2f} | {t_q41 * 1e3:8.2f} | {t_q80 * 1e3:8.2f} | {t_int4 * 1e3:8.2f} "
              f"| {t_int8 * 1e3:8.2f} | {t_q41_q8 * 1e3:8.2f} | {t_q80_q8 * 1e3:8.2f} | {h_dense * 1e3:8.2f} "
              f"| {h_q80 * 1e3:8.2f} | {h_q8 * 1e3:8.2f}")


if __name__ == "__main__":
    main()
