"""The scheduler's waiting queue: first come, first served, and a request taken out anywhere (an abort)
without a scan: its entry goes when it reaches the head, or when dead entries outnumber live ones."""
import pytest

from actorserve.runtime.config import CacheConfig, EngineConfig, SchedulerConfig
from actorserve.runtime.engine.core import EngineCore, ModelFacts
from actorserve.runtime.engine.request import Request, RequestStatus
from actorserve.runtime.engine.sampling_params import SamplingParams
from actorserve.runtime.engine.waiting_queue import WaitingQueue
from actorserve.runtime.errors import EngineOverloadedError
from tests.runtime.engine.fake_executor import FakeExecutor
from tests.runtime.engine.test_scheduler import run


def _request(i: int) -> Request:
    return Request(f"r{i}", [1, 2, 3], SamplingParams(), i, 64)


def _finish(queue: WaitingQueue, r: Request) -> None:
    r.status = RequestStatus.FINISHED_ABORTED
    queue.discard(r)


def test_order_and_removal_anywhere():
    q, rs = WaitingQueue(), [_request(i) for i in range(6)]
    for r in rs[1:]:
        q.append(r)
    q.appendleft(rs[0])
    _finish(q, rs[0])  # the head
    _finish(q, rs[3])  # the middle
    assert len(q) == 4 and [r.request_id for r in q] == ["r1", "r2", "r4", "r5"]
    assert q.head() is rs[1] and q.popleft() is rs[1]
    q.extendleft([rs[1]])  # (a request skipped this step goes back to the head)
    assert [r.request_id for r in q] == ["r1", "r2", "r4", "r5"] and len(q) == 4
    while q:
        q.popleft()
    assert len(q) == 0 and not q


def test_dead_entries_are_dropped_once_they_outnumber_the_live():
    q, rs = WaitingQueue(), [_request(i) for i in range(5000)]
    for r in rs:
        q.append(r)
    for r in rs[1:4000]:
        _finish(q, r)
    assert len(q) == 1001 and len(q._queue) < 2500  # rebuilt on the way, not holding every dead entry
    assert [r.request_id for r in q][:2] == ["r0", "r4000"]


def _engine(cap: int) -> EngineCore:
    config = EngineConfig(cache=CacheConfig(block_size=16), scheduler=SchedulerConfig(2, 256, max_waiting_seqs=cap))
    return EngineCore(config, FakeExecutor(16, 1000), ModelFacts(1000, None, 1024, 256))


def test_a_full_queue_refuses_at_once_and_admits_again_once_it_drains():
    engine = _engine(cap=4)
    with pytest.raises(ValueError, match="n: 5 samples are more sequences than this engine queues"):
        engine.add_request("big", [1, 2, 3], SamplingParams(n=5, max_tokens=2))
    engine.add_request("a", [1, 2, 3], SamplingParams(n=3, max_tokens=2))
    engine.add_request("b", [4, 5, 6], SamplingParams(max_tokens=2))
    with pytest.raises(EngineOverloadedError, match="4 sequences wait"):
        engine.add_request("c", [7, 8, 9], SamplingParams(max_tokens=2))
    assert "c" not in engine._groups  # nothing of it queued
    engine.abort_request("a")
    engine.add_request("c", [7, 8, 9], SamplingParams(max_tokens=2))
    assert set(run(engine)) == {"b", "c"}
