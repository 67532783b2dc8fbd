"""Our engine against its peers, side by side in one run: transformers' ``generate`` on the same
weights, and llama.cpp on the same GGUF file (``--llama-cpp``; ``pip install -e .[bench]``).

    .venv/bin/python bench/compare_hf.py [--dtype bfloat16 --hf-dtype float32] [--quantization none int8]
                                         [--llama-cpp]

transformers gets exactly our weights (the GGUF dequantized to fp32, as its own GGUF loader would give
them), so the comparison is of engines, not of files. Workloads come from
../shared/reference/bench_prompts.json: single-stream decode (the 20-token prompt, 64 new tokens), 16
prompts batched (64 new tokens each; transformers pads on the left), a 512-token prefill, and offline
throughput (prompts of about 128 tokens, 128 new tokens, greedy). transformers runs the offline workload
on fewer prompts (one padded batch), since its rate is what is compared. Both run in ``--dtype``
(``--hf-dtype float32`` keeps transformers at the issue's anchor setting); ``--quantization none int8``
(or ``none gguf_q8``: the GGUF's weights by int8 activations) times our engine each way, each right after
the same transformers run, and compares each setting's greedy tokens with the first's ("as first").
llama.cpp runs each workload
with our thread count, its multi-sequence decode for the batched ones (bench/llama_cpp_peer.py), and
its greedy tokens are compared with ours; the resident memory after load of ``LLM()`` and of llama.cpp,
each in a fresh process with its KV cache out of the count, is measured too. llama.cpp is the build
llama-cpp-python loads: its wheel's, or the one at ``LLAMA_CPP_LIB_PATH`` (bench/llama_cpp_avx2.sh builds
the AVX2 one, the peer of our AVX2 paths); the instruction sets it uses are printed and recorded. Under
``ACTORSERVE_CPU_ISA`` torch's own libraries (oneDNN, MKL, ATen) are held at that level too, for both
engines, as on a CPU of that level. Prints a
table of ratios and writes bench/results/compare_hf_<dtype>[_<quantizations>]_vs_<hf dtype>[_llama_cpp]
[_isa_<ACTORSERVE_CPU_ISA>].json.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import torch

from actorserve import LLM, SamplingParams
from actorserve.kernels import capability
from actorserve.runtime.config import KV_CACHE_DTYPES
from actorserve.runtime.model.weights.quantization import NAMES as QUANT_METHOD_NAMES

ROOT = Path(__file__).resolve().parents[1]
PROMPTS = ROOT.parent / "shared" / "reference" / "bench_prompts.json"


def hf_model(llm: LLM):
    """A transformers Llama holding the GGUF's weights as our fp32 loader gives them (a load of its own:
    the engine's copy may be bf16, with its matrices prepacked)."""
    import transformers

    from actorserve.runtime.model.weights.loader import load_model

    ours = load_model(llm.config.model.model, "float32", skip_tokenizer=True).model
    cfg = ours.cfg
    hf_cfg = transformers.LlamaConfig(
        vocab_size=cfg.vocab_size, hidden_size=cfg.hidden_size, intermediate_size=cfg.intermediate_size,
        num_hidden_layers=cfg.num_layers, num_attention_heads=cfg.num_heads, num_key_value_heads=cfg.num_kv_heads,
        head_dim=cfg.head_dim, rms_norm_eps=cfg.rms_norm_eps, rope_theta=cfg.rope_theta,
        max_position_embeddings=cfg.max_position_embeddings, tie_word_embeddings=cfg.tie_word_embeddings,
        bos_token_id=1, eos_token_id=2, pad_token_id=2)
    model = transformers.LlamaForCausalLM(hf_cfg).eval()
    state = {name: ours.checkpoint_tensor(name).float() for name in ours.checkpoint_layout()}
    missing, unexpected = model.load_state_dict(state, strict=False)
    assert not unexpected and all(k == "lm_head.weight" for k in missing), (missing, unexpected)
    return model


def hf_generate(model, prompts: list[list[int]], new_tokens: int) -> float:
    """Seconds for one padded batch, greedy, exactly new_tokens each."""
    width = max(len(p) for p in prompts)
    ids = torch.tensor([[2] * (width - len(p)) + p for p in prompts])
    mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts])
    start = time.perf_counter()
    with torch.inference_mode():
        model.generate(input_ids=ids, attention_mask=mask, max_new_tokens=new_tokens, min_new_tokens=new_tokens,
                       do_sample=False, pad_token_id=2)
    return time.perf_counter() - start


