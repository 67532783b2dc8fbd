"""An AsyncEngine on a private event loop in a thread, driven from synchronous code.

Runs in the caller's process. The offline ``LLM`` uses it when the engine needs several processes
(pipeline or data parallelism); results come back in input order, and an error in one request cancels the rest.
"""
from __future__ import annotations

import asyncio
import threading
from typing import Callable, Optional

from actorserve.runtime.config import EngineConfig
from actorserve.runtime.data_parallel import make_engine
from actorserve.runtime.engine.outputs import RequestOutput
from actorserve.runtime.engine.sampling_params import SamplingParams


class BackgroundEngine:
    def __init__(self, config: EngineConfig) -> None:
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="actorserve-engine", daemon=True)
        self._thread.start()
        self.engine = self._call(_make(config))
        try:
            self._call(self.engine.start())
        except BaseException:
            self.close()
            raise

    def _call(self, coro):
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result()

    @property
    def info(self) -> dict:
        return self.engine.info

    def run(self, requests: list[tuple[dict, SamplingParams]],
            on_done: Optional[Callable[[RequestOutput], None]] = None) -> list[RequestOutput]:
        return self._call(self._run(requests, on_done))

    async def _run(self, requests, on_done) -> list[RequestOutput]:
        async def one(prompt: dict, params: SamplingParams) -> RequestOutput:
            last = None
            async for out in self.engine.generate(prompt, params):
                last = out
            if on_done is not None:
                on_done(last)
            return last

        tasks = [asyncio.ensure_future(one(p, sp)) for p, sp in requests]
        done, pending = await asyncio.wait(tasks, return_when=asyncio.FIRST_EXCEPTION)
        for task in pending:
            task.cancel()  # leaving their streams aborts them in the scheduler
        await asyncio.gather(*pending, return_exceptions=True)
        failed = next((t for t in tasks if t in done and t.exception() is not None), None)
        if failed is not None:
            raise failed.exception()  # the error itself, not the cancellation of the others
        return [t.result() for t in tasks]

    def call(self, coro):
        """Any of the engine's coroutines (sleep, wake_up, is_sleeping), run to its end on its loop."""
        return self._call(coro)

    def close(self) -> None:
        if self._loop.is_closed():
            return
        engine = getattr(self, "engine", None)
        if engine is not None:
            self._call(engine.close())
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)
        self._loop.close()


async def _make(config: EngineConfig):
    return make_engine(config)  # built on the engine's own loop
