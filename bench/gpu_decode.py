"""Decode on one GPU, on random-initialised models of real shapes built where it runs (an offline GPU
machine has no model files): a Llama-3.2-1B and a Qwen3-MoE (Qwen3-30B-A3B's layers, four of them), bf16.
For each: batch 1 and batch 64 (128-token prompts, ``--output-len`` new tokens), the batch-1 step against
its bound (the bytes of weights a step reads over the copy bandwidth measured here), and transformers' own
``generate`` on the same weights and prompts, side by side. Run by scripts/gpu_check.sh.

    python bench/gpu_decode.py [--device cuda] [--models llama-3.2-1b qwen3-moe] [--output-len 128]
                               [--json results.json]

``--models tiny`` builds a 2-layer Llama of the tests' size: a smoke run on any device (tests/bench).
"""
from __future__ import annotations

import argparse
import gc
import json
import sys
import tempfile
import time
from pathlib import Path

import torch

# (per the models' config.json; the MoE keeps Qwen3-30B-A3B's layer shapes, with 4 of its 48 layers)
SHAPES = {
    "llama-3.2-1b": ("LlamaConfig", dict(vocab_size=128256, hidden_size=2048, intermediate_size=8192,
                                         num_hidden_layers=16, num_attention_heads=32, num_key_value_heads=8,
                                         head_dim=64, max_position_embeddings=4096, rms_norm_eps=1e-5,
                                         rope_theta=500000.0, tie_word_embeddings=True)),
    "qwen3-moe": ("Qwen3MoeConfig", dict(vocab_size=151936, hidden_size=2048, intermediate_size=6144,
                                         moe_intermediate_size=768, num_experts=128, num_experts_per_tok=8,
                                         num_hidden_layers=4, num_attention_heads=32, num_key_value_heads=4,
                                         head_dim=128, max_position_embeddings=4096, rms_norm_eps=1e-6,
                                         norm_topk_prob=True, decoder_sparse_step=1, mlp_only_layers=[],
                                         tie_word_embeddings=False)),
    "tiny": ("LlamaConfig", dict(vocab_size=384, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                                 num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=1024)),
}
PROMPT_LEN = 128


def build(name: str, directory: Path, device: str) -> Path:
    """The model of ``SHAPES[name]``, random weights (std 0.02) made on ``device``, saved as safetensors."""
    import transformers

    klass, shape = SHAPES[name]
    config = getattr(transformers, klass)(**shape, bos_token_id=None, eos_token_id=None, pad_token_id=None)
    torch.manual_seed(0)
    with torch.device(device):
        model = transformers.AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16)
    model.save_pretrained(directory)
    del model
    return directory


def copy_bandwidth(device: str, nbytes: int = 1 << 30, repeats: int = 10) -> float:
    """Bytes a second that a copy on ``device`` moves (each byte read once and written once)."""
    nbytes = nbytes if device.startswith("cuda") else 64 << 20
    src = torch.empty(nbytes, dtype=torch.uint8, device=device)
    dst = torch.empty_like(src)
    dst.copy_(src)
    _sync(device)
    start = time.perf_counter()
    for _ in range(repeats):
        dst.copy_(src)
    _sync(device)
    return 2 * nbytes * repeats / (time.perf_counter() - start)


