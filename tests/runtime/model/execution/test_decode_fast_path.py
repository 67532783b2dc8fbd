"""The decode fast path computes the module path's hidden states bit for bit, serves decode-only steps
only, and is switched off by ``enforce_eager``."""
import pytest
import torch

from actorserve.kernels.attention import cpu_decode
from actorserve.kernels.elementwise import cpu_rows
from actorserve.kernels.gemm import GgufQ8Weight, GgufWeight, gguf, gguf_q8, int8
from actorserve.runtime.transport.messages import ScheduledChunk, SchedulerOutput
from actorserve.runtime.model.weights import loader
from actorserve.runtime.model.execution.decode_fast_path import DecodeFastPath
from actorserve.runtime.model.architectures.layers import Linear
from actorserve.runtime.model.execution.runner import ModelRunner
from tests.conftest import save_tiny_model

pytestmark = pytest.mark.skipif(not (cpu_rows.available() and cpu_decode.available()),
                                reason="needs a CPU with AVX2 and a C compiler")

# head_dim 32, the smallest the decode kernel takes
SHAPE = dict(hidden_size=128, intermediate_size=256, num_attention_heads=4, num_key_value_heads=2, num_hidden_layers=3)


def _model_dir(tmp_path, kind, **overrides):
    return save_tiny_model(kind, tmp_path / kind, seed=5, **{**SHAPE, **overrides})


def _runner(directory, quantization=None, pp_rank=0, pp_size=1, fast_decode=True, dtype="bfloat16", num_blocks=64):
    model = loader.load_model(None if directory is None else str(directory), dtype, skip_tokenizer=True,
                              max_positions=256, pp_rank=pp_rank, pp_size=pp_size, quantization=quantization).model
    return ModelRunner(model, num_blocks=num_blocks, block_size=16, fast_decode=fast_decode)


def _steps(prompt_lens, decode_steps, seed=0, vocab=384):
    """A prefill step of every prompt, then decode steps of all of them with made-up next tokens."""
    gen = torch.Generator().manual_seed(seed)
    tokens = [torch.randint(0, vocab, (n,), generator=gen).tolist() for n in prompt_lens]
    blocks = [list(range(8 * i, 8 * i + 8)) for i in range(len(prompt_lens))]
    chunks = [ScheduledChunk(f"r{i}", t, 0, b, True) for i, (t, b) in enumerate(zip(tokens, blocks))]
    yield SchedulerOutput(0, [], chunks, [])
    for s in range(decode_steps):
        nxt = torch.randint(0, vocab, (len(prompt_lens),), generator=gen).tolist()
        chunks = [ScheduledChunk(f"r{i}", [nxt[i]], prompt_lens[i] + s, blocks[i], True)
                  for i in range(len(prompt_lens))]
        yield SchedulerOutput(1 + s, [], chunks, [])


def _compare(runner, prompt_lens=(3, 17, 40), decode_steps=4, hidden_in_of=None):
    """Run the steps; at every decode step the fast path's output must equal the module path's."""
    assert runner.fast_decode is not None
    compared = 0
    for batch in _steps(prompt_lens, decode_steps, vocab=runner.model.cfg.vocab_size):
        inputs = runner.prepare_inputs(batch)
        hidden_in = None if hidden_in_of is None else hidden_in_of(inputs)
        with torch.inference_mode():
            eager = runner.model(inputs.input_ids, inputs.positions, runner.kv_caches, inputs.meta, runner.backend,
                                 hidden_in)
        if runner.fast_decode.applies(inputs.meta):
            fast = runner.fast_decode(inputs.input_ids, inputs.positions, runner.kv_caches, inputs.meta, hidden_in)
            assert fast.dtype == runner.model.dtype and torch.equal(fast, eager)
            compared += 1
    assert compared == decode_steps


@pytest.mark.parametrize("kind,overrides", [
    ("llama", dict(tie_word_embeddings=True)),
    ("qwen2", dict()),  # qkv bias
    ("qwen3", dict(head_dim=32)),  # q/k norms
])
@pytest.mark.parametrize("dtype", ["bfloat16", "float32"])
def test_fast_path_is_the_module_path(tmp_path, kind, overrides, dtype):
    if not cpu_decode.available(getattr(torch, dtype)):
        pytest.skip(f"no {dtype} build of the kernels here")
    runner = _runner(_model_dir(tmp_path, kind, **overrides), dtype=dtype)
    assert runner.fast_decode.kernels["product_rows"] == 4 * SHAPE["num_hidden_layers"]
    assert not any(name in runner.fast_decode.kernels for name in ("product_int8", "quantize_rows_bf16"))
    _compare(runner)


