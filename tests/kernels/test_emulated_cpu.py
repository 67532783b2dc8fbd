"""On a truly lesser CPU, not just the override: the engine under qemu's user-mode emulation of an AVX2-only
AMD EPYC (Rome) and of a pre-AVX Intel (Nehalem), where CPUID says what those CPUs say and an AVX-512
instruction would be a SIGILL. bf16 and int8 must load and generate there (oneDNN's bf16 weight reorder
raised on such CPUs before the gates asked). Skipped where qemu-x86_64 is not installed (Debian's
qemu-user)."""
import json
import shutil
import subprocess
import sys

import pytest

QEMU = shutil.which("qemu-x86_64")
pytestmark = pytest.mark.skipif(QEMU is None or sys.platform != "linux", reason="needs qemu-x86_64 (qemu-user)")

SCRIPT = """
import json, sys
from actorserve import LLM, SamplingParams
from actorserve.kernels import capability
params = SamplingParams(temperature=0, max_tokens=6, ignore_eos=True)
result = {}
for dtype, quantization in (("bfloat16", None), ("bfloat16", "int8"), ("float32", None)):
    llm = LLM(sys.argv[1], dtype=dtype, quantization=quantization, skip_tokenizer_init=True,
              kv_cache_memory=4 << 20)
    out = llm.generate([{"prompt_token_ids": [5, 6, 7]}, {"prompt_token_ids": [9]}], params, use_tqdm=False)
    result[f"{dtype}-{quantization}"] = [o.outputs[0].token_ids for o in out]
paths = capability.current()
result["paths"] = [paths.isa, paths.kernel_isa, paths.prepacked_bf16]
print("RESULT " + json.dumps(result))
"""


@pytest.mark.parametrize("cpu,isa,kernels", [("EPYC-Rome", "avx2", "avx2"), ("Nehalem", "generic", None)])
def test_bf16_and_int8_run_on_an_emulated_lesser_cpu(cpu, isa, kernels, tiny_llama_dir, tmp_path):
    env_cache = {"ACTORSERVE_KERNEL_CACHE": str(tmp_path / "kernels")}
    proc = subprocess.run([QEMU, "-cpu", cpu, sys.executable, "-c", SCRIPT, str(tiny_llama_dir)],
                          capture_output=True, text=True, timeout=600,
                          env={**_env(), **env_cache})
    assert proc.returncode == 0, proc.stderr[-4000:]
    line = next(x for x in proc.stdout.splitlines() if x.startswith("RESULT "))
    result = json.loads(line[len("RESULT "):])
    assert result.pop("paths") == [isa, kernels, False]
    for tokens in result.values():
        assert [len(t) for t in tokens] == [6, 6] and all(0 <= t < 384 for seq in tokens for t in seq)


def _env() -> dict:
    import os

    return {k: v for k, v in os.environ.items() if k not in ("ACTORSERVE_CPU_ISA", "ATEN_CPU_CAPABILITY")}
