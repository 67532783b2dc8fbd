"""``actorserve bench throughput`` (offline LLM, N prompts) and ``actorserve bench latency`` (one batch,
timed step by step, with the host-side share of each decode step measured by the torch profiler)."""
from __future__ import annotations

import argparse
import json
import random
import time

from actorserve.benchmarks.stats import summary_ms


def add_engine_arguments(p: argparse.ArgumentParser) -> None:
    """The engine flags every command takes (``actorserve.engine_flags``), with the benchmarks' defaults,
    and the workload's own."""
    from actorserve.engine_flags import add_engine_arguments as engine_arguments

    p.add_argument("--model", default=None)
    p.add_argument("--config", metavar="FILE", help="a YAML file of these flags (flags given here win)")
    engine_arguments(p)
    # 2 GiB of KV: 256 sequences of 256 tokens of SmolLM2 in bf16 take 1.5 GB
    p.set_defaults(dtype="float32", max_model_len=2048, kv_cache_memory=2 << 30, seed=0)
    p.add_argument("--input-len", type=int, default=128)
    p.add_argument("--output-len", type=int, default=128)
    p.add_argument("--result-file", default=None)


def _llm(args):
    from actorserve import LLM
    from actorserve.engine_flags import engine_kwargs

    return LLM(args.model, **engine_kwargs(args))