def ours(llm: LLM, prompts: list[list[int]], new_tokens: int) -> float:
    params = SamplingParams(temperature=0.0, max_tokens=new_tokens, ignore_eos=True)
    start = time.perf_counter()
    llm.generate([{"prompt_token_ids": p} for p in prompts], params, use_tqdm=False)
    return time.perf_counter() - start


def ours_tokens(llm: LLM, prompts: list[list[int]], new_tokens: int) -> list[list[int]]:
    params = SamplingParams(temperature=0.0, max_tokens=new_tokens, ignore_eos=True)
    return [o.outputs[0].token_ids for o in llm.generate([{"prompt_token_ids": p} for p in prompts], params,
                                                         use_tqdm=False)]


_RSS_OURS = """
import psutil, torch
from actorserve import LLM
llm = LLM(dtype={dtype!r}, quantization={quantization!r}, max_model_len=1024)
print(psutil.Process().memory_info().rss)
"""
_RSS_LLAMA = """
import psutil
import llama_cpp as lc
lc.llama_backend_init()
model = lc.llama_model_load_from_file({path!r}.encode(), lc.llama_model_default_params())
params = lc.llama_context_default_params()
params.n_ctx = 256
ctx = lc.llama_init_from_model(model, params)
print(psutil.Process().memory_info().rss)
"""


def resident_mib(code: str) -> float:
    """RSS after load, in a fresh interpreter (our KV cache is an untouched mapping; llama.cpp's is 256
    tokens, so neither counts)."""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    return int(out.strip().splitlines()[-1]) / 2 ** 20


