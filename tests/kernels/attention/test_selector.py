"""The attention backend selector, table-driven: for each model and machine (what is installed, whether
the C kernels run), the backend it picks, or why a forced one cannot serve. The machine is faked by
replacing each backend's own availability gate; the declarations and the priority are the real ones."""
import dataclasses

import pytest
import torch

from actorserve.kernels.attention import selector
from actorserve.kernels.attention.selector import AttentionBackendError, AttentionNeeds, choose


@pytest.fixture
def machine(monkeypatch):
    def make(c_kernels=True, triton=True, flashinfer=True, interpreter=False):
        gates = {"cpu_c": lambda n: None if c_kernels else "off",
                 "triton": lambda n: (None if triton and (n.device == "cuda" or interpreter) else "no triton"),
                 "flashinfer": lambda n: None if flashinfer else "flashinfer-python is not installed",
                 "torch": lambda n: None}
        patched = {name: dataclasses.replace(entry, available=gates[name]) for name, entry in selector.BACKENDS.items()}
        monkeypatch.setattr(selector, "BACKENDS", patched)
    return make


def needs(device="cpu", dtype=torch.bfloat16, heads=8, kv_heads=2, head_dim=64, block_size=16, window=None,
          capture=False, kv_dtype=None):
    return AttentionNeeds(device, dtype, heads, kv_heads, head_dim, block_size, window, capture, kv_dtype)


@pytest.mark.parametrize("case, machine_kw, expected", [
    (needs(dtype=torch.float32), {}, "cpu_c"),
    (needs(), {}, "cpu_c"),
    (needs(), {"c_kernels": False}, "torch"),
    (needs(dtype=torch.float16), {}, "torch"),  # the C kernels take bf16 and fp32
    (needs(head_dim=80), {}, "torch"),  # ... head sizes that are multiples of 32
    (needs(heads=32, kv_heads=1), {}, "torch"),  # ... up to 16 query heads a KV head
    (needs(block_size=7), {}, "cpu_c"),  # any block size
    (needs(device="cuda", head_dim=128), {}, "flashinfer"),
    (needs(device="cuda", head_dim=96), {}, "triton"),  # FlashInfer: 64, 128, 256
    (needs(device="cuda", dtype=torch.float32), {}, "triton"),  # FlashInfer: fp16, bf16
    (needs(device="cuda", block_size=12), {}, "torch"),  # triton: powers of two; FlashInfer: 16, 32, 64
    (needs(device="cuda"), {"flashinfer": False}, "triton"),
    (needs(device="cuda"), {"flashinfer": False, "triton": False}, "torch"),
    (needs(device="cuda", capture=True), {}, "triton"),  # graphs capture triton, not (yet) FlashInfer
    (needs(device="cuda", window=4096), {}, "flashinfer"),  # every backend honours a sliding window
    (needs(device="cuda", window=4096), {"flashinfer": False}, "triton"),
    (needs(window=4096), {}, "cpu_c"),
    (needs(window=4096), {"c_kernels": False}, "torch"),
    (needs(dtype=torch.float32, kv_dtype=torch.bfloat16), {}, "cpu_c"),  # --kv-cache-dtype bfloat16
    (needs(dtype=torch.float32, kv_dtype=torch.bfloat16), {"c_kernels": False}, "torch"),
    (needs(kv_dtype=torch.bfloat16), {}, "cpu_c"),  # a bf16 model's own cache
    (needs(device="cuda", dtype=torch.float32, kv_dtype=torch.bfloat16), {}, "triton"),
    (needs(device="cuda", dtype=torch.float16, kv_dtype=torch.bfloat16, head_dim=128), {}, AttentionBackendError),
    (needs(device="xla"), {}, AttentionBackendError),  # no backend runs there
    (needs(), {"c_kernels": False, "interpreter": True}, "torch"),  # triton serves the CPU only when forced
])
def test_the_selector_picks(machine, case, machine_kw, expected):
    machine(**machine_kw)
    if expected is AttentionBackendError:
        with pytest.raises(AttentionBackendError, match="no attention backend"):
            choose(case)
    else:
        assert choose(case) == expected


