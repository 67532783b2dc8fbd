"""The allocator ledger: every long-lived buffer of a worker, by tag, and sleep mode's release and restore.

Runs in a worker (or the in-process engine). Tags:
- ``weights``: the model's parameters and buffers and their prepared forms (GGUF blocks, int8, packed);
- ``kv_cache``: the paged KV pools and a hybrid model's recurrent-state slots;
- ``workspace``: the buffers the step's plans keep between steps (the decode fast path, CUDA graphs).

Sleep releases exactly what the ledger holds for the requested tags and wake-up restores exactly that,
each tag once. Host memory is released in place: each buffer's pages go back to the OS (madvise
MADV_DONTNEED) while its addresses stay, so every pointer a kernel bound at load stays valid, and a restore
writes the bytes back where they were (pages that were released read as zeros). oneDNN's packed weights
have no address: they are dropped and packed again from their dense values. Device memory is freed by
resizing its storage to nothing; what bound its addresses (CUDA graphs) is built again after a restore.

``escaped`` audits the ledger: every tensor reachable from the engine must lie in a recorded buffer.
"""
from __future__ import annotations

import ctypes
import gc
import mmap
import sys
import types
from typing import IO, Callable, Iterator, Optional, Sequence

import torch

from actorserve.kernels.gemm.prepacked import BATCH_HINT, PackedWeight

TAGS = ("weights", "kv_cache", "workspace")
_MADV_DONTNEED = 4
_PAGE = mmap.PAGESIZE


