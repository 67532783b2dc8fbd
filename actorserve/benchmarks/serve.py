"""``actorserve bench serve``: a load generator for any OpenAI-compatible server (ours or another), with
vLLM's ``vllm bench serve`` flags and result keys, so a user's scripts and dashboards keep working.

Streams ``/v1/completions`` (``--backend openai``) or ``/v1/chat/completions`` (``--backend openai-chat``),
each request asking for exactly its output length (``ignore_eos``; ``--no-ignore-eos``: up to it, to the
model's own end, as a copy-heavy workload's answers need), at a Poisson ``--request-rate`` or with
at most ``--max-concurrency`` in flight. Datasets (``--dataset-name``): ``random`` (random token ids of
``--random-input-len``, sent as ids to completions and decoded to text for chat), ``sharegpt`` (the first
human turn of each conversation, the reply's length as the output length) and ``custom`` (JSONL of
``{"prompt": ...}``); ``--dataset`` keeps the old JSON of token-id lists. Reports request, output and
total throughput and the ``--percentile-metrics`` (ttft, tpot, itl, e2el) at ``--metric-percentiles``,
and with ``--save-result`` writes vLLM's JSON. ``--plot out.png`` sweeps ``--concurrency-levels``.
"""
from __future__ import annotations

import argparse
import asyncio
import datetime
import json
import os
import random
import statistics
import time
from dataclasses import dataclass, field
from typing import Optional, Union

from actorserve.benchmarks.sse_client import post_sse

Prompt = Union[str, list[int]]


@dataclass
class BenchRequest:
    prompt: Prompt
    prompt_len: int
    output_len: int


@dataclass
class RequestResult:
    ok: bool
    prompt_len: int
    output_tokens: int = 0
    text: str = ""
    ttft: Optional[float] = None
    itl: list[float] = field(default_factory=list)
    latency: float = 0.0
    error: str = ""


def _tokenizer(args):
    from actorserve.runtime.model_files import resolve_model_path
    from actorserve.runtime.text.tokenizer import load_tokenizer

    return load_tokenizer(args.tokenizer or resolve_model_path(None))


def make_requests(args) -> list[BenchRequest]:
    """The workload: each prompt with its token count and the output length it asks for."""
    rng = random.Random(args.seed)
    n, out_len = args.num_prompts, args.output_len
    if args.dataset:  # the old format: a JSON file of token-id lists (or of named lists of them)
        with open(args.dataset) as f:
            data = json.load(f)
        pool = data if isinstance(data, list) else [p for v in data.values() if isinstance(v, list)
                                                     for p in (v if isinstance(v[0], list) else [v])]
        return [BenchRequest(list(pool[i % len(pool)]), len(pool[i % len(pool)]), out_len) for i in range(n)]
    if args.dataset_name == "random":
        ids = [[rng.randrange(args.token_low, args.token_high) for _ in range(args.input_len)] for _ in range(n)]
        if args.backend == "openai-chat":  # chat takes text: the ids decoded
            tok = _tokenizer(args)
            return [BenchRequest(tok.decode(p), len(p), out_len) for p in ids]
        return [BenchRequest(p, len(p), out_len) for p in ids]
    if args.dataset_path is None:
        raise ValueError(f"--dataset-name {args.dataset_name} needs --dataset-path")
    tok = _tokenizer(args)
    requests = []
    if args.dataset_name == "sharegpt":
        with open(args.dataset_path) as f:
            conversations = json.load(f)
        rng.shuffle(conversations)
        for conv in conversations:
            turns = conv.get("conversations") or []
            if len(turns) < 2:
                continue
            prompt, reply = turns[0]["value"], turns[1]["value"]
            length = args.sharegpt_output_len or len(tok.encode(reply, add_special_tokens=False))
            requests.append(BenchRequest(prompt, len(tok.encode(prompt)), max(1, length)))
            if len(requests) == n:
                break
    else:  # custom: JSONL of {"prompt": ...}
        with open(args.dataset_path) as f:
            rows = [json.loads(line) for line in f if line.strip()]
        for row in rows[:n]:
            requests.append(BenchRequest(row["prompt"], len(tok.encode(row["prompt"])), out_len))
    if not requests:
        raise ValueError(f"{args.dataset_path}: no prompts in it")
    return requests


async def one_request(url: str, headers: dict, model: str, request: BenchRequest, chat: bool,
                      ignore_eos: bool = True) -> RequestResult:
    result = RequestResult(ok=False, prompt_len=request.prompt_len)
    payload = {"model": model, "max_tokens": request.output_len, "temperature": 0.0, "stream": True,
               "stream_options": {"include_usage": True}, "ignore_eos": ignore_eos}
    if chat:
        payload["messages"] = [{"role": "user", "content": request.prompt}]
    else:
        payload["prompt"] = request.prompt
    start = last = time.perf_counter()
    try:
        async for chunk in post_sse(url, payload, headers):
            now = time.perf_counter()
            if "error" in chunk:  # an error event inside the stream
                raise RuntimeError(f"server error: {chunk['error'].get('message', chunk['error'])}")
            choices = chunk.get("choices")
            text = (choices[0].get("delta", {}).get("content") if chat else choices[0].get("text")) if choices else None
            if text:
                if result.ttft is None:
                    result.ttft = now - start
                else:
                    result.itl.append(now - last)
                last = now
                result.text += text
            if chunk.get("usage"):
                result.output_tokens = chunk["usage"]["completion_tokens"]
                result.prompt_len = chunk["usage"]["prompt_tokens"]
        if result.output_tokens == 0:
            raise RuntimeError("the stream ended without a usage report")
        result.latency = time.perf_counter() - start
        result.ok = True
    except Exception as exc:  # a failed request is counted and reported, not fatal to the run
        result.error = f"{type(exc).__name__}: {exc}"
    return result


