"""Decode rate of each family of the model registry against transformers', in one run: single stream,
fp32, greedy, a 32-token prompt and 64 new tokens, on the family's tiny random model and on a mid-size
random config (about 150-500M parameters: 12 layers of 1024, 32k vocabulary; MoE families with 8 experts of
half the dense width, 2 active; Mistral and Gemma with 16-token sliding windows, so that they slide). Both engines produce the same tokens (checked on the tiny
models; on the mid-size ones fp32 sums may tip a near-tie, so only the rates are compared there).

    .venv/bin/python bench/families.py [--families llama qwen3_moe ...] [--new-tokens 64] [--no-mid]
"""
from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from tests.conftest import save_tiny_model  # noqa: E402  (the tests' own tiny-model recipe)

from actorserve import LLM, SamplingParams  # noqa: E402
from actorserve.runtime.model.architectures import registry  # noqa: E402

# each family's own settings, given the config's intermediate size s and head size d: MoE families with 8
# experts of half the dense width, 2 active; sliding windows (16 tokens) shorter than a request
SHAPES = {
       "qwen3_moe": lambda s, d: dict(num_experts=8, num_experts_per_tok=2, moe_intermediate_size=s // 2,
                                   decoder_sparse_step=1, mlp_only_layers=[]),
       "qwen2_moe": lambda s, d: dict(num_experts=8, num_experts_per_tok=2, moe_intermediate_size=s // 2,
                                   shared_expert_intermediate_size=s, decoder_sparse_step=1, mlp_only_layers=[]),
       "mixtral": lambda s, d: dict(num_local_experts=8, num_experts_per_tok=2, intermediate_size=s // 2,
                                    sliding_window=None),
       "mistral": lambda s, d: dict(sliding_window=16),
       "gemma2": lambda s, d: dict(head_dim=d, query_pre_attn_scalar=d, sliding_window=16),
       "gemma3": lambda s, d: dict(head_dim=d, query_pre_attn_scalar=d, sliding_window=16),
       "olmoe": lambda s, d: dict(num_experts=8, num_experts_per_tok=2, intermediate_size=s // 2),
       # three gated delta nets in four layers, each with half the query heads' count of key heads
       "qwen3_next": lambda s, d: dict(head_dim=d, linear_num_key_heads=2 if d == 16 else 8,
                                       **({"num_hidden_layers": 4} if d == 16 else {}),
                                       linear_num_value_heads=4 if d == 16 else 16, linear_key_head_dim=d,
                                       linear_value_head_dim=d, num_experts=8, num_experts_per_tok=2,
                                       moe_intermediate_size=s // 2, shared_expert_intermediate_size=s),
       # latent attention (rank 4 head sizes, a rotary key of a quarter head), a dense first layer, then
       # 8 routed experts (2 active) and one shared
       "deepseek_v2": lambda s, d: dict(num_key_value_heads=None, kv_lora_rank=4 * d, q_lora_rank=None,
                                        qk_nope_head_dim=d, qk_rope_head_dim=d // 4, v_head_dim=d,
                                        n_routed_experts=8, num_experts_per_tok=2, moe_intermediate_size=s // 2,
                                        n_shared_experts=1, first_k_dense_replace=1)}
MID = dict(vocab_size=32000, hidden_size=1024, intermediate_size=2816, num_hidden_layers=12, num_attention_heads=16,
           num_key_value_heads=4, max_position_embeddings=1024)


def rate_ours(directory: Path, prompt: list[int], new: int) -> tuple[float, list[int]]:
    llm = LLM(str(directory), skip_tokenizer_init=True, dtype="float32", kv_cache_memory=256 << 20,
              max_model_len=512, disable_log_stats=True, max_num_seqs=8)  # (a hybrid model: 8 state slots)
    params = SamplingParams(temperature=0, max_tokens=new, ignore_eos=True)
    llm.generate({"prompt_token_ids": prompt}, SamplingParams(max_tokens=4, ignore_eos=True), use_tqdm=False)
    out = llm.generate({"prompt_token_ids": prompt}, params, use_tqdm=False)[0]
    return (new - 1) / out.metrics.decode_time, out.outputs[0].token_ids


def rate_hf(directory: Path, prompt: list[int], new: int) -> tuple[float, list[int]]:
    import transformers

    model = transformers.AutoModelForCausalLM.from_pretrained(directory, dtype=torch.float32).eval()
    ids = torch.tensor([prompt])
    with torch.inference_mode():
        model.generate(ids, max_new_tokens=4, min_new_tokens=4, do_sample=False)
        start = time.perf_counter()
        first = model.generate(ids, max_new_tokens=1, do_sample=False)
        prefill = time.perf_counter() - start
        start = time.perf_counter()
        out = model.generate(ids, max_new_tokens=new, min_new_tokens=new, do_sample=False)
        total = time.perf_counter() - start
    del first
    return (new - 1) / max(total - prefill, 1e-9), out[0, len(prompt):].tolist()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--families", nargs="*", default=list(registry.NAMES))
    ap.add_argument("--new-tokens", type=int, default=64)
    ap.add_argument("--no-mid", action="store_true")
    args = ap.parse_args()
    torch.manual_seed(0)
    root = Path(tempfile.mkdtemp(prefix="families-"))
    print(f"{'family':10} {'size':5} {'params':>8} {'transformers tok/s':>19} {'actorserve tok/s':>17} {'ratio':>6}")
    for family in args.families:
        for size in ("tiny",) + (() if args.no_mid else ("mid",)):
            shape = dict(tie_word_embeddings=True, **(MID if size == "mid" else {}))
            mid = size == "mid"
            shape.update(SHAPES.get(family, lambda s, d: {})(MID["intermediate_size"] if mid else 128,
                                                               MID["hidden_size"] // 16 if mid else 16))
            directory = save_tiny_model(family, root / f"{family}-{size}", seed=1, **shape)
            vocab = shape.get("vocab_size", 384)
            prompt = torch.randint(0, vocab, (32,), generator=torch.Generator().manual_seed(2)).tolist()
            ours, ours_ids = rate_ours(directory, prompt, args.new_tokens)
            theirs, their_ids = rate_hf(directory, prompt, args.new_tokens)
            if size == "tiny":
                assert ours_ids == their_ids, f"{family}: greedy tokens differ from transformers'"
            import transformers
            params = sum(p.numel() for p in transformers.AutoModelForCausalLM.from_pretrained(directory).parameters())
            print(f"{family:10} {size:5} {params / 1e6:7.1f}M {theirs:19.1f} {ours:17.1f} {ours / theirs:5.2f}x",
                  flush=True)


if __name__ == "__main__":
    main()
