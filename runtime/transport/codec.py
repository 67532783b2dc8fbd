"""Messages to ZMQ frames and back: msgpack for the Struct, each tensor as its own frame.

A message that carries tensors refers to them by TensorRef (index into the frames that follow the
header). Sending aliases the tensor memory (no copy; the sender keeps it alive until the send is done,
see pending.py); the receiver copies once only where the received buffer is read-only. Decoding is typed
and total: whatever the frames hold (not msgpack, an unknown type, nesting too deep, a tensor reference
to a missing frame, a shape that does not match its buffer), decode raises ProtocolError and nothing
else, so the caller replies and goes on. A request of the right shape whose values its params refuse
(SamplingParams' checks run as it is decoded) is a RefusedValue: a ProtocolError that still names the
request, so that the request, not the connection, gets the error.
"""
from __future__ import annotations

import math
from typing import Optional, Sequence

import msgspec
import numpy as np
import torch

from actorserve.runtime.errors import ActorServeError
from actorserve.runtime.transport.messages import PROTOCOL_VERSION, Message

_NUMPY_VIEW = {torch.bfloat16: torch.int16}  # numpy has no bfloat16: travel as raw 16-bit words
# The dtypes a tensor may travel as; a name outside this set is refused before torch sees it.
_DTYPES = {name: getattr(torch, name) for name in (
    "float32", "float16", "bfloat16", "float64", "int64", "int32", "int16", "int8", "uint8", "bool")}
MAX_TENSOR_DIMS = 8


class ProtocolError(ActorServeError):
    """A frame that does not decode to a known message of this protocol version."""


class RefusedValue(ProtocolError):
    """A message whose values its own checks refuse, with the fields that address and authorize it."""

    def __init__(self, reason: str, header: "RequestHeader") -> None:
        super().__init__(reason)
        self.request_id, self.api_key, self.version = header.request_id, header.api_key, header.version


class RequestHeader(msgspec.Struct):
    """What a client request says about itself, read alone where the rest of it is refused."""

    request_id: Optional[str] = None
    api_key: Optional[str] = None
    version: int = PROTOCOL_VERSION


class TensorRef(msgspec.Struct, frozen=True, array_like=True):
    frame: int  # index among the tensor frames after the header
    dtype: str
    shape: list[int]


class Codec:
    def __init__(self) -> None:
        self._encoder = msgspec.msgpack.Encoder()
        self._decoder = msgspec.msgpack.Decoder(Message)
        self._ref_decoder = msgspec.msgpack.Decoder(list[TensorRef])
        self._header_decoder = msgspec.msgpack.Decoder(RequestHeader)

    def _header(self, frame) -> RequestHeader:
        try:
            return self._header_decoder.decode(frame)
        except msgspec.DecodeError:  # (it decoded once: only a field of the wrong type gets here)
            return RequestHeader()

    def encode(self, message: Message, tensors: Sequence[torch.Tensor] = ()) -> list:
        """[header, refs, *tensor buffers]; the buffers alias the tensors, so keep them alive until sent."""
        refs, buffers = [], []
        for i, t in enumerate(tensors):
            t = t.detach().contiguous().cpu()
            view = t.view(_NUMPY_VIEW.get(t.dtype, t.dtype))
            refs.append(TensorRef(i, str(t.dtype).removeprefix("torch."), list(t.shape)))
            buffers.append(memoryview(view.numpy()).cast("B") if t.numel() else b"")
        return [self._encoder.encode(message), self._encoder.encode(refs), *buffers]

    def decode(self, frames: Sequence) -> tuple[Message, list[torch.Tensor]]:
        if len(frames) < 1:
            raise ProtocolError("empty message")
        try:
            message = self._decoder.decode(frames[0])
            refs = self._ref_decoder.decode(frames[1]) if len(frames) > 1 else []
        except msgspec.ValidationError as exc:
            if isinstance(exc.__cause__, ValueError):  # the right shape, a value out of range
                raise RefusedValue(str(exc.__cause__), self._header(frames[0])) from None
            raise ProtocolError(f"undecodable message: {exc}") from exc
        except msgspec.DecodeError as exc:
            raise ProtocolError(f"undecodable message: {exc}") from exc
        except (RecursionError, MemoryError, OverflowError, ValueError, TypeError) as exc:
            raise ProtocolError(f"undecodable message: {type(exc).__name__}: {exc}") from None
        buffers = frames[2:]
        if len(frames) > 1 and len(refs) != len(buffers):
            raise ProtocolError(f"message names {len(refs)} tensors but carries {len(buffers)}")
        if sorted(ref.frame for ref in refs) != list(range(len(refs))):
            raise ProtocolError(f"tensor references {[r.frame for r in refs]} do not name each frame once")
        return message, [_rebuild(ref, buffers[ref.frame]) for ref in refs]


def _rebuild(ref: TensorRef, buffer) -> torch.Tensor:
    """The tensor a reference names, checked against its buffer before any memory is touched."""
    dtype = _DTYPES.get(ref.dtype)
    if dtype is None:
        raise ProtocolError(f"unknown tensor dtype {ref.dtype!r}")
    if len(ref.shape) > MAX_TENSOR_DIMS or any(d < 0 for d in ref.shape):
        raise ProtocolError(f"bad tensor shape {ref.shape[:MAX_TENSOR_DIMS + 1]}")
    carrier = _NUMPY_VIEW.get(dtype, dtype)
    itemsize = torch.empty((), dtype=carrier).element_size()
    numel = math.prod(ref.shape)  # a Python int: a huge shape cannot overflow into a small one
    size = memoryview(buffer).nbytes
    if numel * itemsize != size:
        raise ProtocolError(f"tensor of shape {ref.shape} and dtype {ref.dtype} needs {numel * itemsize} bytes, "
                            f"its frame has {size}")
    if numel == 0:
        return torch.empty(ref.shape, dtype=dtype)
    array = np.frombuffer(buffer, dtype=torch.empty((), dtype=carrier).numpy().dtype)
    return torch.from_numpy(array.copy() if not array.flags.writeable else array).view(dtype).reshape(ref.shape)
