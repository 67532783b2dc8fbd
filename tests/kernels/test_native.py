"""Building C kernels on first use: cached by everything that goes into the build, headers included."""
import ctypes

import pytest

from actorserve.kernels import native

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