async def run_load(args, requests: list[BenchRequest], concurrency: Optional[int]) -> dict:
    from tqdm import tqdm

    chat = args.backend == "openai-chat"
    endpoint = args.endpoint or ("/v1/chat/completions" if chat else "/v1/completions")
    url = args.base_url.rstrip("/") + endpoint
    headers = {"Authorization": f"Bearer {args.api_key}"}
    limit = asyncio.Semaphore(concurrency) if concurrency else None
    rng = random.Random(args.seed + 1)
    bar = tqdm(total=len(requests), desc=f"bench serve (concurrency {concurrency or 'unbounded'})",
               disable=args.no_progress)

    async def guarded(request):
        if limit is None:
            r = await one_request(url, headers, args.model, request, chat, args.ignore_eos)
        else:
            async with limit:
                r = await one_request(url, headers, args.model, request, chat, args.ignore_eos)
        bar.update(1)
        return r

    start = time.perf_counter()
    tasks = []
    for request in requests:
        tasks.append(asyncio.ensure_future(guarded(request)))
        if args.request_rate != float("inf"):
            await asyncio.sleep(rng.expovariate(args.request_rate))
    results = await asyncio.gather(*tasks)
    duration = time.perf_counter() - start
    bar.close()
    return report(results, duration, concurrency, args)


def report(results: list[RequestResult], duration: float, concurrency, args) -> dict:
    """vLLM's result keys: throughputs, then mean/median/std/pNN in ms of each percentile metric."""
    ok = [r for r in results if r.ok]
    out_tokens = sum(r.output_tokens for r in ok)
    in_tokens = sum(r.prompt_len for r in ok)
    series = {
        "ttft": [r.ttft for r in ok if r.ttft is not None],
        "tpot": [(r.latency - r.ttft) / (r.output_tokens - 1) for r in ok
                 if r.ttft is not None and r.output_tokens > 1],
        "itl": [x for r in ok for x in r.itl],
        "e2el": [r.latency for r in ok],
    }
    result = {
        "date": datetime.datetime.now().strftime("%Y%m%d-%H%M%S"), "backend": args.backend,
        "model_id": args.model, "num_prompts": len(results), "request_rate": args.request_rate,
        "max_concurrency": concurrency, "duration": duration, "completed": len(ok), "failed": len(results) - len(ok),
        "total_input_tokens": in_tokens, "total_output_tokens": out_tokens,
        "request_throughput": len(ok) / duration, "output_throughput": out_tokens / duration,
        "total_token_throughput": (in_tokens + out_tokens) / duration,
        "errors": sorted({r.error for r in results if not r.ok})[:5],
    }
    for name in _metrics(args):
        values = [v * 1e3 for v in series[name]]
        result[f"mean_{name}_ms"] = statistics.fmean(values) if values else None
        result[f"median_{name}_ms"] = statistics.median(values) if values else None
        result[f"std_{name}_ms"] = statistics.pstdev(values) if values else None
        for p in _percentiles(args.metric_percentiles):
            result[f"p{p:g}_{name}_ms"] = _percentile(values, p) if values else None
    result["input_lens"] = [r.prompt_len for r in results]
    result["output_lens"] = [r.output_tokens for r in results]
    result["ttfts"] = [r.ttft for r in results]
    result["itls"] = [r.itl for r in results]
    result["generated_texts"] = [r.text for r in results]
    return result


def _metrics(args) -> list[str]:
    """--percentile-metrics as names, each one of ttft, tpot, itl, e2el (ValueError otherwise)."""
    names = [m.strip() for m in args.percentile_metrics.split(",") if m.strip()]
    unknown = [m for m in names if m not in ("ttft", "tpot", "itl", "e2el")]
    if unknown:
        raise ValueError(f"--percentile-metrics: {unknown} are not among ttft, tpot, itl, e2el")
    return names


def _percentiles(text: str) -> list[float]:
    return [float(p) for p in text.split(",") if p.strip()]


def _percentile(values: list[float], p: float) -> float:
    """Linear interpolation between ranks, as numpy.percentile (which vLLM's benchmark uses)."""
    ordered = sorted(values)
    rank = (len(ordered) - 1) * p / 100.0
    low = int(rank)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (rank - low)