class HostBuffer:
    """A CPU storage, released page by page in place."""

    def __init__(self, name: str, storage: torch.UntypedStorage) -> None:
        self.name, self.storage = name, storage
        self.address, self.nbytes = storage.data_ptr(), storage.nbytes()

    def _bytes(self, start: int = 0, end: Optional[int] = None):
        end = self.nbytes if end is None else end
        return (ctypes.c_char * (end - start)).from_address(self.address + start)

    def save(self, file: IO[bytes]) -> None:
        file.write(memoryview(self._bytes()))

    def load(self, file: IO[bytes]) -> None:
        if file.readinto(memoryview(self._bytes())) != self.nbytes:
            raise RuntimeError(f"{self.name}: the sleep backing file ended early")

    def copy_from(self, other: "HostBuffer") -> None:
        ctypes.memmove(self.address, other.address, self.nbytes)

    def release(self) -> None:
        """Give the whole pages inside the buffer back; the partial pages at its ends stay."""
        start = -(-self.address // _PAGE) * _PAGE
        end = (self.address + self.nbytes) // _PAGE * _PAGE
        if end > start and _libc().madvise(ctypes.c_void_p(start), ctypes.c_size_t(end - start), _MADV_DONTNEED):
            raise OSError(ctypes.get_errno(), f"{self.name}: madvise failed")

    def zero(self) -> None:
        """What a released buffer needs to read as zeros: its partial pages (the rest already does)."""
        head = min(self.nbytes, -(-self.address // _PAGE) * _PAGE - self.address)
        tail = max(head, (self.address + self.nbytes) // _PAGE * _PAGE - self.address)
        ctypes.memset(self.address, 0, head)
        ctypes.memset(self.address + tail, 0, self.nbytes - tail)


class DeviceBuffer:
    """A device storage, freed by resizing it to nothing (its address changes on restore)."""

    def __init__(self, name: str, storage: torch.UntypedStorage) -> None:
        self.name, self.storage, self.nbytes = name, storage, storage.nbytes()
        self.address = storage.data_ptr()
        self._host: Optional[torch.Tensor] = None

    def _view(self) -> torch.Tensor:
        return torch.empty(0, dtype=torch.uint8, device=self.storage.device).set_(self.storage)

    def save(self, file: IO[bytes]) -> None:
        self._host = self._view().to("cpu", copy=True)  # the backing copy is in host memory

    def load(self, file: IO[bytes]) -> None:
        self.storage.resize_(self.nbytes)
        self._view().copy_(self._host)
        self._host = None

    def copy_from(self, other: "DeviceBuffer") -> None:
        self.storage.resize_(self.nbytes)
        self._view().copy_(other._view())

    def release(self) -> None:
        self.storage.resize_(0)

    def zero(self) -> None:
        self.storage.resize_(self.nbytes)
        self._view().zero_()


class PackedBuffer:
    """oneDNN's packed copy of a bf16 weight: an opaque tensor, dropped and packed again."""

    def __init__(self, name: str, packed: PackedWeight) -> None:
        self.name, self.packed = name, packed
        self.nbytes = packed.out_features * packed.in_features * 2
        self.address = None

    def save(self, file: IO[bytes]) -> None:
        dense = self.packed.tensor.to_dense()
        file.write(memoryview(dense.view(torch.uint8).numpy()))

    def load(self, file: IO[bytes]) -> None:
        dense = torch.empty(self.packed.out_features, self.packed.in_features, dtype=torch.bfloat16)
        file.readinto(memoryview(dense.view(torch.uint8).numpy()))
        self.packed.tensor = torch.ops.mkldnn._reorder_linear_weight(dense, BATCH_HINT)

    def copy_from(self, other: "PackedBuffer") -> None:
        self.packed.tensor = other.packed.tensor

    def release(self) -> None:
        self.packed.tensor = None

    def zero(self) -> None:
        raise RuntimeError(f"{self.name}: a packed weight is restored from its values, never as zeros")


def _libc() -> ctypes.CDLL:
    return ctypes.CDLL(None, use_errno=True)


def buffer_of(name: str, obj) -> Optional[object]:
    """The ledger entry for a tensor's storage or a packed weight (None for an empty one)."""
    if isinstance(obj, PackedWeight):
        return PackedBuffer(name, obj) if obj.tensor is not None else None
    storage = obj.untyped_storage()
    if storage.nbytes() == 0:
        return None
    return HostBuffer(name, storage) if storage.device.type == "cpu" else DeviceBuffer(name, storage)


def held(root, prefix: str) -> Iterator[tuple[str, object]]:
    """Every tensor and packed weight that ``root`` holds through modules, attributes and containers of
    this package's types, with a dotted name, in a fixed order (two loads of a model walk alike)."""
    seen: set[int] = set()
    stack = [(prefix, root)]
    while stack:
        name, obj = stack.pop()
        if id(obj) in seen or obj is None:
            continue
        seen.add(id(obj))
        if isinstance(obj, (torch.Tensor, PackedWeight)):
            yield name, obj
            continue
        stack.extend(reversed(list(_members(name, obj))))


def _members(name: str, obj) -> Iterator[tuple[str, object]]:
    if isinstance(obj, (list, tuple)):
        yield from ((f"{name}.{i}", v) for i, v in enumerate(obj))
    elif isinstance(obj, dict):
        yield from ((f"{name}.{k}", v) for k, v in obj.items())
    elif isinstance(obj, torch.nn.Module):
        yield from ((f"{name}.{k}", v) for k, v in obj._parameters.items())
        yield from ((f"{name}.{k}", v) for k, v in obj._buffers.items())
        yield from ((f"{name}.{k}", v) for k, v in vars(obj).items() if k not in _MODULE_TABLES)
        yield from ((f"{name}.{k}", v) for k, v in obj._modules.items())
    elif type(obj).__module__.startswith("actorserve.") and hasattr(obj, "__dict__"):
        yield from ((f"{name}.{k}", v) for k, v in vars(obj).items())


_MODULE_TABLES = ("_parameters", "_buffers", "_modules")


class TagState:
    RESIDENT, BACKED, DISCARDED = "resident", "backed", "discarded"


class AllocatorLedger:
    """The buffers by tag, and each tag's state: resident, released with a backing copy, or discarded."""

    def __init__(self) -> None:
        self.entries: dict[str, list] = {tag: [] for tag in TAGS}
        self.state: dict[str, str] = {tag: TagState.RESIDENT for tag in TAGS}
        self.restores: dict[str, int] = {tag: 0 for tag in TAGS}  # completed restores, for the tests
        self._addresses: set[int] = set()
        self._backing: dict[str, IO[bytes]] = {}

    def record(self, tag: str, root, prefix: str) -> int:
        """Enter what ``root`` holds under ``tag``; a buffer already entered (under any tag) is not entered
        twice. Returns the bytes entered."""
        added = 0
        for name, obj in held(root, prefix):
            entry = buffer_of(name, obj)
            key = entry.address if entry is not None and entry.address is not None else id(obj)
            if entry is None or key in self._addresses:
                continue
            self._addresses.add(key)
            self.entries[tag].append(entry)
            added += entry.nbytes
        return added

    def nbytes(self, tag: str) -> int:
        return sum(e.nbytes for e in self.entries[tag])

    def release(self, tag: str, backup: bool) -> int:
        """Give back every buffer of ``tag``, first writing them to a backing file where ``backup``."""
        if self.state[tag] != TagState.RESIDENT:
            raise RuntimeError(f"the ledger's {tag!r} is already released ({self.state[tag]})")
        if backup:
            import tempfile

            file = self._backing[tag] = tempfile.TemporaryFile(prefix=f"actorserve-sleep-{tag}-")
            for entry in self.entries[tag]:
                entry.save(file)
            file.flush()
        for entry in self.entries[tag]:
            entry.release()
        self.state[tag] = TagState.BACKED if backup else TagState.DISCARDED
        return self.nbytes(tag)

    def restore(self, tag: str, source: Optional["AllocatorLedger"] = None,
                rebuilt: Optional[Callable[["AllocatorLedger"], None]] = None) -> None:
        """Bring ``tag`` back: from its backing file, from ``source`` (a fresh load's ledger, entry for
        entry), as zeros, or (``rebuilt``) as new buffers that the callback builds and records in place of
        the old. Restoring a resident tag is an error: every tag comes back exactly once."""
        state = self.state[tag]
        if state == TagState.RESIDENT:
            raise RuntimeError(f"the ledger's {tag!r} is resident: it cannot be restored twice")
        if rebuilt is not None:
            for entry in self.entries[tag]:
                self._addresses.discard(entry.address if entry.address is not None else id(entry.packed))
            self.entries[tag] = []
            rebuilt(self)
        elif state == TagState.BACKED:
            file = self._backing.pop(tag)
            file.seek(0)
            for entry in self.entries[tag]:
                entry.load(file)
            file.close()
        elif source is not None:
            self._copy(tag, source)
        else:
            for entry in self.entries[tag]:
                entry.zero()
        self.state[tag] = TagState.RESIDENT
        self.restores[tag] += 1

    def _copy(self, tag: str, source: "AllocatorLedger") -> None:
        mine, theirs = self.entries[tag], source.entries[tag]
        shapes = lambda es: [(type(e), e.nbytes) for e in es]  # noqa: E731
        if shapes(mine) != shapes(theirs):
            raise RuntimeError(f"the reloaded {tag!r} does not match the ledger ({len(theirs)} buffers for "
                               f"{len(mine)}): the checkpoint changed since it was loaded")
        for entry, other in zip(mine, theirs):
            entry.copy_from(other)

    def escaped(self, roots: Sequence[object], min_bytes: int = 1 << 12) -> list[str]:
        """Tensors reachable from ``roots`` by any Python reference (closures included) that lie in no
        buffer of the ledger: allocations that sleep would not release."""
        spans = sorted((e.address, e.address + e.nbytes) for es in self.entries.values() for e in es
                       if e.address is not None)
        packed = {id(e.packed.tensor) for e in self.entries["weights"] if isinstance(e, PackedBuffer)}
        out = []
        for t in _reachable_tensors(roots):
            if t.layout != torch.strided:
                if id(t) not in packed:
                    out.append(f"{tuple(t.shape)} {t.dtype} {t.layout}")
                continue
            storage = t.untyped_storage()
            if storage.nbytes() < min_bytes:
                continue
            start = storage.data_ptr()
            if not any(lo <= start < hi for lo, hi in spans):
                out.append(f"{tuple(t.shape)} {t.dtype} ({storage.nbytes()} bytes)")
        return out


def _reachable_tensors(roots: Sequence[object]) -> Iterator[torch.Tensor]:
    """Walk every reference from ``roots`` (gc's view), not into modules, classes or module globals."""
    stop = {id(vars(m)) for m in list(sys.modules.values()) if m is not None}
    seen: set[int] = set()
    stack = list(roots)
    while stack:
        obj = stack.pop()
        if id(obj) in seen or id(obj) in stop or isinstance(obj, (type, types.ModuleType)):
            continue
        seen.add(id(obj))
        if isinstance(obj, torch.Tensor):
            yield obj
            continue
        if isinstance(obj, types.FunctionType):
            stack.extend(c.cell_contents for c in obj.__closure__ or () if _filled(c))
            stack.extend(obj.__defaults__ or ())
            continue
        stack.extend(gc.get_referents(obj))


def _filled(cell) -> bool:
    try:
        cell.cell_contents
    except ValueError:
        return False
    return True
