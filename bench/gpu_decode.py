"""Decode on one GPU, the default model in bf16: batch 1 and batch 64, and at batch 1 the step time
against its bound, the bytes of weights every step reads over the GPU's memory bandwidth (measured here
with a device-to-device copy). Run by scripts/gpu_check.sh.

    python bench/gpu_decode.py [--device cuda] [--output-len 128] [--attention-backend triton]
"""
from __future__ import annotations

import argparse
import time

import torch

from actorserve import LLM, SamplingParams


def copy_bandwidth(device: str, nbytes: int = 1 << 30, repeats: int = 10) -> float:
    """Bytes a second that a device-to-device copy moves (each byte read once and written once)."""
    src = torch.empty(nbytes, dtype=torch.uint8, device=device)
    dst = torch.empty_like(src)
    dst.copy_(src)
    torch.cuda.synchronize(device)
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(repeats):
        dst.copy_(src)
    end.record()
    torch.cuda.synchronize(device)
    return 2 * nbytes * repeats / (start.elapsed_time(end) / 1000)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--output-len", type=int, default=128)
    ap.add_argument("--attention-backend", default=None)
    args = ap.parse_args()
    llm = LLM(device=args.device, dtype="bfloat16", kv_cache_memory=4 << 30, max_model_len=2048,
              disable_log_stats=True, attention_backend=args.attention_backend)
    runner = llm.engine.executor
    weights = sum(p.numel() * p.element_size() for p in runner.model.parameters())
    params = SamplingParams(temperature=0, max_tokens=args.output_len, ignore_eos=True)
    prompt = {"prompt_token_ids": list(range(1000, 1128))}
    llm.generate(prompt, SamplingParams(max_tokens=8), use_tqdm=False)  # warm-up
    out = llm.generate(prompt, params, use_tqdm=False)[0]
    step = out.metrics.decode_time / (args.output_len - 1)
    bound = weights / copy_bandwidth(args.device)
    print(f"device: {torch.cuda.get_device_name(args.device)}; attention backend: {type(runner.backend).__name__}; "
          f"CUDA graphs: {'on, sizes ' + str(runner.graphs.sizes[:4])[:-1] + ', ...]' if runner.graphs else 'off'}")
    print(f"batch 1: {1 / step:.1f} tok/s, a step {step * 1000:.3f} ms; bound (weights {weights / 2**20:.0f} MiB "
          f"over the copy bandwidth): {bound * 1000:.3f} ms; step / bound {step / bound:.2f}x")
    prompts = [{"prompt_token_ids": list(range(1000 + i, 1128 + i))} for i in range(64)]
    start = time.perf_counter()
    outs = llm.generate(prompts, params, use_tqdm=False)
    elapsed = time.perf_counter() - start
    print(f"batch 64: {sum(len(o.outputs[0].token_ids) for o in outs) / elapsed:.1f} output tok/s "
          f"({len(prompts)} x {args.output_len} new tokens after 128-token prompts, prefill included)")
    if runner.graphs is not None:
        print(f"graph replays by size: {dict(runner.graphs.stats.replays)}; eager steps: {runner.graphs.stats.eager}")


if __name__ == "__main__":
    main()