def offline_prompts(data: dict, count: int) -> list[list[int]]:
    """About 128 tokens each: a batch prompt, then the long prompt's tokens from a varying offset."""
    out = []
    for i in range(count):
        head = data["batch"][i % len(data["batch"])]
        start = (i * 37) % (len(data["long"]) - 100)
        out.append(head + data["long"][start:start + 128 - len(head)])
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--offline-prompts", type=int, default=256)
    ap.add_argument("--hf-offline-prompts", type=int, default=32)
    ap.add_argument("--dtype", default="float32")
    ap.add_argument("--hf-dtype", default=None, help="transformers' dtype (default: --dtype)")
    ap.add_argument("--quantization", nargs="+", default=["none"], choices=["none", *QUANT_METHOD_NAMES],
                    help="our engine in each of these settings, each workload timed right after transformers'")
    ap.add_argument("--llama-cpp", action="store_true", help="llama.cpp on the same GGUF too")
    ap.add_argument("--kv-cache-dtype", default="auto", choices=KV_CACHE_DTYPES, help="our KV cache's dtype")
    args = ap.parse_args()
    hf_dtype = args.hf_dtype or args.dtype
    libraries = capability.hold_libraries(os.environ.get("ACTORSERVE_CPU_ISA"))  # before anything computes
    data = json.loads(PROMPTS.read_text())
    # 2 GiB of KV cache holds all 256 offline sequences at full length (1.5 GB for SmolLM2 in bf16); with 1 GiB
    # a third of them waited or were preempted, and the offline figure measured the cache, not the engine
    engines = {q: LLM(max_model_len=1024, dtype=args.dtype, kv_cache_memory=2 << 30,
                      kv_cache_dtype=args.kv_cache_dtype, quantization=None if q == "none" else q)
               for q in args.quantization}
    hf = hf_model(next(iter(engines.values()))).to(getattr(torch, hf_dtype))  # the same weights
    for llm in engines.values():
        ours(llm, [data["single"]], 4)  # warm-up
    hf_generate(hf, [data["single"]], 4)
    first = next(iter(engines.values()))
    gguf = first.config.model.model or _default_gguf()
    peers = {}
    if args.llama_cpp:
        from llama_cpp_peer import LlamaCpp  # beside this script

        threads = torch.get_num_threads()
        peers["batched"] = LlamaCpp(gguf, threads, max_sequences=16, context=4096, unified=True)
        peers["offline"] = LlamaCpp(gguf, threads, max_sequences=args.offline_prompts,
                                    context=args.offline_prompts * 256, unified=False)
        peers["batched"].generate([data["single"]], 4)  # warm-up

    rows = []

    def row(name, tokens, prompts, new_tokens, hf_prompts=None, peer="batched"):
        hf_prompts = hf_prompts or prompts
        hf_s = hf_generate(hf, hf_prompts, new_tokens)
        hf_rate = tokens * len(hf_prompts) / len(prompts) / hf_s
        lc_rate = lc_tokens = None
        if peer in peers:
            lc_s, lc_tokens = peers[peer].generate(prompts, new_tokens)
            lc_rate = tokens / lc_s
        for q, llm in engines.items():
            our_s = ours(llm, prompts, new_tokens)
            our_rate = tokens / our_s
            rows.append({"workload": name, "quantization": q, "transformers_tok_s": hf_rate,
                         "actorserve_tok_s": our_rate, "ratio": our_rate / hf_rate, "transformers_s": hf_s,
                         "actorserve_s": our_s, "llama_cpp_tok_s": lc_rate,
                         "ratio_llama_cpp": None if lc_rate is None else our_rate / lc_rate,
                         "llama_cpp_token_agreement": None, "first_token_agreement": None})
        if lc_tokens is None and len(engines) == 1:
            return
        # after the timed runs (these fill the prefix cache): greedy tokens against the first setting's
        ref = ours_tokens(first, prompts, new_tokens)
        def agree(got: list[list[int]]) -> float:
            return sum(a == b for x, y in zip(ref, got) for a, b in zip(x, y)) / sum(map(len, ref))
        for r, llm in zip(rows[-len(engines):], engines.values()):
            r["llama_cpp_token_agreement"] = None if lc_tokens is None else agree(lc_tokens)
            r["first_token_agreement"] = agree(ours_tokens(llm, prompts, new_tokens))

    row("single-stream decode (64 new)", 64, [data["single"]], 64)
    row("16 prompts x 64 new", 16 * 64, data["batch"], 64)
    row("512-token prefill (+1 token)", 512, [data["long"]], 1)
    big = offline_prompts(data, args.offline_prompts)
    row(f"offline {args.offline_prompts} x 128 in / 128 out", len(big) * 128, big, 128,
        hf_prompts=big[:args.hf_offline_prompts], peer="offline")
    llama_cpp_build = peers["batched"].build if peers else None
    for peer in peers.values():
        peer.close()
    memory = {}
    if args.llama_cpp:
        memory = {"llama_cpp_rss_mib": resident_mib(_RSS_LLAMA.format(path=gguf))}
        for q in engines:
            memory[f"actorserve_{q}_rss_mib"] = resident_mib(_RSS_OURS.format(
                dtype=args.dtype, quantization=None if q == "none" else q))
    _print(rows, memory)
    if llama_cpp_build:
        print(f"llama.cpp build: {llama_cpp_build}")
    out = ROOT / "bench" / "results"
    out.mkdir(exist_ok=True)
    isa = os.environ.get("ACTORSERVE_CPU_ISA")
    suffix = ("" if args.quantization == ["none"] else "_" + "_".join(args.quantization)) + (
        "_llama_cpp" if args.llama_cpp else "") + (f"_isa_{isa}" if isa else "") + (
        f"_kv_{args.kv_cache_dtype}" if args.kv_cache_dtype != "auto" else "")
    (out / f"compare_hf_{args.dtype}{suffix}_vs_{hf_dtype}.json").write_text(
        json.dumps({"dtype": args.dtype, "hf_dtype": hf_dtype, "quantization": args.quantization,
                    "kv_cache_dtype": args.kv_cache_dtype, "rows": rows,
                    "memory": memory, "threads": torch.get_num_threads(),
                    "cpu_isa": isa or "native", "library_env": libraries, "llama_cpp_build": llama_cpp_build},
                   indent=1))


def _default_gguf() -> str:
    from actorserve.runtime.model_files import resolve_model_path

    return resolve_model_path(None)


def _print(rows: list[dict], memory: dict) -> None:
    print(f"{'workload':42} {'ours':>7} {'transformers':>14} {'llama.cpp':>12} {'actorserve':>12} "
          f"{'/ transformers':>15} {'/ llama.cpp':>12} {'same tokens':>12} {'as first':>9}")
    for r in rows:
        lc = "" if r["llama_cpp_tok_s"] is None else f"{r['llama_cpp_tok_s']:8.1f} t/s"
        lr = "" if r["ratio_llama_cpp"] is None else f"{r['ratio_llama_cpp']:6.2f}x"
        ag = "" if r["llama_cpp_token_agreement"] is None else f"{100 * r['llama_cpp_token_agreement']:5.1f}%"
        af = "" if r.get("first_token_agreement") is None else f"{100 * r['first_token_agreement']:5.1f}%"
        print(f"{r['workload']:42} {r['quantization']:>7} {r['transformers_tok_s']:10.1f} t/s {lc:>12} "
              f"{r['actorserve_tok_s']:8.1f} t/s {r['ratio']:14.2f}x {lr:>12} {ag:>12} {af:>9}")
    for name, mib in memory.items():
        print(f"resident after load, {name[:-8]}: {mib:.0f} MiB")


if __name__ == "__main__":
    main()
