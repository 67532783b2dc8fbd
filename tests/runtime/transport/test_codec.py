"""The codec is total: whatever the frames hold, decode returns a message or raises ProtocolError."""
import msgspec
import pytest
import torch

from actorserve.runtime.transport.codec import Codec, ProtocolError
from actorserve.runtime.transport.messages import HealthPing

pack = msgspec.msgpack.encode
PING = pack({"type": "health_ping", "nonce": 1})


def test_tensors_round_trip():
    codec = Codec()
    tensors = [torch.randn(3, 4), torch.randn(2).to(torch.bfloat16), torch.zeros(0, 5), torch.arange(6)]
    message, back = codec.decode([bytes(f) for f in codec.encode(HealthPing(1), tensors)])
    assert message == HealthPing(1)
    for a, b in zip(tensors, back):
        assert a.dtype == b.dtype and torch.equal(a, b)


@pytest.mark.parametrize("frames", [
    [], [b"\xc1"], [b"\x91" * 100_000 + b"\xc0"], [PING, b"\x91" * 100_000 + b"\xc0"],
    [b"\x83\xa1x" + b"\x91" * 100_000 + b"\xc0" + b"\xa4type\xabhealth_ping\xa5nonce\x01"],
    [PING, pack([[0, "float32", [-1, -2]]]), b"\0" * 8],
    [PING, pack([[0, "float32", [2 ** 31, 2 ** 31]]]), b"\0" * 8],
    [PING, pack([[0, "float32", [2 ** 64 - 1]]]), b"\0" * 8],
    [PING, pack([[5, "float32", [2]]]), b"\0" * 8],
    [PING, pack([[0, "float32", [4]]]), b"\0" * 8],
    [PING, pack([[0, "float32", [1]]]), b"\0" * 8],
    [PING, pack([[0, "Tensor", [2]]]), b"\0" * 8],
    [PING, pack([[0, "float32", [1] * 9]]), b"\0" * 4],
    [PING, pack([[0, "float32", [2]], [0, "float32", [2]]]), b"\0" * 8, b"\0" * 8],
    [PING, pack([[0, "float32", [2]]])],
])
def test_bad_frames_raise_protocol_error_only(frames):
    with pytest.raises(ProtocolError):
        Codec().decode(frames)
