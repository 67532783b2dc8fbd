"""This machine's GEMM rate, and the model-FLOPs utilisation of our decode steps at batch 1, 16 and 64.

    .venv/bin/python bench/roofline.py [--dtype float32 bfloat16]

The peak is measured, not assumed: the best rate of square-ish torch matmuls of the model's own shapes.
A decode step's model FLOPs are 2 x parameters x batch (the matmuls of every layer and the LM head; the
attention over the context is added); MFU is that divided by the step's wall time and the measured peak.
"""
from __future__ import annotations

import argparse
import time

import torch

from actorserve import LLM, SamplingParams


def gemm_rate(dtype: torch.dtype, m: int = 1024, k: int = 576, n: int = 1536) -> float:
    a, w = torch.randn(m, k, dtype=dtype), torch.randn(n, k, dtype=dtype)
    for _ in range(3):
        torch.nn.functional.linear(a, w)
    reps = 20
    start = time.perf_counter()
    for _ in range(reps):
        torch.nn.functional.linear(a, w)
    return 2 * m * k * n * reps / (time.perf_counter() - start)


def decode_step_seconds(llm: LLM, batch: int, context: int = 128, steps: int = 16) -> float:
    engine = llm.engine
    params = SamplingParams(temperature=0.0, max_tokens=steps + 4, ignore_eos=True)
    for i in range(batch):
        engine.add_request(f"roof-{batch}-{i}", [1000 + (i * 7 + j) % 9000 for j in range(context)], params)
    while engine.scheduler.waiting or not all(r.prompt_done for r in engine.scheduler.running):
        engine.step()
    engine.step()
    start = time.perf_counter()
    for _ in range(steps):
        engine.step()
    elapsed = (time.perf_counter() - start) / steps
    while engine.has_unfinished_requests():
        engine.step()
    return elapsed


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--dtype", nargs="+", default=["float32", "bfloat16"])
    args = ap.parse_args()
    for name in args.dtype:
        dtype = getattr(torch, name)
        peak = gemm_rate(dtype)
        llm = LLM(dtype=name, max_model_len=1024, kv_cache_memory=512 << 20)
        cfg = llm.engine.executor.model.cfg
        params = llm.engine.executor.model.num_parameters()
        print(f"{name}: measured GEMM peak {peak / 1e9:.0f} GFLOP/s; model {params / 1e6:.1f} M parameters")
        for batch in (1, 16, 64):
            step = decode_step_seconds(llm, batch)
            attn = 4 * cfg.num_layers * cfg.num_heads * cfg.head_dim * 130 * batch  # q.k and p.v over ~130 keys
            flops = 2 * params * batch + attn
            print(f"  batch {batch:3}: decode step {step * 1e3:7.1f} ms, {batch / step:7.1f} tok/s, "
                  f"{flops / step / 1e9:6.1f} GFLOP/s = MFU {flops / step / peak * 100:5.1f}%")


if __name__ == "__main__":
    main()
