"""PendingSends with fake handles that complete only when told."""
import gc
import weakref

import pytest

from actorserve.runtime.transport.pending import OnceHandle, PendingSends


class FakeHandle:
    def __init__(self, says_done=False):
        self.done = False
        self.says_done = says_done  # a gloo-like handle may claim completion early
        self.waits = 0

    def is_completed(self):
        return self.done or self.says_done

    def wait(self):
        self.waits += 1
        self.done = True


class Buffer:
    pass


def test_buffer_lives_until_its_send_completes():
    fifo = PendingSends(8)
    handle = FakeHandle()
    buf = Buffer()
    ref = weakref.ref(buf)
    fifo.add([buf], device=[handle])
    del buf
    gc.collect()
    fifo.reap()
    assert ref() is not None and len(fifo) == 1
    handle.done = True
    fifo.reap()
    gc.collect()
    assert ref() is None and len(fifo) == 0


def test_reap_stops_at_the_first_in_flight():
    fifo = PendingSends(8)
    first, second = FakeHandle(), FakeHandle()
    second.done = True
    fifo.add([Buffer()], device=[first])
    fifo.add([Buffer()], device=[second])
    assert fifo.reap() == 0 and len(fifo) == 2
    first.done = True
    assert fifo.reap() == 2


def test_host_only_entries_are_waited_not_trusted():
    fifo = PendingSends(8)
    gloo = FakeHandle(says_done=True)  # claims done before its copy finished
    fifo.add([Buffer()], host=[gloo])
    fifo.reap()
    assert gloo.waits == 1 and len(fifo) == 0


def test_device_gates_and_gloo_is_the_backstop():
    fifo = PendingSends(8)
    nccl, gloo = FakeHandle(), FakeHandle(says_done=True)
    fifo.add([Buffer()], device=[nccl], host=[gloo])
    assert fifo.reap() == 0 and gloo.waits == 0  # gloo's word alone releases nothing
    nccl.done = True
    assert fifo.reap() == 1 and gloo.waits == 1


def test_wait_is_idempotent():
    raw = FakeHandle()
    once = OnceHandle(raw)
    once.wait()
    once.wait()
    assert raw.waits == 1 and once.is_completed()


def test_bounded_fifo_waits_the_oldest():
    fifo = PendingSends(4)
    handles = [FakeHandle() for _ in range(10)]
    for h in handles:
        fifo.add([Buffer()], device=[h])
        assert len(fifo) <= 4
    assert fifo.high_water == 4
    assert [h.waits for h in handles[:6]] == [1] * 6 and all(h.waits == 0 for h in handles[6:])


def test_wait_for_a_buffer_before_reuse_and_drain():
    fifo = PendingSends(8)
    staging = Buffer()
    a, b, c = FakeHandle(), FakeHandle(), FakeHandle()
    fifo.add([Buffer()], device=[a])
    fifo.add([staging], device=[b])
    fifo.add([Buffer()], device=[c])
    fifo.wait_for(staging)
    assert a.waits == 1 and b.waits == 1 and c.waits == 0 and len(fifo) == 1
    fifo.drain()
    assert c.waits == 1 and len(fifo) == 0


def test_bad_bound():
    with pytest.raises(ValueError, match="max_entries"):
        PendingSends(0)
