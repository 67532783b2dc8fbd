"""Multi-head latent attention's compressed cache: one latent of kv_lora_rank + qk_rope_head_dim values a
token and layer, one tensor read as both K and V (what per-head keys and values would take is several times
that); the interleaved rotary gives transformers' complex products. Its logits against transformers' are in
test_decoder_vs_transformers.py, its decode through the capturable backend's static plan in
tests/kernels/attention/test_mla_triton.py."""
import torch

from actorserve.runtime.model.weights.hf_weights import read_config
from actorserve.runtime.model.weights.loader import load_model
from actorserve.runtime.model.architectures.mla import rotary_interleaved
from actorserve.runtime.model.execution.runner import ModelRunner, kv_bytes_per_block
from tests.conftest import save_tiny_model

SHAPE = dict(num_hidden_layers=3, num_key_value_heads=4, kv_lora_rank=48, q_lora_rank=None, qk_nope_head_dim=16,
             qk_rope_head_dim=16, v_head_dim=24, n_routed_experts=4, num_experts_per_tok=2,
             moe_intermediate_size=32, n_shared_experts=1, first_k_dense_replace=1)


def test_the_cache_holds_one_latent_a_token(tmp_path):
    directory = save_tiny_model("deepseek_v2", tmp_path / "ds", **SHAPE)
    cfg = read_config(str(directory))
    assert (cfg.mla, cfg.num_kv_heads, cfg.head_dim, cfg.kv_cache_tensors) == (True, 1, 48 + 16, 1)
    assert kv_bytes_per_block(cfg, 16, torch.float32) == 3 * 16 * (48 + 16) * 4
    per_head = 3 * 16 * 4 * ((16 + 16) + 24) * 4  # K of nope + rope and V of each of 4 heads, uncompressed
    assert per_head > 3 * kv_bytes_per_block(cfg, 16, torch.float32)
    model = load_model(str(directory), "float32", skip_tokenizer=True).model
    runner = ModelRunner(model, 8, 16, fast_decode=False)
    assert all(k.data_ptr() == v.data_ptr() and k.shape == (1, 8, 16, 64) for k, v in runner.kv_caches)


def test_the_interleaved_rotary_is_the_complex_product():
    from actorserve.runtime.model.architectures.layers import RotaryEmbedding, rope_inv_freq

    g = torch.Generator().manual_seed(0)
    x = torch.randn(5, 3, 16, generator=g)
    positions = torch.tensor([0, 1, 7, 30, 99])
    inv = rope_inv_freq(16, 10000.0, None)
    table = RotaryEmbedding(16, 128, inv).table(positions, torch.float32)
    freqs = torch.polar(torch.ones(5, 8), positions[:, None].float() * inv[None])
    expected = torch.view_as_real(torch.view_as_complex(x.reshape(5, 3, 8, 2)) * freqs[:, None]).flatten(2)
    torch.testing.assert_close(rotary_interleaved(x, table), expected, atol=1e-6, rtol=1e-6)
