"""``actorserve bench serve``: a load generator for any OpenAI-compatible server (ours or another).

Sends streaming /v1/completions with prompts given as token ids (random, of a set input length, or read
from a JSON file of token-id lists), each asking for exactly ``--output-len`` tokens (``ignore_eos``),
either at a Poisson ``--request-rate`` or with at most ``--max-concurrency`` in flight. Reports request
throughput, output and total tokens/s, TTFT, TPOT, ITL and end-to-end latency (mean, median, p99), and
writes a JSON result. ``--plot out.png`` sweeps ``--concurrency-levels`` and draws throughput and latency
against concurrency (needs matplotlib).
"""
from __future__ import annotations

import argparse
import asyncio
import json
import random
import time
from dataclasses import dataclass, field
from typing import Optional

from actorserve.benchmarks.sse_client import post_sse
from actorserve.benchmarks.stats import summary_ms


@dataclass
class RequestResult:
    ok: bool
    prompt_len: int
    output_tokens: int = 0
    ttft: Optional[float] = None
    itl: list[float] = field(default_factory=list)
    latency: float = 0.0
    error: str = ""


def make_prompts(args) -> list[list[int]]:
    rng = random.Random(args.seed)
    if args.dataset:
        with open(args.dataset) as f:
            data = json.load(f)
        pool = data if isinstance(data, list) else [p for v in data.values() if isinstance(v, list)
                                                     for p in (v if isinstance(v[0], list) else [v])]
        return [list(pool[i % len(pool)]) for i in range(args.num_prompts)]
    return [[rng.randrange(args.token_low, args.token_high) for _ in range(args.input_len)]
            for _ in range(args.num_prompts)]


async def one_request(url: str, headers: dict, model: str, prompt: list[int], output_len: int) -> RequestResult:
    result = RequestResult(ok=False, prompt_len=len(prompt))
    payload = {"model": model, "prompt": prompt, "max_tokens": output_len, "temperature": 0.0, "stream": True,
               "stream_options": {"include_usage": True}, "ignore_eos": True}
    start = last = time.perf_counter()
    try:
        async for chunk in post_sse(url, payload, headers):
            now = time.perf_counter()
            if "error" in chunk:  # an error event inside the stream
                raise RuntimeError(f"server error: {chunk['error'].get('message', chunk['error'])}")
            choices = chunk.get("choices")
            if choices and choices[0].get("text"):
                if result.ttft is None:
                    result.ttft = now - start
                else:
                    result.itl.append(now - last)
                last = now
            if chunk.get("usage"):
                result.output_tokens = chunk["usage"]["completion_tokens"]
        if result.output_tokens == 0:
            raise RuntimeError("the stream ended without a usage report")
        result.latency = time.perf_counter() - start
        result.ok = True
    except Exception as exc:  # a failed request is counted and reported, not fatal to the run
        result.error = f"{type(exc).__name__}: {exc}"
    return result


async def run_load(args, prompts: list[list[int]], concurrency: Optional[int]) -> dict:
    from tqdm import tqdm

    url = args.base_url.rstrip("/") + "/v1/completions"
    headers = {"Authorization": f"Bearer {args.api_key}"}
    limit = asyncio.Semaphore(concurrency) if concurrency else None
    rng = random.Random(args.seed + 1)
    bar = tqdm(total=len(prompts), desc=f"bench serve (concurrency {concurrency or 'unbounded'})",
               disable=args.no_progress)

    async def guarded(prompt):
        if limit is None:
            r = await one_request(url, headers, args.model, prompt, args.output_len)
        else:
            async with limit:
                r = await one_request(url, headers, args.model, prompt, args.output_len)
        bar.update(1)
        return r

    start = time.perf_counter()
    tasks = []
    for prompt in prompts:
        tasks.append(asyncio.ensure_future(guarded(prompt)))
        if args.request_rate != float("inf"):
            await asyncio.sleep(rng.expovariate(args.request_rate))
    results = await asyncio.gather(*tasks)
    duration = time.perf_counter() - start
    bar.close()
    return report(results, duration, concurrency, args.request_rate)