def print_report(r: dict, args) -> None:
    print(f"concurrency {r['max_concurrency']}, rate {r['request_rate']}: {r['completed']} ok, {r['failed']} failed "
          f"in {r['duration']:.1f} s")
    print(f"  requests/s {r['request_throughput']:.2f}   output tok/s {r['output_throughput']:.1f}   "
          f"total tok/s {r['total_token_throughput']:.1f}")
    for name in _metrics(args):
        if r[f"mean_{name}_ms"] is not None:
            tail = "   ".join(f"p{p:g} {r[f'p{p:g}_{name}_ms']:8.1f} ms" for p in _percentiles(args.metric_percentiles))
            print(f"  {name.upper():5} mean {r[f'mean_{name}_ms']:8.1f} ms   median {r[f'median_{name}_ms']:8.1f} ms   "
                  f"{tail}")
    for e in r["errors"]:
        print(f"  error: {e}")


def plot(results: list[dict], path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    levels = [r["max_concurrency"] for r in results]
    fig, (a, b) = plt.subplots(1, 2, figsize=(10, 4))
    a.plot(levels, [r["output_throughput"] for r in results], marker="o")
    a.set(xlabel="concurrency", ylabel="output tokens/s", title="throughput", xscale="log")
    b.plot(levels, [r["median_ttft_ms"] for r in results], marker="o", label="TTFT median")
    b.plot(levels, [r["median_tpot_ms"] for r in results], marker="o", label="TPOT median")
    b.set(xlabel="concurrency", ylabel="ms", title="latency", xscale="log")
    b.legend()
    fig.tight_layout()
    fig.savefig(path)


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--backend", default="openai", choices=["openai", "openai-chat"])
    p.add_argument("--base-url", required=True, help="e.g. http://127.0.0.1:8000")
    p.add_argument("--endpoint", default=None, help="default: /v1/completions, or /v1/chat/completions for chat")
    p.add_argument("--model", required=True)
    p.add_argument("--tokenizer", default=None, help="for text datasets and chat (default: the embedded model's)")
    p.add_argument("--api-key", default="EMPTY")
    p.add_argument("--num-prompts", type=int, default=100)
    p.add_argument("--dataset-name", default="random", choices=["random", "sharegpt", "custom"])
    p.add_argument("--dataset-path", default=None, help="the sharegpt JSON or the custom JSONL file")
    p.add_argument("--dataset", default=None, help="(old) a JSON file of token-id lists (or of named lists of them)")
    p.add_argument("--random-input-len", "--input-len", dest="input_len", type=int, default=128)
    p.add_argument("--random-output-len", "--output-len", dest="output_len", type=int, default=128)
    p.add_argument("--sharegpt-output-len", type=int, default=None, help="instead of each reply's length")
    p.add_argument("--token-low", type=int, default=1000, help="random prompt ids are drawn from [low, high)")
    p.add_argument("--token-high", type=int, default=20000)
    p.add_argument("--request-rate", type=float, default=float("inf"), help="requests/s, Poisson; inf: all at once")
    p.add_argument("--max-concurrency", type=int, default=None)
    p.add_argument("--ignore-eos", action=argparse.BooleanOptionalAction, default=True,
                   help="each request runs its whole output length (--no-ignore-eos: up to the model's end)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--percentile-metrics", default="ttft,tpot,itl,e2el",
                   help="comma-separated, of ttft, tpot, itl, e2el")
    p.add_argument("--metric-percentiles", default="99", help="comma-separated percentiles, e.g. 50,90,99")
    p.add_argument("--save-result", action="store_true", help="write the result JSON")
    p.add_argument("--result-dir", default=None)
    p.add_argument("--result-filename", default=None,
                   help="default: {backend}-{request_rate}qps-concurrency{n}-{model}-{date}.json, as vLLM")
    p.add_argument("--result-file", default=None, help="(old) write the result JSON to this path")
    p.add_argument("--plot", default=None, help="PNG path: sweep --concurrency-levels and plot")
    p.add_argument("--concurrency-levels", type=int, nargs="+", default=[1, 4, 16, 32])
    p.add_argument("--no-progress", action="store_true")


def _result_path(args, result: dict) -> Optional[str]:
    if args.result_file:
        return args.result_file
    if not args.save_result:
        return None
    name = args.result_filename or (f"{args.backend}-{args.request_rate}qps-concurrency{result['max_concurrency']}-"
                                    f"{os.path.basename(args.model)}-{result['date']}.json")
    return os.path.join(args.result_dir, name) if args.result_dir else name


def main(args: argparse.Namespace) -> int:
    _metrics(args)  # checked before any request is sent
    _percentiles(args.metric_percentiles)
    requests = make_requests(args)
    levels = args.concurrency_levels if args.plot else [args.max_concurrency]
    results = []
    for level in levels:
        r = asyncio.run(run_load(args, requests, level))
        print_report(r, args)
        results.append(r)
    path = _result_path(args, results[0])
    if path is not None:
        if os.path.dirname(path):
            os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "w") as f:
            json.dump(results if args.plot else results[0], f, indent=1)
    if args.plot:
        plot(results, args.plot)
    return 0 if all(r["failed"] == 0 for r in results) else 1
