"""Our engine on real GGUF files as llama.cpp writes them (actorserve.benchmarks.real_files: the default
SmolLM2 Q4_1, Gemma 3 270M Q4_K_M from PyPI, and the default model requantized by llama.cpp's quantizer to
the presets that hold every other block type), side by side with llama.cpp on the same file and threads.

    .venv/bin/python bench/real_files.py [--files NAME[:PRESET] ...] [--part agreement speed]

``agreement``: greedy tokens, 20 prompts x 64 new tokens (the model's own tokenizer, the same ids for
everyone), of our engine in each setting (the exact default ``gguf``, ``gguf_q8``, ``bfloat16``) against
transformers in fp32 on the same file (its own GGUF loader and dequantizer) and against llama.cpp: the
share of positions with the same token, and the prompts whose 64 tokens are all the same.
``speed``: single-stream decode (a 20-token prompt, 64 new), 16 prompts x 64 new, a 512-token prefill (+1
token), each ours (``gguf`` and ``gguf_q8``) against llama.cpp (bench/llama_cpp_peer.py), and the resident
memory after load of each, in fresh processes with the KV cache out of the count. llama.cpp is the build
llama-cpp-python loads (``LLAMA_CPP_LIB_PATH``, as bench/compare_hf.py). Under ``ACTORSERVE_CPU_ISA``
torch's own libraries are held at that level too. Prints one table a part and writes
bench/results/real_files_<part>[_isa_<ACTORSERVE_CPU_ISA>].json.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

import torch

from actorserve import LLM, SamplingParams
from actorserve.benchmarks import real_files
from actorserve.kernels import capability

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))
from compare_hf import _RSS_LLAMA, resident_mib  # noqa: E402  (beside this script)
from llama_cpp_peer import LlamaCpp  # noqa: E402

PROMPTS = [
    "The capital of France is", "def fibonacci(n):", "Once upon a time, in a small village,",
    "The three primary colours are", "Water boils at", "To make a cup of tea, first",
    "The largest planet in the solar system is", "import numpy as np\n\ndef mean(values):",
    "In 1969, the first humans", "A haiku about autumn:", "The difference between a virus and a bacterium is",
    "Photosynthesis is the process by which", "SELECT name FROM users WHERE", "My favourite book is",
    "The quick brown fox", "Here is a list of fruits: apple, banana,", "The speed of light is about",
    "To sort a list in Python, you can", "The Great Wall of China was built", "Dear Sir or Madam,\n\nI am writing",
]
SETTINGS = {"gguf": {}, "gguf_q8": {"quantization": "gguf_q8"}, "bfloat16": {"dtype": "bfloat16"}}
NEW = 64
_RSS_OURS = """
import psutil
from actorserve import LLM
llm = LLM({path!r}, quantization={quantization!r}, max_model_len=1024)
print(psutil.Process().memory_info().rss)
"""


def path_of(spec: str) -> str:
    name, _, preset = spec.partition(":")
    return str(real_files.real_file(name) if not preset else real_files.requantized(name, preset))


def greedy(llm: LLM, prompts: list[list[int]], new: int) -> tuple[float, list[list[int]]]:
    params = SamplingParams(temperature=0.0, max_tokens=new, ignore_eos=True)
    start = time.perf_counter()
    outs = llm.generate([{"prompt_token_ids": p} for p in prompts], params, use_tqdm=False)
    return time.perf_counter() - start, [list(o.outputs[0].token_ids) for o in outs]


def hf_greedy(path: str, prompts: list[list[int]]) -> list[list[int]]:
    """transformers in fp32 on the same file, one prompt at a time (no padding)."""
    from transformers import AutoModelForCausalLM

    p = Path(path)
    model = AutoModelForCausalLM.from_pretrained(str(p.parent), gguf_file=p.name, dtype=torch.float32).eval()
    model.generation_config.eos_token_id = None  # EOS may be chosen, and generation goes on, as ignore_eos
    out = []
    with torch.inference_mode():
        for ids in prompts:
            got = model.generate(torch.tensor([ids]), max_new_tokens=NEW, do_sample=False)
            out.append(got[0, len(ids):].tolist())
    return out


def agreement(ours: list[list[int]], ref: list[list[int]]) -> dict:
    same = sum(a == b for x, y in zip(ours, ref) for a, b in zip(x, y))
    return {"tokens": same / sum(map(len, ref)), "prompts": sum(x == y for x, y in zip(ours, ref))}


def agreement_part(spec: str, threads: int) -> dict:
    path = path_of(spec)
    results, tokens = {}, {}
    for setting, kwargs in SETTINGS.items():
        llm = LLM(path, kv_cache_memory=256 << 20, max_model_len=1024, **kwargs)
        prompts = [llm.get_tokenizer().encode(p) for p in PROMPTS]
        tokens[setting] = greedy(llm, prompts, NEW)[1]
        llm.close()
    peer = LlamaCpp(path, threads, max_sequences=len(prompts), context=len(prompts) * 128, unified=False)
    lc_tokens = peer.generate(prompts, NEW)[1]
    peer.close()
    hf_tokens = hf_greedy(path, prompts)
    for setting in SETTINGS:
        results[setting] = {"transformers": agreement(tokens[setting], hf_tokens),
                            "llama_cpp": agreement(tokens[setting], lc_tokens)}
    results["llama_cpp"] = {"transformers": agreement(lc_tokens, hf_tokens)}
    return results


def speed_part(spec: str, threads: int) -> dict:
    path = path_of(spec)
    peer = LlamaCpp(path, threads, max_sequences=16, context=4096, unified=True)
    llm = LLM(path, kv_cache_memory=256 << 20, max_model_len=1024)
    tok = llm.get_tokenizer()
    prompts = [tok.encode(p) for p in PROMPTS]
    llm.close()
    single, batch = prompts[:1], prompts[:16]
    long = [t for p in prompts * 8 for t in p[1:]][:511]
    long = [prompts[0][0], *long]
    workloads = {"single-stream decode": (single, NEW, NEW), "16 x 64": (batch, NEW, 16 * NEW),
                 "512-token prefill": ([long], 1, len(long))}
    rows = {}
    peer.generate(single, 4)
    for name, (ps, new, count) in workloads.items():
        rows[name] = {"llama_cpp": count / min(peer.generate(ps, new)[0] for _ in range(2))}
    peer.close()
    for q in ("gguf", "gguf_q8"):
        llm = LLM(path, kv_cache_memory=512 << 20, max_model_len=1024, enable_prefix_caching=False, **SETTINGS[q])
        greedy(llm, single, 4)
        for name, (ps, new, count) in workloads.items():
            rows[name][q] = count / min(greedy(llm, ps, new)[0] for _ in range(2))
        llm.close()
    memory = {"llama_cpp": resident_mib(_RSS_LLAMA.format(path=path))}
    for q in ("gguf", "gguf_q8"):
        memory[q] = resident_mib(_RSS_OURS.format(path=path, quantization=q))
    return {"tok_s": rows, "rss_mib": memory}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    default = [*real_files.REAL_FILES, *(f"{real_files.DEFAULT}:{p}" for p in real_files.PRESETS)]
    ap.add_argument("--files", nargs="+", default=default, help="NAME or NAME:PRESET (default: all)")
    ap.add_argument("--part", nargs="+", default=["agreement", "speed"], choices=["agreement", "speed"])
    args = ap.parse_args()
    isa = os.environ.get("ACTORSERVE_CPU_ISA")
    libraries = capability.hold_libraries(isa)  # before anything computes
    threads = torch.get_num_threads()
    for part in args.part:
        run = agreement_part if part == "agreement" else speed_part
        results = {}
        for spec in args.files:
            results[spec] = run(spec, threads)
            print(json.dumps({spec: results[spec]}), flush=True)
        _print(part, results)
        out = ROOT / "bench" / "results"
        out.mkdir(exist_ok=True)
        (out / f"real_files_{part}{f'_isa_{isa}' if isa else ''}.json").write_text(json.dumps(
            {"results": results, "threads": threads, "cpu_isa": isa or "native", "library_env": libraries,
             "llama_cpp_lib": os.environ.get("LLAMA_CPP_LIB_PATH", "the wheel's")}, indent=1))


def _print(part: str, results: dict) -> None:
    if part == "agreement":
        print(f"{'file':44} {'setting':9} {'= transformers':>15} {'= llama.cpp':>12}")
        for spec, r in results.items():
            for setting, a in r.items():
                lc = a.get("llama_cpp")
                hf = a["transformers"]
                print(f"{spec:44} {setting:9} {100 * hf['tokens']:6.1f}% {hf['prompts']:2d}/20"
                      + ("" if lc is None else f" {100 * lc['tokens']:6.1f}% {lc['prompts']:2d}/20"))
        return
    print(f"{'file':44} {'workload':22} {'llama.cpp':>10} {'gguf':>16} {'gguf_q8':>16}")
    for spec, r in results.items():
        for name, rates in r["tok_s"].items():
            lc = rates["llama_cpp"]
            print(f"{spec:44} {name:22} {lc:10.1f}" + "".join(
                f" {rates[q]:8.1f} ({rates[q] / lc:4.2f}x)" for q in ("gguf", "gguf_q8")))
        m = r["rss_mib"]
        print(f"{spec:44} {'resident MiB':22} {m['llama_cpp']:10.0f} {m['gguf']:16.0f} {m['gguf_q8']:16.0f}")


if __name__ == "__main__":
    main()
