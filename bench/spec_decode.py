"""Speculative decoding against none, in one run: single-stream tokens/s on a copy-heavy workload (chat
prompts whose answers quote them: bench/datasets/copy_heavy.jsonl) and on random prompts (nothing to
copy: what the drafts cost where they miss). Greedy, so both engines give the same tokens (checked).

    .venv/bin/python bench/spec_decode.py [--speculative-config JSON] [--max-tokens 128] [--rounds 2]
                                          [-q gguf_q8]

The config is vLLM's JSON: ngram by default, or a draft model, e.g. the default GGUF drafting for itself
with the q8 products: '{"model": "default", "quantization": "gguf_q8", "num_speculative_tokens": 3}'
("default" is the embedded model's path).

Each prompt runs on one engine and then the other, alternately first, so that the machine's drift falls
on both; the figures are total new tokens over total time (end to end), and the tokens after each
answer's first over the time after it (decode: what the drafts speed up; the prompt's prefill is the
same either way). Also with the same flags through the server:
``actorserve bench serve --dataset-name custom --dataset-path bench/datasets/copy_heavy.jsonl
--backend openai-chat --max-concurrency 1`` against ``actorserve serve`` with and without
``--speculative-config``.
"""
from __future__ import annotations

import argparse
import json
import random
import time
from pathlib import Path

from actorserve import LLM, SamplingParams
from actorserve.runtime.model_files import resolve_model_path

DATASET = Path(__file__).with_name("datasets") / "copy_heavy.jsonl"
DEFAULT_SPEC = '{"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_max": 4, "prompt_lookup_min": 2}'


def timed(llm: LLM, prompt, params: SamplingParams, chat: bool) -> tuple[list[int], float, float]:
    """The tokens, the seconds end to end, and the seconds after the first token (the decode)."""
    start = time.perf_counter()
    if chat:
        out = llm.chat([{"role": "user", "content": prompt}], params, use_tqdm=False)[0]
    else:
        out = llm.generate(prompt, params, use_tqdm=False)[0]
    return out.outputs[0].token_ids, time.perf_counter() - start, out.metrics.decode_time


def workload(engines: dict[str, LLM], prompts: list, params: SamplingParams, chat: bool, rounds: int):
    """Per engine: new tokens / seconds end to end, and tokens after the first / decode seconds."""
    tokens = {name: 0 for name in engines}
    seconds = {name: 0.0 for name in engines}
    decode = {name: 0.0 for name in engines}
    names = list(engines)
    for r in range(rounds):
        for i, prompt in enumerate(prompts):
            order = names if (i + r) % 2 == 0 else names[::-1]
            got = {}
            for name in order:
                ids, s, d = timed(engines[name], prompt, params, chat)
                got[name] = ids
                tokens[name] += len(ids)
                seconds[name] += s
                decode[name] += d
            assert got[names[0]] == got[names[1]], "greedy output differs with speculation"
    later = tokens[names[0]] - rounds * len(prompts)
    return ({name: tokens[name] / seconds[name] for name in engines},
            {name: later / decode[name] for name in engines}, tokens[names[0]])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--speculative-config", default=DEFAULT_SPEC)
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--random-prompts", type=int, default=8)
    ap.add_argument("--quantization", "-q", default=None, help="both engines' (e.g. gguf_q8)")
    args = ap.parse_args()
    common = dict(kv_cache_memory=256 << 20, max_model_len=2048, quantization=args.quantization)
    spec = json.loads(args.speculative_config)
    if spec.get("model") == "default":
        spec["model"] = resolve_model_path(None)
    engines = {"none": LLM(**common), "spec": LLM(speculative_config=spec, **common)}
    for llm in engines.values():  # warm-up
        llm.generate("Hello", SamplingParams(max_tokens=4), use_tqdm=False)
    copy_prompts = [json.loads(line)["prompt"] for line in DATASET.read_text().splitlines() if line.strip()]
    greedy = SamplingParams(temperature=0, max_tokens=args.max_tokens)
    copy_rates, copy_decode, copy_tokens = workload(engines, copy_prompts, greedy, True, args.rounds)
    rng = random.Random(0)
    vocab = engines["none"].vocab_size
    random_prompts = [{"prompt_token_ids": [rng.randrange(1000, vocab) for _ in range(128)]}
                      for _ in range(args.random_prompts)]
    fixed = SamplingParams(temperature=0, max_tokens=64, ignore_eos=True)
    random_rates, random_decode, random_tokens = workload(engines, random_prompts, fixed, False, args.rounds)
    stats = engines["spec"].engine.scheduler.spec_stats
    method = engines["spec"].config.scheduler.speculative_config.method
    print(f"speculative_config: {args.speculative_config}; quantization: {args.quantization}")
    print(f"{'workload':34} {'':>12} {'none tok/s':>11} {method + ' tok/s':>17} {'speed-up':>9}")
    for name, rates, decode, n in (
            ("copy-heavy chat (16 prompts)", copy_rates, copy_decode, copy_tokens),
            (f"random 128-token prompts ({args.random_prompts})", random_rates, random_decode, random_tokens)):
        for what, r in (("end to end", rates), ("decode", decode)):
            print(f"{name:34} {what:>12} {r['none']:11.1f} {r['spec']:17.1f} {r['spec'] / r['none']:8.2f}x"
                  f"   ({n} tokens each)")
    rate = stats.num_accepted_tokens / max(1, stats.num_draft_tokens)
    per_pos = [f"{a / max(1, d):.2f}" for a, d in zip(stats.num_accepted_tokens_per_pos,
                                                       stats.num_draft_tokens_per_pos)]
    print(f"drafts: {stats.num_drafts} steps, {stats.num_draft_tokens} tokens, {stats.num_accepted_tokens} kept "
          f"({100 * rate:.1f}%); kept per position: {per_pos}")


if __name__ == "__main__":
    main()
