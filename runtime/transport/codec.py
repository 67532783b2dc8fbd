"""Messages to ZMQ frames and back: msgpack for the Struct, each tensor as its own frame.

A message that carries tensors refers to them by TensorRef (index into the frames that follow the
header). Sending aliases the tensor memory (no copy; the sender keeps it alive until the send is done,
see pending.py); the receiver copies once only where the received buffer is read-only. Decoding is typed: a frame
that is not a known Message raises ProtocolError, and the caller replies or drops it.
"""
from __future__ import annotations

from typing import Sequence

import msgspec
import numpy as np
import torch

from actorserve.runtime.errors import ActorServeError
from actorserve.runtime.transport.messages import Message

_NUMPY_VIEW = {torch.bfloat16: torch.int16}  # numpy has no bfloat16: travel as raw 16-bit words


class ProtocolError(ActorServeError):
    """A frame that does not decode to a known message of this protocol version."""


class TensorRef(msgspec.Struct, frozen=True, array_like=True):
    frame: int  # index among the tensor frames after the header
    dtype: str
    shape: list[int]


class Codec:
    def __init__(self) -> None:
        self._encoder = msgspec.msgpack.Encoder()
        self._decoder = msgspec.msgpack.Decoder(Message)
        self._ref_decoder = msgspec.msgpack.Decoder(list[TensorRef])

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
        except (msgspec.DecodeError, msgspec.ValidationError) as exc:
            raise ProtocolError(f"undecodable message: {exc}") from exc
        if len(frames) > 1 and len(refs) != len(frames) - 2:
            raise ProtocolError(f"message names {len(refs)} tensors but carries {len(frames) - 2}")
        return message, [_rebuild(ref, frames[2 + ref.frame]) for ref in refs]


def _rebuild(ref: TensorRef, buffer) -> torch.Tensor:
    dtype = getattr(torch, ref.dtype, None)
    if not isinstance(dtype, torch.dtype):
        raise ProtocolError(f"unknown tensor dtype {ref.dtype!r}")
    carrier = _NUMPY_VIEW.get(dtype, dtype)
    if 0 in ref.shape:
        return torch.empty(ref.shape, dtype=dtype)
    array = np.frombuffer(buffer, dtype=torch.empty((), dtype=carrier).numpy().dtype)
    return torch.from_numpy(array.copy() if not array.flags.writeable else array).view(dtype).reshape(ref.shape)
