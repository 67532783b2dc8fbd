"""This machine's product rate, and the model-FLOPs utilisation of our decode steps at batch 1, 16 and 64
and of a 512-token prefill.

    .venv/bin/python bench/roofline.py [--dtype float32 bfloat16] [--quantization none gguf_q8]
    ACTORSERVE_CPU_ISA=avx2 .venv/bin/python bench/roofline.py    # torch's libraries held at AVX2 too

The peak is measured, not assumed: the best rate of square-ish products of the model's own shapes, by
the setting's own product (torch's matmul; for gguf_q8 the q8 products on Q4_1 blocks). A decode step's
model FLOPs are 2 x parameters x batch (the matmuls of every layer and the LM head; the attention over the
context is added); a prefill's are 2 x parameters x tokens plus its causal attention. MFU is that divided
by the wall time and the measured peak.
"""
from __future__ import annotations

import argparse
import os
import time

import numpy as np
import torch

from actorserve import LLM, SamplingParams
from actorserve.kernels import capability


def _rate(product, m: int, k: int, n: int) -> float:
    """FLOP/s of product() on an [m, k] by [k, n] problem: the mean of 20 calls after 3 to warm up."""
    for _ in range(3):
        product()
    reps = 20
    start = time.perf_counter()
    for _ in range(reps):
        product()
    return 2 * m * k * n * reps / (time.perf_counter() - start)


def gemm_rate(dtype: torch.dtype, m: int = 1024, k: int = 576, n: int = 1536) -> float:
    a, w = torch.randn(m, k, dtype=dtype), torch.randn(n, k, dtype=dtype)
    return _rate(lambda: torch.nn.functional.linear(a, w), m, k, n)


def q8_rate(m: int = 1024, k: int = 576, n: int = 1536) -> float:
    """The q8 products' rate on Q4_1 blocks of this shape (gguf_paths' random quants and scales)."""
    from actorserve.kernels.gemm import gguf_q8
    from gguf_paths import _blocks  # beside this script

    w = gguf_q8.GgufQ8Weight(_blocks("Q4_1", n, k, np.random.default_rng(0)))
    a = torch.randn(m, k)
    return _rate(lambda: w.apply(a), m, k, n)


def prefill_seconds(llm: LLM, tokens: int = 512, runs: int = 3) -> float:
    """The best of a few prefills of distinct prompts (no prefix in the cache), one token out."""
    params = SamplingParams(temperature=0.0, max_tokens=1)
    best = float("inf")
    for r in range(runs + 1):
        prompt = [1000 + (r * 131 + j * 7) % 9000 for j in range(tokens)]
        start = time.perf_counter()
        llm.generate([{"prompt_token_ids": prompt}], params, use_tqdm=False)
        if r:  # the first warms up
            best = min(best, time.perf_counter() - start)
    return best


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
    ap.add_argument("--quantization", nargs="+", default=["none"], choices=["none", "gguf_q8"],
                    help="each dtype's products as loaded (none), or the q8 products (fp32 only)")
    args = ap.parse_args()
    capability.hold_libraries(os.environ.get("ACTORSERVE_CPU_ISA"))  # before anything computes
    for name in args.dtype:
        for quant in args.quantization:
            if quant == "gguf_q8" and name != "float32":
                continue
            dtype = getattr(torch, name)
            peak = q8_rate() if quant == "gguf_q8" else gemm_rate(dtype)
            llm = LLM(dtype=name, max_model_len=1024, kv_cache_memory=512 << 20,
                      quantization=None if quant == "none" else quant)
            cfg = llm.engine.executor.model.cfg
            params = llm.engine.executor.model.num_parameters()
            label = name if quant == "none" else f"{name} {quant}"
            print(f"{label}: measured product peak {peak / 1e9:.0f} GFLOP/s; model {params / 1e6:.1f} M parameters")
            for batch in (1, 16, 64):
                step = decode_step_seconds(llm, batch)
                attn = 4 * cfg.num_layers * cfg.num_heads * cfg.head_dim * 130 * batch  # q.k and p.v over ~130 keys
                flops = 2 * params * batch + attn
                print(f"  batch {batch:3}: decode step {step * 1e3:7.1f} ms, {batch / step:7.1f} tok/s, "
                      f"{flops / step / 1e9:6.1f} GFLOP/s = MFU {flops / step / peak * 100:5.1f}%")
            seconds, tokens = prefill_seconds(llm), 512
            # the layers' products for every token (the LM head for the last only) and the causal attention
            head = cfg.vocab_size * cfg.hidden_size
            attn = 2 * cfg.num_layers * cfg.num_heads * cfg.head_dim * tokens * (tokens + 1)
            flops = 2 * (params - head) * tokens + 2 * head + attn
            print(f"  prefill {tokens}: {seconds * 1e3:7.1f} ms, {tokens / seconds:7.1f} tok/s, "
                  f"{flops / seconds / 1e9:6.1f} GFLOP/s = MFU {flops / seconds / peak * 100:5.1f}%")


if __name__ == "__main__":
    main()
