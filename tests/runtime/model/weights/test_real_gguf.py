"""Real GGUF files as llama.cpp writes them (actorserve.benchmarks.real_files): the default SmolLM2 Q4_1, a
Gemma 3 270M Q4_K_M shipped on PyPI, and, where llama-cpp-python is installed, the default model
requantized by llama.cpp's own quantizer to the presets that hold the remaining block types.

- Every quantized tensor of every file decodes, in the loader and in the kernels that keep it as stored,
  to gguf-py's bits.
- Greedy generation on each file picks at every step a token that transformers, on the same file in fp32
  (its own GGUF loader and dequantizer), ranks first, or within a stated bound of its first. The shipped
  files in each setting (the exact default, gguf_q8, bfloat16), the requantized ones in the two that
  compute with their blocks as stored (bfloat16 dequantizes at load, which the decode test covers). The
  bounds, in logits: 1e-3 for the exact setting (the order of the sums; measured 0 over 4 prompts x 32
  tokens on every file), 0.5 for bfloat16 (measured at most 0.27), 1.5 for gguf_q8 (measured at most
  0.39, and 1.15 on the default model requantized to Q2_K, whose 2-bit logits move most under the
  activations' rounding; the products themselves are exact for the rounded activations,
  tests/kernels/gemm/test_gguf_q8.py).
"""
from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest
import torch

from actorserve.benchmarks import real_files
from actorserve.kernels.gemm import gguf
from actorserve.runtime.model.weights.gguf_dequant import dequantize, dequantize_ref
from actorserve.runtime.model.weights.gguf_file import GGUFFile
from actorserve.runtime.model.weights.gguf_weights import SUPPORTED_TYPES

BLOCK_SAMPLES = Path(__file__).resolve().parents[3] / "data" / "llama_cpp_blocks.gguf"
FILES = [(name, None) for name in real_files.REAL_FILES] + [(real_files.DEFAULT, p) for p in real_files.PRESETS]
GREEDY = [(case, s) for case in FILES for s in ("gguf", "gguf_q8", "bfloat16") if case[1] is None or s != "bfloat16"]
PROMPTS = ["The capital of France is", "def fibonacci(n):", "Once upon a time, in a small village,",
           "The three primary colours are"]
TOKENS = 12
# the largest gap allowed between transformers' best logit and the logit of the token we chose, by setting
GAP = {"gguf": 1e-3, "gguf_q8": 1.5, "bfloat16": 0.5}
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


@pytest.mark.skipif(not gguf.available(), reason="no C kernels here: the loader's decoder is gguf-py's own")
def test_every_tensor_decodes_to_gguf_pys_bits(real):
    _decodes_to_gguf_pys_bits(GGUFFile(str(real)))


@pytest.mark.skipif(not gguf.available(), reason="no C kernels here: the loader's decoder is gguf-py's own")
def test_rows_llama_cpp_wrote_in_every_other_type_decode_to_gguf_pys_bits():
    """scripts/make_llama_cpp_blocks.py's sample of the requantized files (tests/data), for a suite without
    llama-cpp-python: the block types the shipped files lack, as llama.cpp's quantizer wrote them."""
    reader = GGUFFile(str(BLOCK_SAMPLES))
    assert {t.type_name for t in reader.tensors} >= {"Q4_0", "Q5_1", "IQ4_NL", "IQ4_XS", "Q2_K", "Q3_K", "Q5_K"}
    _decodes_to_gguf_pys_bits(reader)


def _decodes_to_gguf_pys_bits(reader: GGUFFile) -> None:
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
    this engine does not serve) is in one of the shipped files or the sample of the requantized ones, so
    the tests above decode every type as llama.cpp writes it."""
    held = {t.type_name for t in GGUFFile(str(BLOCK_SAMPLES)).tensors}
    for name in real_files.REAL_FILES:
        held |= {t.type_name for t in GGUFFile(str(_path(name, None))).tensors}
    assert set(SUPPORTED_TYPES) - {"MXFP4", "F16", "BF16"} <= held


class _References:
    """transformers on one file at a time, in fp32, through its own GGUF loader (a load is most of a test's
    time, so the last one is kept for the next test of the same file)."""

    def __init__(self) -> None:
        self.path, self.model = None, None

    def get(self, path):
        if path != self.path:
            from transformers import AutoModelForCausalLM

            self.model = None
            self.model = AutoModelForCausalLM.from_pretrained(str(path.parent), gguf_file=path.name,
                                                              dtype=torch.float32).eval()
            self.path = path
        return self.model


@pytest.fixture(scope="module")
def references():
    pytest.importorskip("accelerate", reason="transformers' GGUF loader needs accelerate (the test extra)")
    return _References()


@pytest.mark.time_limit(900)
@pytest.mark.parametrize("case, setting", GREEDY, ids=[f"{_id(c)}-{s}" for c, s in GREEDY])
def test_greedy_picks_transformers_best_token(case, setting, references):
    from actorserve import LLM, SamplingParams
    from actorserve.runtime.model.weights.quantization import METHODS

    if case[1] is not None and os.environ.get("ACTORSERVE_CPU_ISA"):
        pytest.skip("the requantized files generate in the native pass; under a lesser ISA their every tensor's "
                    "decode is checked here, and every type's products in tests/kernels/gemm")
    why = METHODS[setting].check("float32", "cpu", True) if setting == "gguf_q8" else None
    if why is not None:  # (the default, "gguf", is the dense fp32 product where the kernels do not run)
        pytest.skip(f"{setting} does not run here: {why}")
    real = _path(*case)
    reference = references.get(real)
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
