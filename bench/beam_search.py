"""Beam search's step rate through the served engine (AsyncEngine, the path `serve` takes), in one run:
the engine's own search (one request; each step's beams in one batch) against vLLM V1's way of running it
from outside (each step's beams sent as one-token requests of their own, side by side), and against
greedy decoding of as many tokens.

    .venv/bin/python bench/beam_search.py [--width 4] [--tokens 32] [--rounds 3]

The three alternate within each round, so that the machine's drift falls on all; the figure is the
median over rounds of milliseconds per generated token (a step).
"""
from __future__ import annotations

import argparse
import asyncio
import statistics
import time

from actorserve import AsyncEngine, SamplingParams
from actorserve.runtime.engine.beam_search import BeamSearch, BeamSearchParams

PROMPT = "The history of the printing press begins"


async def in_engine(engine: AsyncEngine, params: BeamSearchParams, tag: str) -> None:
    async for _ in engine.generate(PROMPT, params, request_id=tag):
        pass


async def from_outside(engine: AsyncEngine, ids: list[int], params: BeamSearchParams, eos, max_len, tag) -> None:
    """vLLM V1's serving beam search: every step, each live beam a request of one token with 2 * width
    logprobs, all sent at once."""
    search = BeamSearch([ids], params, eos, max_len)
    step = params.step_params()

    async def one(prompt: list[int], rid: str):
        last = None
        async for out in engine.generate({"prompt_token_ids": prompt}, step, request_id=rid):
            last = out
        return last

    while batch := search.pending():
        outs = await asyncio.gather(*(one(p, f"{tag}-{search.steps}-{k}") for k, p in enumerate(batch)))
        search.advance([o.outputs[0].logprobs[0] for o in outs])


async def greedy(engine: AsyncEngine, tokens: int, tag: str) -> None:
    async for _ in engine.generate(PROMPT, SamplingParams(temperature=0, max_tokens=tokens, ignore_eos=True),
                                   request_id=tag):
        pass


async def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--width", type=int, default=4)
    ap.add_argument("--tokens", type=int, default=32)
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()
    params = BeamSearchParams(beam_width=args.width, max_tokens=args.tokens, ignore_eos=True)
    async with AsyncEngine(kv_cache_memory=256 << 20, max_model_len=2048, disable_log_stats=True) as engine:
        from actorserve.runtime.model_files import resolve_model_path
        from actorserve.runtime.text.tokenizer import load_tokenizer

        tok = load_tokenizer(resolve_model_path(engine.config.model.model))
        ids = tok.encode(PROMPT)
        max_len = engine.config.model.max_model_len
        runs = {"in the engine": lambda tag: in_engine(engine, params, tag),
                "from outside (vLLM V1's)": lambda tag: from_outside(engine, ids, params, tok.eos_token_id, max_len,
                                                                     tag),
                "greedy": lambda tag: greedy(engine, args.tokens, tag)}
        for name, run in runs.items():  # warm-up
            await run(f"warm-{name}")
        times = {name: [] for name in runs}
        for r in range(args.rounds):
            for name, run in runs.items():
                start = time.perf_counter()
                await run(f"{r}-{name}")
                times[name].append((time.perf_counter() - start) / args.tokens * 1e3)
    step = {name: statistics.median(t) for name, t in times.items()}
    print(f"beam search, {args.width} beams x {args.tokens} tokens; ms a step (median of {args.rounds} rounds)")
    for name, ms in step.items():
        print(f"  {name:<26} {ms:7.1f} ms")
    print(f"  the engine's search: {step['from outside (vLLM V1' + chr(39) + 's)'] / step['in the engine']:.1f}x "
          f"the step rate of the one from outside; {step['in the engine'] / step['greedy']:.1f}x greedy's step time")


if __name__ == "__main__":
    asyncio.run(main())
