"""Sleep mode's memory and time: the offline LLM's RSS before, during and after sleep at each level, with
the ledger's bytes by tag, the time to sleep and to wake, and whether greedy output after wake-up equals
the output before. The KV cache is written through first (as a long-running server's is), so that its
pages are resident.

    .venv/bin/python bench/sleep_mode.py [--dtype float32 bfloat16] [--kv-cache-memory-mib 512]
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import psutil

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from actorserve import LLM, SamplingParams  # noqa: E402

PROMPTS = ["The capital of France is", "def fibonacci(n):", "Once upon a time"]
MIB = 2 ** 20


def _measure(dtype: str, kv_mib: int) -> None:
    llm = LLM(enable_sleep_mode=True, dtype=dtype, max_model_len=1024, kv_cache_memory=kv_mib * MIB)
    greedy = SamplingParams(max_tokens=32, temperature=0)
    reference = [o.outputs[0].token_ids for o in llm.generate(PROMPTS, greedy, use_tqdm=False)]
    ledger = llm.engine.executor.sleep_mode.ledger
    print(f"{dtype}: ledger weights {ledger.nbytes('weights') / MIB:.1f} MiB, kv_cache "
          f"{ledger.nbytes('kv_cache') / MIB:.1f} MiB, workspace {ledger.nbytes('workspace') / MIB:.1f} MiB")
    print(f"{'level':>5} {'before':>8} {'asleep':>8} {'awake':>8} {'given back':>11} {'of held':>8} "
          f"{'sleep s':>8} {'wake s':>7} same")
    process = psutil.Process()
    for level in (1, 2):
        for k, v in llm.engine.executor.kv_caches:
            k.zero_()
            v.zero_()
        held = ledger.nbytes("weights") + ledger.nbytes("kv_cache")
        before = process.memory_info().rss
        started = time.perf_counter()
        llm.sleep(level=level)
        slept = time.perf_counter() - started
        asleep = process.memory_info().rss
        started = time.perf_counter()
        llm.wake_up()
        woke = time.perf_counter() - started
        awake = process.memory_info().rss
        same = [o.outputs[0].token_ids for o in llm.generate(PROMPTS, greedy, use_tqdm=False)] == reference
        print(f"{level:>5} {before / MIB:>7.0f}M {asleep / MIB:>7.0f}M {awake / MIB:>7.0f}M "
              f"{(before - asleep) / MIB:>10.0f}M {(before - asleep) / held:>7.0%} {slept:>8.2f} {woke:>7.2f} {same}")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--dtype", nargs="+", default=["float32", "bfloat16"])
    p.add_argument("--kv-cache-memory-mib", type=int, default=512)
    a = p.parse_args()
    for dtype in a.dtype:
        _measure(dtype, a.kv_cache_memory_mib)


if __name__ == "__main__":
    main()
