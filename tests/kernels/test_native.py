"""Building C kernels on first use: cached by everything that goes into the build, headers included."""
import ctypes
import re
import shutil
import subprocess

import pytest
import torch

from actorserve.kernels import native
from actorserve.kernels.attention import cpu_decode
from actorserve.kernels.gemm import gguf, gguf_q8, int8, skinny

pytestmark = pytest.mark.skipif(native.compiler() is None, reason="no C compiler")


def test_a_header_edit_rebuilds_and_a_missing_header_falls_back(tmp_path, monkeypatch):
    monkeypatch.setenv("ACTORSERVE_KERNEL_CACHE", str(tmp_path / "cache"))
    (tmp_path / "value.h").write_text("#define VALUE 3\n")
    source = tmp_path / "answer.c"
    source.write_text('#include "value.h"\nint answer(void) { return VALUE; }\n')
    lib = native.load(source, ["-O1"])
    lib.answer.restype = ctypes.c_int
    assert lib.answer() == 3
    assert native.load(source, ["-O1"])._name == lib._name  # cached: the same library file
    (tmp_path / "value.h").write_text("#define VALUE 4\n")
    rebuilt = native.load(source, ["-O1"])
    rebuilt.answer.restype = ctypes.c_int
    assert rebuilt._name != lib._name and rebuilt.answer() == 4
    (tmp_path / "value.h").unlink()
    assert native.load(source, ["-O1"]) is None
    source.write_text("int broken(void) { return }\n")  # a failed build: None, the torch path runs
    assert native.load(source, ["-O1"]) is None


STREAMING = {  # the kernels that ask for the weight or cache they stream before reading it (kernels/prefetch.h)
    "gguf_blocks": gguf._library,
    "gguf_q8": gguf_q8._library,
    "int8_bf16": int8._library,
    "skinny_bf16": skinny._library,
    "paged_attention bf16": cpu_decode._libraries[torch.bfloat16, torch.bfloat16],
    "paged_attention fp32": cpu_decode._libraries[torch.float32, torch.float32],
    "paged_attention fp32 over bf16": cpu_decode._libraries[torch.float32, torch.bfloat16],
}


@pytest.mark.skipif(shutil.which("objdump") is None, reason="no objdump")
@pytest.mark.parametrize("name", sorted(STREAMING))
def test_streaming_kernels_keep_their_prefetches(name):
    """A prefetch has no effect the compiler must keep: GCC deleted the calls to a helper that only
    prefetched, and the attention kernel's build held one prefetch for six calls. Inlined and unrolled,
    each line of the source that asks gives at least one instruction in the library."""
    library = STREAMING[name]
    lib = library.get()
    if lib is None:
        pytest.skip("the C kernels are off on this machine")
    sites = [line for line in library.source.read_text().splitlines()
             if re.search(r"\b(_mm_prefetch|prefetch_\w+)\(", line) and "void" not in line]
    code = subprocess.run(["objdump", "-d", lib._name], capture_output=True, text=True, check=True).stdout
    assert sites and code.count("prefetcht0") >= len(sites)
