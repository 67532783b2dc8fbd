"""The torch decoders of Q4_0, Q4_1 and Q8_0 give gguf-py's values to the bit, on quantized random rows and
on every tensor of the default model; other types go through gguf-py itself."""
import numpy as np
import pytest
import torch

from actorserve.runtime.model.weights.gguf_dequant import dequantize, dequantize_ref
from actorserve.runtime.model.weights.gguf_file import GGUFFile
from actorserve.runtime.model_files import resolve_model_path


@pytest.mark.parametrize("kind", ["Q4_0", "Q4_1", "Q8_0", "F16", "F32"])
@pytest.mark.parametrize("shape", [(3, 64), (17, 256), (1, 32)])
def test_decoded_as_gguf_py_decodes(kind, shape):
    from gguf import GGMLQuantizationType, quants

    rng = np.random.default_rng(sum(shape))
    w = (rng.standard_normal(shape) * rng.uniform(0.01, 10)).astype(np.float32)
    w[0, :8] = 0  # a block edge of zeros
    data = quants.quantize(w, GGMLQuantizationType[kind])
    ours, ref = dequantize(data, kind, shape), dequantize_ref(data, kind, shape)
    assert ours.dtype == torch.float32 and ours.shape == shape
    assert torch.equal(ours.view(torch.int32), ref.view(torch.int32))  # the same bits, signed zeros included


def test_every_tensor_of_the_default_model():
    reader = GGUFFile(resolve_model_path(None))
    for t in reader.tensors:
        shape = t.dims
        data = reader.tensor_data(t)
        assert torch.equal(dequantize(data, t.type_name, shape).view(torch.int32),
                           dequantize_ref(data, t.type_name, shape).view(torch.int32)), t.name
