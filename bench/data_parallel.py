"""Data parallelism on this machine's cores: DP=2 with one thread a worker against DP=1 with every thread,
in one run, on the default model. Each setting serves the same requests (the same random token ids, all
at once, greedy, ignore_eos) through the engine's own front door (``make_engine``: what ``actorserve
serve`` runs), and the output tokens per second of the whole batch are compared; then a single stream,
where a replica has only its one thread.

    .venv/bin/python bench/data_parallel.py [--prompts 64] [--input-len 128] [--output-len 128] [--rounds 2]
"""
from __future__ import annotations

import argparse
import asyncio
import os
import random
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from actorserve import SamplingParams  # noqa: E402
from actorserve.runtime.data_parallel import make_engine  # noqa: E402
from actorserve.runtime.resolve import engine_config  # noqa: E402


async def _batch(engine, prompts: list[list[int]], output_len: int) -> tuple[float, int]:
    params = SamplingParams(max_tokens=output_len, temperature=0, ignore_eos=True)

    async def one(ids: list[int]) -> int:
        last = None
        async for out in engine.generate({"prompt_token_ids": ids}, params):
            last = out
        return len(last.outputs[0].token_ids)

    started = time.perf_counter()
    tokens = sum(await asyncio.gather(*(one(ids) for ids in prompts)))
    return time.perf_counter() - started, tokens


async def _measure(dp: int, threads: int, prompts: list[list[int]], output_len: int, rounds: int) -> dict:
    config = engine_config(None, data_parallel_size=dp, threads_per_worker=threads,
                           max_model_len=1024, kv_cache_memory=512 << 20, disable_log_stats=True)
    engine = make_engine(config)
    await engine.start()
    try:
        await _batch(engine, prompts[:2], 8)  # warm-up
        batch = min([await _batch(engine, prompts, output_len) for _ in range(rounds)], key=lambda r: r[0])
        single = min([await _batch(engine, prompts[:1], output_len) for _ in range(rounds)], key=lambda r: r[0])
    finally:
        await engine.close()
    return {"batch": batch[1] / batch[0], "single": single[1] / single[0]}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--prompts", type=int, default=64)
    p.add_argument("--input-len", type=int, default=128)
    p.add_argument("--output-len", type=int, default=128)
    p.add_argument("--rounds", type=int, default=2)
    a = p.parse_args()
    rng = random.Random(0)
    prompts = [[rng.randrange(100, 40000) for _ in range(a.input_len)] for _ in range(a.prompts)]
    cores = os.cpu_count() or 1
    settings = [(1, cores), (2, max(1, cores // 2))]
    results = {s: asyncio.run(_measure(*s, prompts, a.output_len, a.rounds)) for s in settings}
    print(f"{a.prompts} prompts x {a.input_len}/{a.output_len} tokens at once, then one stream; output tok/s")
    print(f"{'setting':<28}{'batch':>10}{'single':>10}")
    for (dp, threads), r in results.items():
        print(f"{f'DP={dp}, {threads} thread(s) a worker':<28}{r['batch']:>10.1f}{r['single']:>10.1f}")
    one, two = results[settings[0]], results[settings[1]]
    print(f"DP=2 / DP=1: batch {two['batch'] / one['batch']:.2f}x, single stream {two['single'] / one['single']:.2f}x")


if __name__ == "__main__":
    main()