def _prompts(count: int, length: int, vocab: int, seed: int) -> list[dict]:
    """Random ids from [1000, 20000), past the special tokens (from [vocab/2, vocab) for a tiny vocabulary)."""
    rng = random.Random(seed)
    low, high = min(1000, vocab // 2), min(vocab, 20000)
    return [{"prompt_token_ids": [rng.randrange(low, high) for _ in range(length)]} for _ in range(count)]


def throughput(args: argparse.Namespace) -> int:
    from actorserve import SamplingParams

    llm = _llm(args)
    prompts = _prompts(args.num_prompts, args.input_len, llm.vocab_size, args.seed)
    params = SamplingParams(temperature=0.0, max_tokens=args.output_len, ignore_eos=True)
    llm.generate(prompts[:1], SamplingParams(max_tokens=2), use_tqdm=False)
    start = time.perf_counter()
    outs = llm.generate(prompts, params, use_tqdm=not args.no_progress)
    elapsed = time.perf_counter() - start
    out_tokens = sum(len(o.outputs[0].token_ids) for o in outs)
    result = {"num_prompts": len(prompts), "input_len": args.input_len, "output_len": args.output_len,
              "dtype": args.dtype, "quantization": args.quantization,
              "enforce_eager": args.enforce_eager, "seconds": elapsed, "requests_s": len(prompts) / elapsed,
              "output_tokens": out_tokens, "output_tok_s": out_tokens / elapsed,
              "total_tok_s": (out_tokens + args.input_len * len(prompts)) / elapsed}
    print(f"{len(prompts)} prompts x {args.input_len} in / {args.output_len} out ({args.dtype}): {elapsed:.1f} s, "
          f"{result['requests_s']:.2f} req/s, {result['output_tok_s']:.1f} output tok/s, "
          f"{result['total_tok_s']:.1f} total tok/s")
    _save(args, result)
    return 0


def latency(args: argparse.Namespace) -> int:
    from actorserve import SamplingParams

    llm = _llm(args)
    engine = llm.engine
    params = SamplingParams(temperature=0.0, max_tokens=args.output_len, ignore_eos=True)
    llm.generate(_prompts(1, 8, llm.vocab_size, 1), SamplingParams(max_tokens=2), use_tqdm=False)
    for i, p in enumerate(_prompts(args.batch_size, args.input_len, llm.vocab_size, args.seed)):
        engine.add_request(f"lat-{i}", p["prompt_token_ids"], params)
    steps, executes = [], []
    runner = engine.executor
    execute = runner.execute

    def timed_execute(batch):
        t = time.perf_counter()
        out = execute(batch)
        executes.append(time.perf_counter() - t)
        return out

    runner.execute = timed_execute
    try:
        prefill_until = None
        while engine.has_unfinished_requests():
            t = time.perf_counter()
            engine.step()
            steps.append(time.perf_counter() - t)
            if prefill_until is None and all(r.prompt_done for r in engine.scheduler.running):
                prefill_until = len(steps)
        engine_share = 1 - sum(executes) / sum(steps)
        host = _host_share(engine, args, params)
    finally:
        runner.execute = execute
    decode = steps[prefill_until:]
    result = {"batch_size": args.batch_size, "input_len": args.input_len, "output_len": args.output_len,
              "dtype": args.dtype, "quantization": args.quantization,
              "enforce_eager": args.enforce_eager, "prefill_s": sum(steps[:prefill_until]), "decode_step_ms": summary_ms(decode),
              "engine_share": engine_share, "host_share_of_decode_step": host,
              "decode_tok_s": args.batch_size * len(decode) / sum(decode) if decode else None}
    d = result["decode_step_ms"]
    print(f"batch {args.batch_size}, {args.input_len} in / {args.output_len} out ({args.dtype}): "
          f"prefill {result['prefill_s'] * 1e3:.0f} ms; decode step mean {d['mean']:.1f} ms, median "
          f"{d['median']:.1f} ms, p99 {d['p99']:.1f} ms = {result['decode_tok_s']:.1f} tok/s")
    print(f"scheduler + detokenizer share of a step {result['engine_share'] * 100:.1f}%; host-side share of a "
          f"decode step (time not in torch ops) {host * 100:.1f}%")
    _save(args, result)
    return 0


# Operators that move no data: allocations and views. Their time is dispatch, so it counts as host time.
_METADATA_OPS = frozenset(f"aten::{name}" for name in (
    "empty", "empty_like", "empty_strided", "view", "reshape", "_reshape_alias", "_unsafe_view", "as_strided",
    "slice", "select", "alias", "detach", "detach_", "unsqueeze", "squeeze", "transpose", "permute", "expand",
    "t", "split", "chunk", "narrow", "unbind", "lift_fresh", "resolve_conj", "resolve_neg", "contiguous", "to",
    "flatten", "view_as", "expand_as"))


def _host_share(engine, args, params) -> float:
    """Fraction of a decode step's wall time not spent computing inside operators (torch's, oneDNN's, our
    C kernels'): Python, dispatch, allocations and views.

    Operator time is the self time of every operator except those that move no data (``_METADATA_OPS``;
    ``aten::to`` and ``contiguous`` keep their copies, recorded as ``aten::copy_``), over the same profiled
    steps whose wall time it is divided by. Timing the wall of unprofiled steps instead would keep the
    profiler's own cost out of it, but compare steps taken a fraction of a second apart on a machine whose
    speed drifts by more than the share: six such pairs of one process read 5% to 39%, the same-step share
    13% to 16%. The profiler's work between operators counts as host time here
    (so the share errs high); its work inside a span, about 1-2 us of an operator, counts as operator time.
    The median of five rounds of six steps is reported."""
    import msgspec
    import statistics

    from torch.profiler import ProfilerActivity, profile

    rounds, steps = 5, 6
    host_params = msgspec.structs.replace(params, max_tokens=2 + rounds * steps + 2, ignore_eos=True)
    for i, p in enumerate(_prompts(args.batch_size, args.input_len, engine.facts.vocab_size, args.seed + 1)):
        engine.add_request(f"host-{i}", p["prompt_token_ids"], host_params)
    while not all(r.prompt_done for r in engine.scheduler.running) or engine.scheduler.waiting:
        engine.step()
    for _ in range(2):  # the first steps after a prefill are not steady state
        engine.step()
    kernels = ("aten::", "mkldnn::", "actorserve::")
    shares = []
    for _ in range(rounds):
        with profile(activities=[ProfilerActivity.CPU]) as prof:
            start = time.perf_counter()
            for _ in range(steps):
                engine.step()
            wall = time.perf_counter() - start
        in_ops = sum(e.self_cpu_time_total for e in prof.key_averages()
                     if e.key.startswith(kernels) and e.key not in _METADATA_OPS) / 1e6
        shares.append(max(0.0, 1 - in_ops / wall))
    for rid in list(engine._groups):
        engine.abort_request(rid)
    return statistics.median(shares)


def _save(args, result: dict) -> None:
    if args.result_file:
        with open(args.result_file, "w") as f:
            json.dump(result, f, indent=1)
