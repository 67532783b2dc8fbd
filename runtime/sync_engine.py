"""The synchronous bridge under the offline ``LLM``: one interface (``SyncEngine``), two engines behind it.

Runs in the caller's process. With one pipeline stage and one replica, ``StepEngine`` holds the whole engine
(core and runner) in this process and steps it; otherwise ``BackgroundEngine`` runs an AsyncEngine (or
data-parallel replicas of one) on a private event loop in a thread. Either way results come back in input
order, and an error in one request ends the others.
"""
from __future__ import annotations

import asyncio
import itertools
import threading
from typing import Callable, Optional, Protocol

from actorserve.runtime.config import EngineConfig
from actorserve.runtime.data_parallel import make_engine
from actorserve.runtime.engine.outputs import RequestOutput
from actorserve.runtime.engine.sampling_params import SamplingParams

# one request as LLM hands it over: its text (None where it came as ids), its token ids, its params
Request = tuple[Optional[str], list[int], SamplingParams]
OnDone = Optional[Callable[[RequestOutput], None]]


class SyncEngine(Protocol):
    """What ``LLM`` needs of its engine: what the model is (``info``: vocab_size, eos_token_id,
    max_model_len), the requests run to their ends, sleep mode, and a close."""

    info: dict

    def run(self, requests: list[Request], on_done: OnDone = None) -> list[RequestOutput]: ...

    def sleep(self, level: int) -> None: ...

    def wake_up(self, tags: Optional[list[str]]) -> None: ...

    def is_sleeping(self) -> bool: ...

    def close(self) -> None: ...


def sync_engine(config: EngineConfig) -> SyncEngine:
    """The one engine a config runs as here: in this process where it can be, else in the background."""
    parallel = config.parallel
    if (parallel.pipeline_parallel_size == 1 and parallel.data_parallel_size == 1
            and parallel.distributed_executor_backend == "mp"):
        return StepEngine(config)
    return BackgroundEngine(config)


class StepEngine:
    """The engine core and its runner in this process, stepped by the caller."""

    def __init__(self, config: EngineConfig) -> None:
        from actorserve.runtime.worker_assembly import build_engine  # the model's packages, for this one alone

        self.core, loaded = build_engine(config)
        self.tokenizer = loaded.tokenizer
        facts = self.core.facts
        self.info = {"vocab_size": facts.vocab_size, "eos_token_id": facts.eos_token_id,
                     "max_model_len": facts.max_model_len}
        self._ids = itertools.count()

    def run(self, requests: list[Request], on_done: OnDone = None) -> list[RequestOutput]:
        ids = [f"offline-{next(self._ids)}" for _ in requests]
        added = []
        try:
            for rid, (text, token_ids, params) in zip(ids, requests):
                self.core.add_request(rid, token_ids, params, prompt=text)
                added.append(rid)
        except Exception:
            for rid in added:
                self.core.abort_request(rid)
            raise
        done: dict[str, RequestOutput] = {}
        try:
            while len(done) < len(ids):
                for out in self.core.step():
                    if out.finished and out.request_id not in done:
                        done[out.request_id] = out
                        if on_done is not None:
                            on_done(out)
        except BaseException:
            for rid in ids:
                self.core.abort_request(rid)
            raise
        return [done[rid] for rid in ids]

    def sleep(self, level: int) -> None:
        mode = self._sleep_mode()
        if not mode.sleeping:
            self.core.sleep()
            mode.sleep(level)

    def wake_up(self, tags: Optional[list[str]]) -> None:
        mode = self._sleep_mode()
        mode.wake_up(tags)
        if not mode.sleeping:
            self.core.wake_up()

    def is_sleeping(self) -> bool:
        return self._sleep_mode().sleeping

    def _sleep_mode(self):
        mode = self.core.executor.sleep_mode
        if mode is None:
            raise ValueError("sleep mode is off: make the LLM with enable_sleep_mode=True")
        return mode

    def close(self) -> None:
        """Nothing to stop: the engine lives and goes with this object."""


class BackgroundEngine:
    """An AsyncEngine (or data-parallel replicas) on a private event loop in a thread."""

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

    def run(self, requests: list[Request], on_done: OnDone = None) -> list[RequestOutput]:
        return self._call(self._run(requests, on_done))

    async def _run(self, requests: list[Request], on_done: OnDone) -> list[RequestOutput]:
        async def one(text: Optional[str], token_ids: list[int], params: SamplingParams) -> RequestOutput:
            last = None
            async for out in self.engine.generate({"prompt_token_ids": token_ids, "prompt": text}, params):
                last = out
            if on_done is not None:
                on_done(last)
            return last

        tasks = [asyncio.ensure_future(one(*request)) for request in requests]
        done, pending = await asyncio.wait(tasks, return_when=asyncio.FIRST_EXCEPTION)
        for task in pending:
            task.cancel()  # leaving their streams aborts them in the scheduler
        await asyncio.gather(*pending, return_exceptions=True)
        failed = next((t for t in tasks if t in done and t.exception() is not None), None)
        if failed is not None:
            raise failed.exception()  # the error itself, not the cancellation of the others
        return [t.result() for t in tasks]

    def sleep(self, level: int) -> None:
        self._call(self.engine.sleep(level))

    def wake_up(self, tags: Optional[list[str]]) -> None:
        self._call(self.engine.wake_up(tags))

    def is_sleeping(self) -> bool:
        return self._call(self.engine.is_sleeping())

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
