"""Every triton kernel compiled for sm_80 and sm_90, bf16 and fp16, at real models' shapes, through its own
host wrapper, on this machine without a GPU (``kernels.compile_check``): none fails to compile,
none spills, none is over the register budget. In processes of their own: the kernels must be imported
with TRITON_INTERPRET off, which tests/kernels/conftest.py turns on."""
import json
import os
import subprocess
import sys

import pytest

pytest.importorskip("triton")
pytestmark = pytest.mark.triton  # a triton form: make test-isa leaves these to the first pass

ENTRY_KERNELS = {"_grouped_gemm_kernel", "_recurrent_step_kernel", "_recurrent_varlen_kernel", "_rotary_kv_kernel",
                 "_unified_attention_kernel", "_rms_norm_kernel", "_silu_mul_kernel", "_sample_kernel"}


def _compiled_env() -> dict:
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env.setdefault("TRITON_DEFAULT_FP_FUSION", "1")  # (triton's default; said, so that it does not warn)
    return env


def _run(code_or_args: list[str], timeout: float) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, *code_or_args], env=_compiled_env(),
                          capture_output=True, text=True, timeout=timeout)


@pytest.mark.time_limit(420)
def test_every_kernel_compiles_for_sm80_and_sm90_within_the_register_budget(tmp_path):
    check = [sys.executable, "-m", "actorserve.kernels.compile_check"]
    runs = {arch: subprocess.Popen([*check, "--arch", str(arch), "--json", str(tmp_path / f"sm{arch}.json")],
                                   env=_compiled_env(),
                                   stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
            for arch in (80, 90)}  # (one process an arch: two cores compile at once)
    reports = []
    for arch, run in runs.items():
        out, err = run.communicate(timeout=400)
        assert run.returncode == 0, out[-6000:] + err[-4000:]
        reports += json.loads((tmp_path / f"sm{arch}.json").read_text())
    assert not [r for r in reports if r["fault"]]
    for arch in (80, 90):
        for dtype in ("bfloat16", "float16"):
            compiled = {r["kernel"] for r in reports if r["arch"] == arch and r["dtype"] == dtype}
            assert compiled == ENTRY_KERNELS, (arch, dtype)
    # the models' attention shapes each got their own compile: groups of 2, 4, 7 (as 8) and 8, head sizes 128/256
    attention = {r["constants"] for r in reports if r["kernel"] == "_unified_attention_kernel"}
    for needle in ("BLOCK_G=2", "BLOCK_G=4", "BLOCK_G=8", "BLOCK_D=256", "SOFTCAP=True", "BLOCK_SIZE=64"):
        assert any(needle in c for c in attention), needle


@pytest.mark.time_limit(180)
def test_the_check_sees_spills():
    """The attention kernel as it held a whole page of keys at once (block size 64, 8 query heads a KV head,
    head size 128: 33 KB of spill stores a thread on sm_90) is reported, so the budget can fail."""
    code = ("from actorserve.kernels import compile_check as c\n"
            "from actorserve.kernels.attention import unified_attention_triton as u\n"
            "u.TILE_ELEMENTS = 1 << 20\n"
            "reports = c.compile_all((90,), ('bfloat16',), [s for s in c.SHAPES if s.name == 'Qwen3-32B'],\n"
            "                        {'unified_attention'})\n"
            "bad = [r for r in reports if r.kernel == '_unified_attention_kernel' and 'BLOCK_SIZE=64' in r.constants]\n"
            "print(bad[0].spill_stores, bad[0].fault())\n")
    done = _run(["-c", code], timeout=170)
    assert done.returncode == 0, done.stderr[-4000:]
    stores, fault = done.stdout.strip().splitlines()[-1].split(" ", 1)
    assert int(stores) > 1000 and fault.startswith("spills")
