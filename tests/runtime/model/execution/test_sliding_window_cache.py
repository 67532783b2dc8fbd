"""A model whose every layer slides keeps only its window's blocks: four long generations fit in a KV
cache that holds two of them whole, without a preemption, and give the tokens they give in a cache with
room for everything. The same cache without the window preempts (so the first half could fail). Head size
16 takes the torch backend, 32 the C kernel where it runs."""
import pytest
import torch

from actorserve.runtime.resolve import engine_config
from actorserve.runtime.engine.sampling_params import SamplingParams
from actorserve.runtime.worker_assembly import build_engine
from tests.conftest import save_tiny_model



def _run(directory, blocks, head_dim=16):
    block_bytes = 2 * 2 * 2 * 16 * head_dim * 4  # K and V, 2 layers, 2 KV heads, 16 tokens, fp32
    config = engine_config(str(directory), skip_tokenizer_init=True, max_model_len=128,
                           kv_cache_memory=blocks * block_bytes, max_num_batched_tokens=64)
    engine, _ = build_engine(config)
    assert engine.kv.pool.num_blocks == blocks
    gen = torch.Generator().manual_seed(3)
    params = SamplingParams(temperature=0.0, max_tokens=90, ignore_eos=True)
    for i in range(4):
        engine.add_request(f"r{i}", torch.randint(0, 384, (30,), generator=gen).tolist(), params)
    out = {}
    while engine.has_unfinished_requests():
        for o in engine.step():
            out[o.request_id] = o.outputs[0].token_ids
    free = engine.kv.pool.num_free_blocks + (engine.kv.null_block is not None)
    return out, engine.scheduler.num_preemptions, free


@pytest.mark.parametrize("window, head_dim", [(12, 16), (20, 32)])
def test_four_long_generations_fit_where_two_would(tmp_path, window, head_dim):
    windowed = save_tiny_model("mistral", tmp_path / "w", seed=2, sliding_window=window, head_dim=head_dim)
    roomy, preempted, free = _run(windowed, 64, head_dim)
    assert preempted == 0 and free == 64
    tight, preempted, free = _run(windowed, 14, head_dim)  # 13 to hand out: two whole sequences need 16
    assert preempted == 0, "the window's blocks were not given back"
    assert free == 14  # and every block came back at the end
    assert tight == roomy and all(len(t) == 90 for t in tight.values())


def test_the_same_cache_without_a_window_preempts(tmp_path):
    plain = save_tiny_model("mistral", tmp_path / "p", seed=2, sliding_window=None)
    _, preempted, free = _run(plain, 14)
    assert preempted > 0 and free == 14
