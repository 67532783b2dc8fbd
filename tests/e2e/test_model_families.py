"""The OpenAI server serves every family of the registry: a tiny random model of each (the default model's
vocabulary, so that its tokenizer serves it), through the official client, chat and completions, streamed
and not."""
import openai
import pytest

from actorserve.runtime.model.architectures import registry
from actorserve.runtime.model_files import resolve_model_path
from tests.conftest import save_tiny_model
from tests.e2e.server import API_KEY, Server

VOCAB = 49152  # SmolLM2's tokenizer
SHAPES = {
    "qwen3_moe": dict(num_experts=4, num_experts_per_tok=2, moe_intermediate_size=32, decoder_sparse_step=1,
                      mlp_only_layers=[]),
    "qwen2_moe": dict(num_experts=4, num_experts_per_tok=2, moe_intermediate_size=32,
                      shared_expert_intermediate_size=48, decoder_sparse_step=1, mlp_only_layers=[]),
    "mixtral": dict(num_local_experts=4, num_experts_per_tok=2, sliding_window=None),
    "mistral": dict(sliding_window=8),  # windows shorter than the chat prompt
    "gemma2": dict(sliding_window=8, head_dim=32),
    "gemma3": dict(sliding_window=8, head_dim=32),
    "olmoe": dict(num_experts=4, num_experts_per_tok=2),
    "qwen3_next": dict(num_hidden_layers=4, head_dim=32, linear_num_key_heads=2, linear_num_value_heads=4,
                       linear_key_head_dim=16, linear_value_head_dim=8, num_experts=4, num_experts_per_tok=2,
                       moe_intermediate_size=32, shared_expert_intermediate_size=48),
    "deepseek_v2": dict(num_key_value_heads=4, kv_lora_rank=48, q_lora_rank=None, qk_nope_head_dim=16,
                        qk_rope_head_dim=16, v_head_dim=24, n_routed_experts=4, num_experts_per_tok=2,
                        moe_intermediate_size=32, n_shared_experts=1, first_k_dense_replace=1),
}


@pytest.mark.parametrize("family", [f.name for f in registry.FAMILIES])
def test_the_server_serves_the_family(family, tmp_path):
    directory = save_tiny_model(family, tmp_path / family, vocab_size=VOCAB, tie_word_embeddings=True,
                                **SHAPES.get(family, {}))
    server = Server("--model", str(directory), "--tokenizer", resolve_model_path(None), "--served-model-name", family)
    try:
        client = openai.OpenAI(base_url=server.base_url + "/v1", api_key=API_KEY, max_retries=0)
        chat = client.chat.completions.create(model=family, messages=[{"role": "user", "content": "Hello"}],
                                              max_tokens=6, temperature=0, extra_body={"ignore_eos": True})
        assert chat.choices[0].finish_reason == "length" and chat.usage.completion_tokens == 6
        assert isinstance(chat.choices[0].message.content, str)
        stream = client.completions.create(model=family, prompt="Once upon a time", max_tokens=5, temperature=0.7,
                                           seed=1, stream=True, extra_body={"ignore_eos": True})
        pieces = [c.choices[0].text for c in stream if c.choices]
        assert len(pieces) >= 1 and all(isinstance(p, str) for p in pieces)
    finally:
        assert server.stop() == 0
