"""Stage-to-stage sends for pipeline parallelism over torch.distributed (gloo on CPU, nccl on CUDA).

Runs in the worker processes. ``isend_object`` serialises with msgspec (never pickle) and sends a size
tensor and a byte tensor without blocking; its handle keeps both buffers until ``wait()`` has drained
both, and ``wait()`` is idempotent. ``TensorDictSender.isend_tensor_dict`` sends a header through
``isend_object`` and each tensor as raw bytes, and retains every call's handles and source tensors in a
bounded PendingSends FIFO, reaped on later calls (see pending.py for the completion rules). Receivers call
``recv_object`` / ``recv_tensor_dict`` in the same order, blocking.
"""
from __future__ import annotations

from typing import Any, Optional, Type

import msgspec
import torch
import torch.distributed as dist

from actorserve.runtime.transport.pending import OnceHandle, PendingSends

_DTYPES = {str(d).removeprefix("torch."): d for d in (
    torch.float32, torch.float16, torch.bfloat16, torch.float64, torch.int64, torch.int32, torch.int16,
    torch.int8, torch.uint8, torch.bool)}


class TensorSpec(msgspec.Struct, frozen=True, array_like=True):
    name: str
    dtype: str
    shape: list[int]


class TensorDictHeader(msgspec.Struct, frozen=True):
    meta: msgspec.Raw  # the caller's own msgspec-encoded metadata
    tensors: list[TensorSpec]


class ObjectSendHandle:
    """Both sends of one object; holds the size and byte tensors until both are drained."""

    def __init__(self, size: torch.Tensor, payload: torch.Tensor, works: list) -> None:
        self.buffers: tuple = (size, payload)
        self._works = [OnceHandle(w) for w in works]

    def is_completed(self) -> bool:
        return all(w.is_completed() for w in self._works)

    def wait(self) -> None:
        for w in self._works:
            w.wait()
        self.buffers = ()


def isend_object(obj: Any, dst: int, group=None, encoder: Optional[msgspec.msgpack.Encoder] = None) -> ObjectSendHandle:
    data = (encoder or msgspec.msgpack.Encoder()).encode(obj)
    payload = torch.frombuffer(bytearray(data), dtype=torch.uint8) if data else torch.empty(0, dtype=torch.uint8)
    size = torch.tensor([len(data)], dtype=torch.int64)
    works = [dist.isend(size, dst, group=group)]
    if len(data):
        works.append(dist.isend(payload, dst, group=group))
    return ObjectSendHandle(size, payload, works)


def recv_object(src: int, type: Type, group=None) -> Any:
    size = torch.empty(1, dtype=torch.int64)
    dist.recv(size, src, group=group)
    payload = torch.empty(int(size.item()), dtype=torch.uint8)
    if payload.numel():
        dist.recv(payload, src, group=group)
    return msgspec.msgpack.decode(payload.numpy().tobytes(), type=type)


def _bytes_view(t: torch.Tensor) -> torch.Tensor:
    return t.contiguous().view(-1).view(torch.uint8) if t.dim() else t.reshape(1).view(torch.uint8)


class TensorDictSender:
    """Fire-and-forget sends to one peer stage, with their buffers retained until really sent."""

    def __init__(self, dst: int, group=None, device_group=None, max_pending: int = 8,
                 pending: Optional[PendingSends] = None) -> None:
        self.dst = dst
        self.group = group  # for the header (gloo)
        self.device_group = device_group  # for tensors (nccl on CUDA; None means the gloo group)
        self.pending = pending or PendingSends(max_pending)
        self._encoder = msgspec.msgpack.Encoder()

    def isend_tensor_dict(self, tensors: dict[str, torch.Tensor], meta: Any = None, retain: tuple = ()) -> None:
        """Send without blocking; ``retain`` names extra objects (a staging buffer) to keep until sent."""
        specs = [TensorSpec(k, str(t.dtype).removeprefix("torch."), list(t.shape)) for k, t in tensors.items()]
        header = TensorDictHeader(msgspec.Raw(self._encoder.encode(meta)), specs)
        object_handle = isend_object(header, self.dst, self.group, self._encoder)
        device, host, sources = [], [object_handle], [tensors, *retain]
        for t in tensors.values():
            if t.numel() == 0:
                continue
            raw = _bytes_view(t)
            sources.append(raw)
            on_device = t.is_cuda and self.device_group is not None
            work = dist.isend(raw, self.dst, group=self.device_group if on_device else self.group)
            (device if on_device else host).append(work)
        self.pending.add(sources, device=device, host=host)

    def drain(self) -> None:
        self.pending.drain()


def recv_tensor_dict(src: int, meta_type: Type, group=None, device_group=None,
                     device: str = "cpu") -> tuple[Any, dict[str, torch.Tensor]]:
    header = recv_object(src, TensorDictHeader, group)
    tensors = {}
    for spec in header.tensors:
        dtype = _DTYPES[spec.dtype]
        empty = torch.empty(spec.shape, dtype=dtype, device=device)
        if empty.numel():
            raw = torch.empty(empty.numel() * empty.element_size(), dtype=torch.uint8, device=device)
            on_device = raw.is_cuda and device_group is not None
            dist.recv(raw, src, group=device_group if on_device else group)
            empty = raw.view(dtype).view(spec.shape)
        tensors[spec.name] = empty
    return msgspec.msgpack.decode(header.meta, type=meta_type), tensors


class StagingBuffer:
    """A send buffer reused across steps. Before it is written again, every send still reading it is
    waited, so step N+1 never overwrites what step N is still sending."""

    def __init__(self, pending: PendingSends) -> None:
        self.pending = pending
        self.buffer: Optional[torch.Tensor] = None

    def stage(self, t: torch.Tensor) -> torch.Tensor:
        buf = self.buffer
        if buf is not None:
            self.pending.wait_for(buf)
        if buf is None or buf.numel() < t.numel() or buf.dtype != t.dtype or buf.device != t.device:
            buf = self.buffer = torch.empty(max(t.numel(), 1), dtype=t.dtype, device=t.device)
        view = buf[:t.numel()].view(t.shape)
        view.copy_(t)
        return view