def _sync(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize(device)


def _prompts(n: int, vocab: int) -> list[list[int]]:
    g = torch.Generator().manual_seed(1)
    return [torch.randint(0, vocab, (PROMPT_LEN,), generator=g).tolist() for _ in range(n)]


def ours(directory: Path, device: str, output_len: int, vocab: int, batch: int) -> dict:
    from actorserve import LLM, SamplingParams

    llm = LLM(model=str(directory), device=device, dtype="bfloat16", skip_tokenizer_init=True,
              kv_cache_memory=(8 << 30) if device.startswith("cuda") else (64 << 20), max_model_len=1024,
              max_num_seqs=max(batch, 1), disable_log_stats=True)
    runner = llm.engine.executor
    weights = sum(p.numel() * p.element_size() for p in runner.model.parameters())
    active = _active_weight_bytes(runner.model, weights)
    params = SamplingParams(temperature=0, max_tokens=output_len, ignore_eos=True)
    one = {"prompt_token_ids": _prompts(1, vocab)[0]}
    llm.generate(one, SamplingParams(max_tokens=4, ignore_eos=True), use_tqdm=False)  # warm-up (graphs, kernels)
    out = llm.generate(one, params, use_tqdm=False)[0]
    step = out.metrics.decode_time / (output_len - 1)
    many = [{"prompt_token_ids": p} for p in _prompts(batch, vocab)]
    _sync(device)
    start = time.perf_counter()
    outs = llm.generate(many, params, use_tqdm=False)
    elapsed = time.perf_counter() - start
    result = {"attention_backend": type(runner.backend).__name__,
              "cuda_graphs": list(runner.graphs.sizes) if getattr(runner, "graphs", None) else None,
              "weight_bytes": weights, "active_weight_bytes_a_token": active, "batch1_step_s": step,
              "batch1_tok_s": 1 / step, f"batch{batch}_tok_s": sum(len(o.outputs[0].token_ids) for o in outs) / elapsed,
              "batch1_tokens": out.outputs[0].token_ids}
    if getattr(runner, "graphs", None) is not None:
        result["graph_replays"] = {str(k): v for k, v in runner.graphs.stats.replays.items()}
        result["eager_steps"] = runner.graphs.stats.eager
    llm.close()
    del llm, runner
    gc.collect()
    if device.startswith("cuda"):
        torch.cuda.empty_cache()
    return result


def _active_weight_bytes(model: torch.nn.Module, total: int) -> int:
    """What one token's step reads: all of a dense model; of an MoE, the experts' share scaled to the active
    ones (config's num_experts_per_tok of num_experts)."""
    config = getattr(model, "config", None)
    experts, active = getattr(config, "num_experts", 0) or 0, getattr(config, "num_experts_per_tok", 0) or 0
    if not experts:
        return total
    expert_bytes = sum(p.numel() * p.element_size() for n, p in model.named_parameters() if "expert" in n
                       and "shared" not in n)
    return total - expert_bytes + expert_bytes * active // experts


def transformers_peer(directory: Path, device: str, output_len: int, vocab: int, batch: int) -> dict:
    import transformers

    model = transformers.AutoModelForCausalLM.from_pretrained(directory, dtype=torch.bfloat16).to(device)
    model.eval()
    kwargs = dict(max_new_tokens=output_len, min_new_tokens=output_len, do_sample=False, pad_token_id=0)
    one = torch.tensor(_prompts(1, vocab), device=device)
    with torch.no_grad():
        model.generate(one, **{**kwargs, "max_new_tokens": 4, "min_new_tokens": 4})  # warm-up
        _sync(device)
        start = time.perf_counter()
        first = model.generate(one, **kwargs)
        _sync(device)
        single = output_len / (time.perf_counter() - start)
        many = torch.tensor(_prompts(batch, vocab), device=device)
        start = time.perf_counter()
        model.generate(many, attention_mask=torch.ones_like(many), **kwargs)
        _sync(device)
        batched = batch * output_len / (time.perf_counter() - start)
    tokens = first[0, PROMPT_LEN:].tolist()
    del model
    gc.collect()
    if device.startswith("cuda"):
        torch.cuda.empty_cache()
    return {"batch1_tok_s": single, f"batch{batch}_tok_s": batched, "batch1_tokens": tokens}


def run(models: list[str], device: str, output_len: int, batch: int) -> dict:
    results = {"device": torch.cuda.get_device_name(device) if device.startswith("cuda") else "cpu",
               "copy_bandwidth_bytes_s": copy_bandwidth(device), "output_len": output_len, "prompt_len": PROMPT_LEN,
               "batch": batch, "models": {}}
    for name in models:
        with tempfile.TemporaryDirectory() as tmp:
            directory = build(name, Path(tmp) / name, device)
            vocab = SHAPES[name][1]["vocab_size"]
            mine = ours(directory, device, output_len, vocab, batch)
            peer = transformers_peer(directory, device, output_len, vocab, batch)
        bound = mine["active_weight_bytes_a_token"] / results["copy_bandwidth_bytes_s"]
        agree = next((i for i, (a, b) in enumerate(zip(mine.pop("batch1_tokens"), peer.pop("batch1_tokens")))
                      if a != b), output_len)
        results["models"][name] = {"actorserve": mine, "transformers": peer, "batch1_bound_s": bound,
                                   "batch1_step_over_bound": mine["batch1_step_s"] / bound,
                                   "batch1_vs_transformers": mine["batch1_tok_s"] / peer["batch1_tok_s"],
                                   f"batch{batch}_vs_transformers": mine[f"batch{batch}_tok_s"] /
                                   peer[f"batch{batch}_tok_s"],
                                   "greedy_tokens_equal_before_first_difference": agree}
    return results


def summary(results: dict) -> str:
    lines = [f"device: {results['device']}; copy bandwidth {results['copy_bandwidth_bytes_s'] / 1e9:.0f} GB/s"]
    b = results["batch"]
    for name, r in results["models"].items():
        m, p = r["actorserve"], r["transformers"]
        lines.append(f"{name} ({m['attention_backend']}, graphs {'on' if m['cuda_graphs'] else 'off'}): "
                     f"batch 1 {m['batch1_tok_s']:.1f} tok/s, step {m['batch1_step_s'] * 1e3:.3f} ms against a "
                     f"bound of {r['batch1_bound_s'] * 1e3:.3f} ms ({r['batch1_step_over_bound']:.2f}x); "
                     f"batch {b} {m[f'batch{b}_tok_s']:.0f} tok/s; transformers {p['batch1_tok_s']:.1f} / "
                     f"{p[f'batch{b}_tok_s']:.0f} tok/s: {r['batch1_vs_transformers']:.2f}x / "
                     f"{r[f'batch{b}_vs_transformers']:.2f}x; greedy equal for "
                     f"{r['greedy_tokens_equal_before_first_difference']} tokens")
    return "\n".join(lines)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--models", nargs="+", default=["llama-3.2-1b", "qwen3-moe"], choices=sorted(SHAPES))
    ap.add_argument("--output-len", type=int, default=128)
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--json", help="write the figures here")
    args = ap.parse_args(argv)
    results = run(args.models, args.device, args.output_len, args.batch)
    print(summary(results))
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