@pytest.mark.parametrize("kind,overrides", [("llama", dict(tie_word_embeddings=True)), ("qwen2", dict()),
                                            ("qwen3", dict(head_dim=32))])
def test_fast_path_is_the_module_path_with_int8_weights(tmp_path, kind, overrides):
    """All four products int8: each product's integers go through one pass to the next product's int8 rows
    (dequantize, residual add + RMSNorm, quantize), so no norm writes bf16 rows but the last."""
    runner = _runner(_model_dir(tmp_path, kind, **overrides), quantization="int8")
    if not int8.int_mm_available():
        pytest.skip("the int8 products run in int32 through torch here: the plan multiplies through the modules")
    layers, k = SHAPE["num_hidden_layers"], runner.fast_decode.kernels
    assert k["product_int8"] == 4 * layers and k["product_rows"] == 0
    assert k["dequant_add_norm_quantize_rows"] == 2 * layers - 1 and k["silu_mul_quantize_rows"] == layers
    assert k["add_rms_norm"] == 1 and k["rms_norm"] == 1  # the final norm, the first
    _compare(runner)


def _plain(linear):
    """A linear of an int8 model made plain bf16 again, with the values its int8 weight stands for."""
    w = linear.packed
    linear.weight = torch.nn.Parameter((w.q_t.t().float() * w.scale[:, None]).bfloat16(), requires_grad=False)
    linear.packed = None


@pytest.mark.parametrize("plain", [("o_proj", "down_proj"), ("qkv_proj", "gate_up_proj")])
def test_fast_path_is_the_module_path_with_mixed_weights(tmp_path, plain):
    """Int8 and bf16 products side by side: each value passes to the next product in the form it takes
    (dequantized, or quantized), as the module path passes it."""
    if not int8.int_mm_available():
        pytest.skip("needs torch._int_mm")
    runner = _runner(_model_dir(tmp_path, "qwen2"), quantization="int8")
    for layer in runner.model.model.layers.values():
        for name in plain:
            _plain(getattr(layer.self_attn if name in ("qkv_proj", "o_proj") else layer.mlp, name))
    runner.fast_decode = DecodeFastPath.build(runner.model, runner.backend)
    k, layers = runner.fast_decode.kernels, SHAPE["num_hidden_layers"]
    assert k["product_int8"] == 2 * layers and k["product_rows"] == 2 * layers
    assert k["quantize_rows_bf16"] == 2 * layers and k["dequant_add_norm_quantize_rows"] == 0
    _compare(runner)


@pytest.mark.parametrize("dtype", ["bfloat16", "float32"])
@pytest.mark.parametrize("pp_rank", [0, 1])
def test_pipeline_stages(tmp_path, pp_rank, dtype):
    """The first stage ends on the residual stream; the last takes hidden states and normalises."""
    runner = _runner(_model_dir(tmp_path, "llama"), pp_rank=pp_rank, pp_size=2, dtype=dtype)
    gen = torch.Generator().manual_seed(1)
    hidden_in = None if pp_rank == 0 else (
        lambda inputs: torch.randn(len(inputs.input_ids), 128, generator=gen).to(getattr(torch, dtype)))
    _compare(runner, hidden_in_of=hidden_in)


@pytest.mark.skipif(not (gguf.available() and cpu_decode.available(torch.float32)),
                    reason="needs the GGUF block kernels and the fp32 kernels")
def test_the_default_gguf_model_in_fp32(tmp_path):
    """The default model, its GGUF blocks held as stored (Q4_1 and Q8_0 segments, a tied Q8_0 head): every
    product of the plan is the blocks' own, written into the step's own buffers (none allocated per
    product), and the plan is the module path to the bit, alone and batched (past the rows the products
    take by pointer, too)."""
    from actorserve.runtime.model.execution.decode_fast_path import _FILLED

    runner = _runner(None, dtype="float32", num_blocks=80)
    layers, k = runner.model.cfg.num_layers, runner.fast_decode.kernels
    assert {type(m.packed) for m in runner.model.modules() if isinstance(m, Linear)} == {GgufWeight}
    assert k["product_rows"] == 4 * layers and k["attention"] == layers and k["silu_mul"] == layers
    assert _FILLED not in runner.fast_decode.planner.shapes
    _compare(runner, prompt_lens=(5,), decode_steps=3)
    _compare(runner, prompt_lens=(3, 17, 40, 2, 9, 11, 30, 4, 6, 8), decode_steps=2)  # past MAX_ROWS


