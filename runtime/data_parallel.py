"""Data parallelism: N engine rings (a scheduler and its workers each) behind one front door.

Runs in the launcher (the HTTP frontend's process, or the caller's). Each replica is an ``AsyncEngine`` of
its own, its processes named with ``-dpN`` and the cores shared out among all workers. A request goes to the
live replica with the fewest requests outstanding (the lowest rank on a tie), and its abort follows it
there. A seeded request draws from its own noise stream (``runtime.model.sampling.sampler.noise_stream``), so which
replica serves it does not change its answer. A replica that dies fails only its own streams: the others
go on serving, ``replica_states`` reports each one for /health and /metrics, and the engine counts as dead
(``wait_dead``) once every replica is.
"""
from __future__ import annotations

import asyncio
import collections
import dataclasses
import uuid
from typing import Any, AsyncIterator, Optional

from actorserve.runtime.async_engine import AsyncEngine
from actorserve.runtime.client import PromptInput
from actorserve.runtime.config import EngineConfig
from actorserve.runtime.engine.outputs import RequestOutput
from actorserve.runtime.engine.sampling_params import SamplingParams
from actorserve.runtime.errors import EngineDeadError
from actorserve.runtime.resolve import resolve
from actorserve.runtime.transport.messages import HealthPong


def replica_config(config: EngineConfig, rank: int) -> EngineConfig:
    return dataclasses.replace(config, parallel=dataclasses.replace(config.parallel, data_parallel_rank=rank))


class DataParallelEngine:
    """AsyncEngine's interface over ``data_parallel_size`` replicas."""

    def __init__(self, config: EngineConfig) -> None:
        self.config = config = resolve(config)
        self.replicas = [AsyncEngine.from_config(replica_config(config, rank))
                         for rank in range(config.parallel.data_parallel_size)]
        self._where: dict[str, int] = {}  # request id -> the replica serving it

    @classmethod
    def from_config(cls, config: EngineConfig) -> "DataParallelEngine":
        return cls(config)

    async def start(self) -> None:
        """Start every replica side by side; if one fails, stop the others and raise its error."""
        results = await asyncio.gather(*(r.start() for r in self.replicas), return_exceptions=True)
        failed = next((r for r in results if isinstance(r, BaseException)), None)
        if failed is not None:
            await self.close()
            raise failed

    @property
    def is_dead(self) -> bool:
        return all(r.is_dead for r in self.replicas)

    @property
    def info(self) -> dict:
        return self.replicas[0].info

    def child_pids(self) -> dict[str, int]:
        return {name: pid for r in self.replicas for name, pid in r.child_pids().items()}

    def replica_states(self) -> list[dict[str, Any]]:
        """Each replica: its rank, whether it serves, what ended it, and its requests outstanding."""
        outstanding = self._outstanding()
        return [{**r.replica_states()[0], "rank": rank, "outstanding": outstanding[rank]}
                for rank, r in enumerate(self.replicas)]

    def _outstanding(self) -> collections.Counter:
        """Requests streaming, by replica."""
        return collections.Counter(self._where.values())

    async def wait_dead(self) -> EngineDeadError:
        errors = await asyncio.gather(*(r.wait_dead() for r in self.replicas))
        return EngineDeadError(f"every data-parallel replica is dead: {'; '.join(str(e) for e in errors)}")

    def _pick(self, rank: Optional[int]) -> int:
        if rank is not None:
            if not 0 <= rank < len(self.replicas):
                raise ValueError(f"data_parallel_rank must be in [0, {len(self.replicas)}), got {rank}")
            return rank
        outstanding = self._outstanding()
        return min((self.replicas.index(r) for r in self._live()), key=lambda i: (outstanding[i], i))

    async def generate(self, prompt: PromptInput, sampling_params: Optional[SamplingParams] = None,
                       request_id: Optional[str] = None, data_parallel_rank: Optional[int] = None,
                       ) -> AsyncIterator[RequestOutput]:
        """As AsyncEngine.generate, on the least loaded live replica (or ``data_parallel_rank``'s)."""
        rank = self._pick(data_parallel_rank)
        request_id = request_id or uuid.uuid4().hex
        if request_id in self._where:
            raise ValueError(f"request_id {request_id!r} is already streaming")
        self._where[request_id] = rank
        try:
            async for out in self.replicas[rank].generate(prompt, sampling_params, request_id):
                yield out
        finally:
            self._where.pop(request_id, None)

    async def abort(self, request_id: str) -> None:
        rank = self._where.get(request_id)
        if rank is not None:
            await self.replicas[rank].abort(request_id)

    async def check_health(self) -> HealthPong:
        """The live replicas' answers summed; EngineDeadError once none is left (or one is stuck)."""
        return _summed(await asyncio.gather(*(r.check_health() for r in self._live())))

    async def sleep(self, level: int = 1) -> None:
        await asyncio.gather(*(r.sleep(level) for r in self._live()))

    async def wake_up(self, tags: Optional[list[str]] = None) -> None:
        await asyncio.gather(*(r.wake_up(tags) for r in self._live()))

    async def is_sleeping(self) -> bool:
        return any(await asyncio.gather(*(r.is_sleeping() for r in self._live())))

    def _live(self) -> list[AsyncEngine]:
        live = [r for r in self.replicas if not r.is_dead]
        if not live:
            raise self.replicas[0].death
        return live

    async def close(self) -> None:
        """One replica after the other: a Ray replica's close waits for its own resources to be seen free,
        counted from what is free when it starts (see ray_executor._resources_back)."""
        for replica in self.replicas:
            await replica.close()

    async def __aenter__(self) -> "DataParallelEngine":
        await self.start()
        return self

    async def __aexit__(self, *exc_info) -> None:
        await self.close()


def _summed(pongs: list[HealthPong]) -> HealthPong:
    """Counts and counters added up; KV cache usage averaged over the replicas."""
    def add(lists: list[list[int]]) -> list[int]:
        width = max((len(x) for x in lists), default=0)
        return [sum(x[i] for x in lists if i < len(x)) for i in range(width)]

    return HealthPong(0, sum(p.num_running for p in pongs), sum(p.num_waiting for p in pongs),
                      sum(p.kv_cache_usage for p in pongs) / len(pongs), sum(p.num_preemptions for p in pongs),
                      add([p.step_token_counts for p in pongs]), sum(p.step_token_sum for p in pongs),
                      sum(p.spec_num_drafts for p in pongs), sum(p.spec_num_draft_tokens for p in pongs),
                      sum(p.spec_num_accepted_tokens for p in pongs), add([p.spec_accepted_per_pos for p in pongs]))


def make_engine(config: EngineConfig):
    """The engine for this config: one ring, or data-parallel replicas."""
    if config.parallel.data_parallel_size > 1:
        return DataParallelEngine(config)
    return AsyncEngine.from_config(config)
