"""Write tests/data/llama_cpp_blocks.gguf: rows of real weights as llama.cpp's own quantizer writes them, in
every block type that the shipped real files lack (actorserve.benchmarks.real_files: the default model
requantized to each of its presets by llama-cpp-python, the bench extra).

Each tensor of the file is the first ROWS rows of one tensor of one requantized file, its blocks copied as
llama.cpp wrote them, named ``<preset>.<tensor>``; one tensor a block type a preset holds, the widest
(the K types need rows of 256 values). The test suite decodes them bit for bit against gguf-py where
llama-cpp-python is not installed (tests/runtime/model/weights/test_real_gguf.py).

    .venv/bin/python scripts/make_llama_cpp_blocks.py
"""
from __future__ import annotations

from pathlib import Path

import numpy as np

from actorserve.benchmarks import real_files
from actorserve.runtime.model.weights.gguf_file import GGUFFile

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "tests" / "data" / "llama_cpp_blocks.gguf"
ROWS = 32


def main() -> None:
    import gguf

    shipped = set()
    for name in real_files.REAL_FILES:
        shipped |= {t.type_name for t in GGUFFile(str(real_files.real_file(name))).tensors}
    writer = gguf.GGUFWriter(str(OUT), "llama")
    taken = set(shipped)
    for preset in real_files.PRESETS:
        reader = GGUFFile(str(real_files.requantized(real_files.DEFAULT, preset)))
        for t in sorted(reader.tensors, key=lambda t: -t.dims[-1]):
            if t.type_name in taken or len(t.dims) != 2:
                continue
            taken.add(t.type_name)
            rows = np.ascontiguousarray(reader.tensor_data(t)[:ROWS])
            writer.add_tensor(f"{preset}.{t.name}", rows, raw_dtype=gguf.GGMLQuantizationType[t.type_name])
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    print(f"{OUT}: {OUT.stat().st_size} bytes, types {sorted(taken - shipped)}")


if __name__ == "__main__":
    main()