@pytest.mark.parametrize("case, forced, machine_kw, why", [
    (needs(), "torch", {}, None),
    (needs(), "triton", {"interpreter": True}, None),
    (needs(device="cuda"), "cpu_c", {}, "runs on cpu, not cuda"),
    (needs(), "triton", {}, "no triton"),
    (needs(dtype=torch.float16), "cpu_c", {}, "takes bfloat16, float32, not float16"),
    (needs(device="cuda", head_dim=96), "flashinfer", {}, "head size of 96"),
    (needs(device="cuda", capture=True), "flashinfer", {}, "CUDA graphs cannot capture it"),
    (needs(device="cuda", dtype=torch.float16, kv_dtype=torch.bfloat16, head_dim=128), "flashinfer", {},
     "keeps a float16 model's K and V in float16, not bfloat16"),
    (needs(dtype=torch.bfloat16, kv_dtype=torch.float32), "cpu_c", {}, "in bfloat16, not float32"),
    (needs(), "xformers", {}, "unknown attention backend 'xformers'; known: flashinfer, triton, cpu_c, torch"),
])
def test_a_forced_backend_serves_or_says_why_not(machine, case, forced, machine_kw, why):
    machine(**machine_kw)
    if why is None:
        assert choose(case, forced) == forced
    else:
        with pytest.raises(AttentionBackendError, match=why):
            choose(case, forced)


def test_the_real_gates_on_this_machine():
    """Without patches: a CPU model takes the C kernels where they run, else torch; triton is refused
    on the CPU outside its interpreter, and CUDA where torch sees none."""
    from actorserve.kernels.attention import cpu_decode

    cpu_c = selector.BACKENDS["cpu_c"]  # the declaration is the C source's
    assert cpu_c.max_group == cpu_decode.MAX_GROUP
    assert cpu_c.head_size(cpu_decode.MAX_HEAD_DIM) and not cpu_c.head_size(cpu_decode.MAX_HEAD_DIM + 32)
    expected = "cpu_c" if cpu_decode.available(torch.float32) else "torch"
    assert choose(needs(dtype=torch.float32)) == expected
    assert selector.select(needs(dtype=torch.float32)).__name__ == {"cpu_c": "CpuDecodeBackend",
                                                                    "torch": "TorchRefBackend"}[expected]
    if not torch.cuda.is_available():  # (the device config refuses cuda itself before any backend is chosen)
        assert choose(needs(device="cuda", dtype=torch.float32, head_dim=100, block_size=12, window=8)) == "torch"
        for name in ("flashinfer", "triton"):
            assert selector.BACKENDS[name].refusal(needs(device="cuda")) is not None


@pytest.mark.parametrize("jit_cache, nvcc, refused", [(True, None, False), (False, "/usr/local/cuda/bin/nvcc", False),
                                                      (False, None, True)],
                         ids=["prebuilt", "nvcc-builds-them", "driver-only-host"])
def test_flashinfer_is_passed_over_where_its_kernels_can_be_neither_loaded_nor_built(monkeypatch, jit_cache, nvcc,
                                                                                     refused):
    """FlashInfer builds its kernels with nvcc at first use unless flashinfer-jit-cache holds them: on a
    driver-only host the first attention call would raise, so the selector takes triton there."""
    real_find_spec = selector.importlib.util.find_spec
    present = {"flashinfer": True, "flashinfer_jit_cache": jit_cache, "triton": True}
    monkeypatch.setattr(selector.importlib.util, "find_spec",
                        lambda name, *a: object() if present.get(name) else
                        (None if name in present else real_find_spec(name, *a)))
    monkeypatch.setattr(selector, "nvcc_path", lambda: nvcc)
    monkeypatch.setattr(selector, "_cuda", lambda: True)
    case = needs(device="cuda", head_dim=128)
    why = selector.BACKENDS["flashinfer"].refusal(case)
    if refused:
        assert "flashinfer-jit-cache" in why and "nvcc" in why
        assert choose(case) == "triton"
        with pytest.raises(AttentionBackendError, match="neither prebuilt"):
            choose(case, forced="flashinfer")
    else:
        assert why is None and choose(case) == "flashinfer"


def test_nvcc_is_found_under_cuda_home(monkeypatch, tmp_path):
    (tmp_path / "bin").mkdir()
    (tmp_path / "bin" / "nvcc").write_text("")
    monkeypatch.setenv("CUDA_HOME", str(tmp_path))
    assert selector.nvcc_path() == str(tmp_path / "bin" / "nvcc")
