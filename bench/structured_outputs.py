"""What structured outputs cost, in one run: decode tokens/s of requests constrained by a JSON schema, a
regex and a choice against the same requests unconstrained, single stream and 16 at once, and how long a
grammar takes to compile (first time, and from the compiler's cache).

    .venv/bin/python bench/structured_outputs.py [--rounds 3]

Constrained and free requests alternate, so that the machine's drift falls on both. The free requests get
the constrained ones' output lengths (ignore_eos, max_tokens = the constrained answer's length), so both
decode as many tokens.
"""
from __future__ import annotations

import argparse
import json
import time

from actorserve import LLM, SamplingParams
from actorserve.runtime.engine.sampling_params import StructuredOutputsParams

SCHEMA = {"type": "object", "properties": {"name": {"type": "string", "maxLength": 16},
                                           "age": {"type": "integer", "minimum": 0, "maximum": 120},
                                           "city": {"enum": ["Paris", "London", "Rome", "Berlin"]},
                                           "hobbies": {"type": "array", "items": {"type": "string", "maxLength": 12},
                                                       "maxItems": 3}},
          "required": ["name", "age", "city", "hobbies"], "additionalProperties": False}
CASES = {"json schema": {"json": SCHEMA}, "regex": {"regex": r"[A-Z][a-z]{2,8}( [a-z]{2,8}){4,8}\."},
         "choice": {"choice": ["yes, certainly", "no, not at all", "it depends on the weather"]}}
ASK = [{"role": "user", "content": "Describe a person as JSON with name, age, city and hobbies."}]


def run(llm: LLM, batch: int, constraint, lengths=None):
    """Seconds and tokens for ``batch`` sampled answers (seeded), constrained or of the given lengths."""
    if constraint is not None:
        params = [SamplingParams(temperature=0.8, seed=i, max_tokens=200,
                                 structured_outputs=StructuredOutputsParams.of(constraint)) for i in range(batch)]
    else:
        params = [SamplingParams(temperature=0.8, seed=i, max_tokens=n, ignore_eos=True) for i, n in
                  enumerate(lengths)]
    start = time.perf_counter()
    outs = llm.chat([ASK] * batch, params, use_tqdm=False)
    return time.perf_counter() - start, [len(o.outputs[0].token_ids) for o in outs]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()
    llm = LLM(kv_cache_memory=256 << 20, max_model_len=2048)
    start = time.perf_counter()
    backend = llm.engine.structured.backend()
    table = time.perf_counter() - start
    first = time.perf_counter()
    backend.compile(StructuredOutputsParams(json=json.dumps({**SCHEMA, "title": "fresh"})))
    compiled = time.perf_counter() - first
    again = time.perf_counter()
    backend.compile(StructuredOutputsParams(json=json.dumps({**SCHEMA, "title": "fresh"})))
    cached = time.perf_counter() - again
    print(f"tokenizer table {table * 1e3:.0f} ms (once); the schema compiled in {compiled * 1e3:.1f} ms, "
          f"{cached * 1e3:.2f} ms from the cache")
    llm.chat(ASK, SamplingParams(max_tokens=4), use_tqdm=False)  # warm-up
    print(f"{'constraint':12} {'batch':>5} {'constrained tok/s':>18} {'free tok/s':>11} {'ratio':>6}")
    for name, constraint in CASES.items():
        for batch in (1, 16):
            c_s = f_s = 0.0
            c_n = f_n = 0
            for _ in range(args.rounds):
                s, lengths = run(llm, batch, constraint)
                c_s, c_n = c_s + s, c_n + sum(lengths)
                s, free = run(llm, batch, None, lengths)
                f_s, f_n = f_s + s, f_n + sum(free)
            print(f"{name:12} {batch:5d} {c_n / c_s:18.1f} {f_n / f_s:11.1f} {(c_n / c_s) / (f_n / f_s):5.2f}x")


if __name__ == "__main__":
    main()