def report(results: list[RequestResult], duration: float, concurrency, rate) -> dict:
    ok = [r for r in results if r.ok]
    out_tokens = sum(r.output_tokens for r in ok)
    in_tokens = sum(r.prompt_len for r in ok)
    tpot = [(r.latency - r.ttft) / (r.output_tokens - 1) for r in ok if r.ttft is not None and r.output_tokens > 1]
    return {
        "max_concurrency": concurrency, "request_rate": rate, "duration_s": duration,
        "completed": len(ok), "failed": len(results) - len(ok),
        "errors": sorted({r.error for r in results if not r.ok})[:5],
        "request_throughput": len(ok) / duration, "output_tok_s": out_tokens / duration,
        "total_tok_s": (in_tokens + out_tokens) / duration,
        "ttft_ms": summary_ms([r.ttft for r in ok if r.ttft is not None]),
        "tpot_ms": summary_ms(tpot), "itl_ms": summary_ms([x for r in ok for x in r.itl]),
        "e2e_ms": summary_ms([r.latency for r in ok]),
    }


def print_report(r: dict) -> None:
    print(f"concurrency {r['max_concurrency']}, rate {r['request_rate']}: {r['completed']} ok, {r['failed']} failed "
          f"in {r['duration_s']:.1f} s")
    print(f"  requests/s {r['request_throughput']:.2f}   output tok/s {r['output_tok_s']:.1f}   "
          f"total tok/s {r['total_tok_s']:.1f}")
    for key in ("ttft_ms", "tpot_ms", "itl_ms", "e2e_ms"):
        s = r[key]
        if s["mean"] is not None:
            print(f"  {key[:-3].upper():5} mean {s['mean']:8.1f} ms   median {s['median']:8.1f} ms   "
                  f"p99 {s['p99']:8.1f} ms")
    for e in r["errors"]:
        print(f"  error: {e}")


def plot(results: list[dict], path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    levels = [r["max_concurrency"] for r in results]
    fig, (a, b) = plt.subplots(1, 2, figsize=(10, 4))
    a.plot(levels, [r["output_tok_s"] for r in results], marker="o")
    a.set(xlabel="concurrency", ylabel="output tokens/s", title="throughput", xscale="log")
    b.plot(levels, [r["ttft_ms"]["median"] for r in results], marker="o", label="TTFT median")
    b.plot(levels, [r["tpot_ms"]["median"] for r in results], marker="o", label="TPOT median")
    b.set(xlabel="concurrency", ylabel="ms", title="latency", xscale="log")
    b.legend()
    fig.tight_layout()
    fig.savefig(path)


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--base-url", required=True, help="e.g. http://127.0.0.1:8000")
    p.add_argument("--model", required=True)
    p.add_argument("--api-key", default="EMPTY")
    p.add_argument("--num-prompts", type=int, default=100)
    p.add_argument("--input-len", type=int, default=128)
    p.add_argument("--output-len", type=int, default=128)
    p.add_argument("--dataset", default=None, help="a JSON file of token-id lists (or of named lists of them)")
    p.add_argument("--token-low", type=int, default=1000, help="random prompt ids are drawn from [low, high)")
    p.add_argument("--token-high", type=int, default=20000)
    p.add_argument("--request-rate", type=float, default=float("inf"), help="requests/s, Poisson; inf: all at once")
    p.add_argument("--max-concurrency", type=int, default=None)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--result-file", default="bench_serve.json")
    p.add_argument("--plot", default=None, help="PNG path: sweep --concurrency-levels and plot")
    p.add_argument("--concurrency-levels", type=int, nargs="+", default=[1, 4, 16, 32])
    p.add_argument("--no-progress", action="store_true")


def main(args: argparse.Namespace) -> int:
    prompts = make_prompts(args)
    levels = args.concurrency_levels if args.plot else [args.max_concurrency]
    results = []
    for level in levels:
        r = asyncio.run(run_load(args, prompts, level))
        print_report(r)
        results.append(r)
    with open(args.result_file, "w") as f:
        json.dump(results if args.plot else results[0], f, indent=1)
    if args.plot:
        plot(results, args.plot)
    return 0 if all(r["failed"] == 0 for r in results) else 1
