"""The GGUF parser reads what gguf-py's GGUFReader reads, and turns every broken file into ModelLoadError."""
import numpy as np
import pytest

from actorserve.runtime.errors import ModelLoadError
from actorserve.runtime.model.weights.gguf_file import GGUFFile
from actorserve.runtime.model_files import resolve_model_path


@pytest.fixture(scope="module")
def default_gguf() -> str:
    return resolve_model_path(None)


def test_fields_and_tensors_are_gguf_readers(default_gguf):
    import gguf

    ours, theirs = GGUFFile(default_gguf), gguf.GGUFReader(default_gguf)
    fields = {f.name: f.contents() for f in theirs.fields.values() if not f.name.startswith("GGUF.")}
    assert fields.keys() == ours.fields.keys()
    for key, value in fields.items():
        mine = ours.fields[key]
        if isinstance(value, (list, np.ndarray)):
            assert list(mine) == list(value), key
        else:
            assert mine == value and type(mine) is type(value), key
    assert [t.name for t in ours.tensors] == [t.name for t in theirs.tensors]
    for mine, t in zip(ours.tensors, theirs.tensors):
        assert mine.type_name == t.tensor_type.name and mine.shape == tuple(int(d) for d in t.shape)
        data = ours.tensor_data(mine)
        assert data.dtype == t.data.dtype and np.array_equal(data, np.asarray(t.data)), t.name


def test_broken_files_are_model_load_errors(default_gguf, tmp_path):
    whole = open(default_gguf, "rb").read(1 << 20)
    cases = {"empty": b"", "magic": b"GGML" + whole[4:], "version": whole[:4] + (1).to_bytes(4, "little") + whole[8:],
             "noise": bytes(range(256)) * 64}
    cases.update({f"cut-{n}": whole[:n] for n in (3, 7, 20, 100, 4096, 100_000, 900_000)})
    for name, blob in cases.items():
        path = tmp_path / f"{name}.gguf"
        path.write_bytes(blob)
        with pytest.raises(ModelLoadError, match="GGUF"):
            GGUFFile(str(path))


def test_a_tensor_past_the_end_is_named(default_gguf, tmp_path):
    reader = GGUFFile(default_gguf)
    last = max(reader.tensors, key=lambda t: t.offset)
    path = tmp_path / "short.gguf"
    path.write_bytes(open(default_gguf, "rb").read()[:last.offset + 10])
    short = GGUFFile(str(path))
    with pytest.raises(ModelLoadError, match=last.name):
        short.tensor_data(next(t for t in short.tensors if t.name == last.name))
