"""The scheduler's side of sleep mode: stop stepping, send the request round the worker ring, resume.

Runs in the scheduler process, on its loop, in tasks of their own (they wait for the steps in flight and
for the workers' SleepStatus, which arrive through the mailbox). The SchedulerActor's handlers call it,
one job at a time, and answer the client with what it returns.
"""
from __future__ import annotations

import asyncio
import itertools
from typing import Callable, Optional

import msgspec

from actorserve.runtime.config import EngineConfig
from actorserve.runtime.engine.core import EngineCore
from actorserve.runtime.engine.sleep import check_level, check_tags
from actorserve.runtime.transport.messages import SleepRequest, SleepStatus, WakeUpRequest


class SleepControl:
    def __init__(self, config: EngineConfig, core: EngineCore, send: Callable, resume: asyncio.Event) -> None:
        """``send``: to the first worker stage; ``resume``: the step loop's wake-up event."""
        self.enabled = config.runtime.enable_sleep_mode
        self.core, self._send, self._resume = core, send, resume
        self.lock = asyncio.Lock()  # one job at a time
        self.level: Optional[int] = None
        self._nonces = itertools.count(1)
        self._answers: dict[int, asyncio.Future] = {}  # requests round the worker ring, by nonce

    async def sleep(self, level: int) -> SleepStatus:
        """Stop scheduling, let the steps in flight finish, preempt every request, then have the workers
        release their memory. Sleeping again answers with the status."""
        check_level(level)
        self._require()
        if self.core.asleep:
            return await self.status()
        self.core.asleep = True  # no new step; the ones in flight finish
        while self.core.num_in_flight:
            await asyncio.sleep(0.001)
        self.core.sleep()
        status = await self._ask_workers(SleepRequest(0, level))
        self.level = level
        return status

    async def wake_up(self, tags: Optional[list[str]]) -> SleepStatus:
        check_tags(tags)
        self._require()
        if not self.core.asleep:
            return await self.status()
        status = await self._ask_workers(WakeUpRequest(0, tags))
        if not status.sleeping:
            self.core.wake_up()
            self.level = None
            self._resume.set()
        return msgspec.structs.replace(status, level=self.level)

    async def status(self) -> SleepStatus:
        return SleepStatus(0, self.core.asleep, self.level)

    def answer(self, status: SleepStatus) -> None:
        """The last stage's SleepStatus for a request this sent."""
        fut = self._answers.get(status.nonce)
        if fut is not None and not fut.done():
            fut.set_result(status)

    def _require(self) -> None:
        if not self.enabled:
            raise ValueError("sleep mode is off: start the engine with enable_sleep_mode (--enable-sleep-mode)")

    async def _ask_workers(self, message) -> SleepStatus:
        """Round the ring; a stage's failure is a RuntimeError with its reason (the engine stays asleep,
        and a later wake_up tries again)."""
        nonce = next(self._nonces)
        fut = self._answers[nonce] = asyncio.get_running_loop().create_future()
        await self._send(msgspec.structs.replace(message, nonce=nonce))
        try:
            status = await fut
        finally:
            self._answers.pop(nonce, None)
        if status.error is not None:
            raise RuntimeError(status.error)
        return status
