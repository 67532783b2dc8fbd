"""Real GGUF files as llama.cpp writes them (actorserve.benchmarks.real_files): the default SmolLM2 Q4_1, a
Gemma 3 270M Q4_K_M shipped on PyPI, and, where llama-cpp-python is installed, the default model
requantized by llama.cpp's own quantizer to the presets that hold the remaining block types.

- Every quantized tensor of every file decodes, in the loader and in the kernels that keep it as stored,
  to gguf-py's bits.
- Greedy generation on each file, in each setting (the exact default, gguf_q8, bfloat16), picks at every
  step a token that transformers, on the same file in fp32 (its own GGUF loader and dequantizer), ranks
  first, or within a stated bound of its first: 1e-3 for the exact setting (the order of the sums), and
  for the approximate ones the bound measured here with margin.
"""
from __future__ import annotations

import numpy as np
import pytest
import torch

from actorserve.benchmarks import real_files
from actorserve.kernels.gemm import gguf
from actorserve.runtime.model.gguf_dequant import dequantize, dequantize_ref
from actorserve.runtime.model.gguf_file import GGUFFile
from actorserve.runtime.model.gguf_weights import SUPPORTED_TYPES

FILES = [(name, None) for name in real_files.REAL_FILES] + [(real_files.DEFAULT, p) for p in real_files.PRESETS]
PROMPTS = ["The capital of France is", "def fibonacci(n):", "Once upon a time, in a small village,",
           "The three primary colours are"]
TOKENS = 12
# the largest gap allowed between transformers' best logit and the logit of the token we chose, by setting
GAP = {"gguf": 1e-3, "gguf_q8": 0.6, "bfloat16": 0.5}
SETTINGS = {"gguf": {}, "gguf_q8": {"quantization": "gguf_q8"}, "bfloat16": {"dtype": "bfloat16"}}


def _path(name: str, preset):
    try:
        return real_files.real_file(name) if preset is None else real_files.requantized(name, preset)
    except real_files.Unavailable as e:
        pytest.skip(str(e))


def _id(case) -> str:
    return case[0] if case[1] is None else f"{case[0]}.{case[1]}"


@pytest.fixture(scope="module", params=FILES, ids=_id)
def real(request):
    return _path(*request.param)


def test_every_tensor_decodes_to_gguf_pys_bits(real):
    reader = GGUFFile(str(real))
    for t in reader.tensors:
        if t.type_name in ("F32", "F16", "BF16"):
            continue
        data = reader.tensor_data(t)
        ref = dequantize_ref(data, t.type_name, t.dims)
        assert torch.equal(dequantize(data, t.type_name, t.dims), ref), (t.name, t.type_name)
        if len(t.dims) == 2 and gguf.keeps(t.type_name, t.dims):  # the product's decode, and a lookup's
            w = gguf.GgufWeight([gguf.Segment(t.type_name, torch.from_numpy(np.array(data).reshape(t.dims[0], -1)),
                                              0, t.dims[0])], t.dims[1])
            ids = torch.tensor([0, t.dims[0] - 1, t.dims[0] // 2])
            assert torch.equal(w.rows(ids), ref[ids]), (t.name, t.type_name)


def test_the_real_files_hold_every_block_type_of_the_presets():
    """Each supported block type (MXFP4 aside: llama.cpp writes it for the experts of gpt-oss, a family
    this engine does not serve) is in one of the real files, so the test above decodes every type."""
    held = set()
    for case in FILES:
        held |= {t.type_name for t in GGUFFile(str(_path(*case))).tensors}
    assert set(SUPPORTED_TYPES) - {"MXFP4", "F16", "BF16"} <= held


@pytest.fixture(scope="module")
def reference(real):
    """transformers on the same file, in fp32, through its own GGUF loader."""
    pytest.importorskip("accelerate", reason="transformers' GGUF loader needs accelerate (the test extra)")
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(str(real.parent), gguf_file=real.name, dtype=torch.float32).eval()


@pytest.mark.time_limit(900)
@pytest.mark.parametrize("setting", sorted(SETTINGS))
def test_greedy_picks_transformers_best_token(real, reference, setting):
    from actorserve import LLM, SamplingParams

    llm = LLM(str(real), kv_cache_memory=64 << 20, max_model_len=512, **SETTINGS[setting])
    try:
        tok = llm.get_tokenizer()
        prompts = [tok.encode(p) for p in PROMPTS]
        outs = llm.generate([{"prompt_token_ids": p} for p in prompts],
                            SamplingParams(temperature=0, max_tokens=TOKENS, ignore_eos=True), use_tqdm=False)
    finally:
        llm.close()
    for prompt, out in zip(prompts, outs):
        ours = list(out.outputs[0].token_ids)
        with torch.no_grad():
            logits = reference(torch.tensor([prompt + ours])).logits[0, len(prompt) - 1:-1]
        gaps = logits.max(-1).values - logits[torch.arange(len(ours)), torch.tensor(ours)]
        assert float(gaps.max()) <= GAP[setting], (setting, tok.decode(prompt), gaps.tolist())
