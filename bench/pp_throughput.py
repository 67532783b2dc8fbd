"""PP=1 against PP=2 (and more) on the same workload, in one run: output tokens per second.

    .venv/bin/python bench/pp_throughput.py [--prompts 64] [--max-tokens 64] [--sizes 1 2]

Uses the default SmolLM2 model and the fixed prompts of ../shared/reference/bench_prompts.json (the
"batch" set, cycled). Every size runs the same requests, greedy, after one warm-up request, through
worker processes; the offline in-process engine (PP=1) is measured too, as the floor of overhead.
"""
from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

from actorserve import LLM, SamplingParams
from actorserve.runtime.sync_engine import BackgroundEngine
from actorserve.runtime.resolve import engine_config

REFERENCE = Path(__file__).resolve().parents[2] / "shared" / "reference" / "bench_prompts.json"


def workload(count: int) -> list[dict]:
    batch = json.loads(REFERENCE.read_text())["batch"]
    return [{"prompt_token_ids": batch[i % len(batch)]} for i in range(count)]


def measure(pp: int, prompts: list[dict], params: SamplingParams, kv: int, processes: bool) -> dict:
    """processes=False: PP=1 in this process (the offline default); True: worker and scheduler processes."""
    config = engine_config(None, pipeline_parallel_size=pp, max_model_len=1024, kv_cache_memory=kv)
    if processes:
        engine = BackgroundEngine(config)
        run = lambda ps, p: engine.run([(x, p) for x in ps])  # noqa: E731
    else:
        llm = LLM(pipeline_parallel_size=pp, max_model_len=1024, kv_cache_memory=kv)
        run = lambda ps, p: llm.generate(ps, p, use_tqdm=False)  # noqa: E731
    try:
        run(prompts[:1], SamplingParams(max_tokens=4))
        start = time.perf_counter()
        outs = run(prompts, params)
        elapsed = time.perf_counter() - start
    finally:
        if processes:
            engine.close()
    tokens = sum(len(o.outputs[0].token_ids) for o in outs)
    label = f"PP={pp} ({'processes' if processes else 'in-process'})"
    return {"label": label, "seconds": elapsed, "output_tokens": tokens, "output_tok_s": tokens / elapsed,
            "outputs": [o.outputs[0].token_ids for o in outs]}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--prompts", type=int, default=64)
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--sizes", type=int, nargs="+", default=[1, 2])
    ap.add_argument("--kv-cache-memory", type=int, default=256 << 20)
    args = ap.parse_args()
    prompts = workload(args.prompts)
    params = SamplingParams(temperature=0.0, max_tokens=args.max_tokens, ignore_eos=True)
    results = [measure(1, prompts, params, args.kv_cache_memory, processes=False)]
    results += [measure(pp, prompts, params, args.kv_cache_memory, processes=True) for pp in args.sizes]
    base = results[1]
    for r in results:
        same = "same outputs" if r["outputs"] == base["outputs"] else "OUTPUTS DIFFER"
        print(f"{r['label']}: {r['output_tokens']} tokens in {r['seconds']:.2f} s = {r['output_tok_s']:.1f} "
              f"tok/s (x{r['output_tok_s'] / base['output_tok_s']:.2f} of {base['label']}; {same})")


if __name__ == "__main__":
    main()