@pytest.mark.skipif(not (gguf_q8.available() and cpu_decode.available(torch.float32)),
                    reason="needs the q8 products and the fp32 kernels")
def test_the_default_gguf_model_with_q8_products(tmp_path):
    """``gguf_q8``: every linear and the tied head repacked for the q8 products, which the plan calls by
    pointer for any row count; still the module path to the bit."""
    from actorserve.runtime.model.execution.decode_fast_path import _FILLED

    runner = _runner(None, dtype="float32", num_blocks=80, quantization="gguf_q8")
    model = runner.model
    assert {type(m.packed) for m in model.modules() if isinstance(m, Linear)} == {GgufQ8Weight}
    assert model._tied_head is model.model.embed_tokens.blocks and isinstance(model._tied_head, GgufQ8Weight)
    assert runner.fast_decode.kernels["product_rows"] == 4 * model.cfg.num_layers
    assert _FILLED not in runner.fast_decode.planner.shapes
    _compare(runner, prompt_lens=(5,), decode_steps=2)
    _compare(runner, prompt_lens=(3, 17, 40, 2, 9, 11, 30, 4, 6, 8), decode_steps=2)


def test_mixed_and_prefill_steps_take_the_module_path(tmp_path):
    runner = _runner(_model_dir(tmp_path, "llama"))
    steps = list(_steps((5, 9), 1))
    prefill = runner.prepare_inputs(steps[0])
    assert not runner.fast_decode.applies(prefill.meta)
    decode = steps[1]
    mixed = SchedulerOutput(2, [], list(decode.chunks) + [ScheduledChunk("r9", [1, 2, 3], 0, [40], True)], [])
    assert not runner.fast_decode.applies(runner.prepare_inputs(mixed).meta)
    assert runner.fast_decode.applies(runner.prepare_inputs(decode).meta)


def test_gates(tmp_path):
    directory = _model_dir(tmp_path, "llama")
    assert _runner(directory, fast_decode=False).fast_decode is None  # enforce_eager
    assert _runner(directory, fast_decode=False, dtype="float32").fast_decode is None
    fp16 = loader.load_model(str(directory), "float16", skip_tokenizer=True, max_positions=256).model
    assert ModelRunner(fp16, num_blocks=8, block_size=16).fast_decode is None  # no fp16 build of the kernels
    fp32 = loader.load_model(str(directory), "float32", skip_tokenizer=True, max_positions=256).model
    assert DecodeFastPath.build(fp32, object()) is None  # another attention backend


def test_engine_tokens_do_not_depend_on_the_path(tmp_path):
    """Greedy tokens of the engine with and without the fast path, through ``LLM(enforce_eager=...)``."""
    from actorserve import LLM, SamplingParams

    directory = _model_dir(tmp_path, "llama")
    prompts = [{"prompt_token_ids": list(range(1 + i, 9 + 3 * i))} for i in range(5)]
    params = SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True)
    outs = {}
    for eager in (False, True):
        llm = LLM(str(directory), dtype="bfloat16", skip_tokenizer_init=True, kv_cache_memory=16 << 20,
                  max_model_len=256, enforce_eager=eager)
        assert (llm.engine.executor.fast_decode is None) == eager
        outs[eager] = [o.outputs[0].token_ids for o in llm.generate(prompts, params, use_tqdm=False)]
    assert outs[False] == outs[True]


@pytest.mark.skipif(not cpu_decode.available(torch.float32, torch.bfloat16),
                    reason="no build of fp32 queries over a bf16 cache here")
def test_fast_path_over_a_bf16_cache(tmp_path):
    """--kv-cache-dtype bfloat16 under an fp32 model: the caches hold bf16, and the fast path writes and reads
    them as the module path does."""
    model = loader.load_model(str(_model_dir(tmp_path, "llama")), "float32", skip_tokenizer=True,
                              max_positions=256).model
    runner = ModelRunner(model, num_blocks=64, block_size=16, kv_cache_dtype=torch.bfloat16)
    assert all(c.dtype == torch.bfloat16 for kv in runner.kv_caches for c in kv)
    assert isinstance(runner.backend, cpu_decode.CpuDecodeBackend)
    _compare(runner)
