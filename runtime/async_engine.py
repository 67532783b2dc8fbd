"""The embedded async API: ``AsyncEngine`` inside any asyncio app.

Runs in the caller's process: it launches the actors (child processes by default, or in-process) and
talks to the scheduler through a ZmqClient, the same protocol external clients use. A dead child turns
every open stream into EngineDeadError at once and makes new calls fail fast.
"""
from __future__ import annotations

import asyncio
import logging
from typing import Any, AsyncIterator, Optional, Union

import zmq.asyncio

from actorserve.runtime.client import PromptInput, ZmqClient
from actorserve.runtime.config import EngineConfig
from actorserve.runtime.engine.beam_search import BeamSearchParams
from actorserve.runtime.engine.outputs import RequestOutput
from actorserve.runtime.engine.sampling_params import SamplingParams
from actorserve.runtime.engine.sleep import check_level, check_tags
from actorserve.runtime.errors import EngineDeadError, EngineStartError
from actorserve.runtime.launcher import Launcher, launcher_for
from actorserve.runtime.logs import setup_logging
from actorserve.runtime.resolve import resolve
from actorserve.runtime.transport.messages import HealthPong

log = logging.getLogger("actorserve")


class AsyncEngine:
    def __init__(self, model: Optional[str] = None, **engine_args: Any) -> None:
        self._init(EngineConfig.from_engine_args(model, **engine_args))  # (_init resolves it)

    @classmethod
    def from_config(cls, config: EngineConfig) -> "AsyncEngine":
        engine = cls.__new__(cls)
        engine._init(config)
        return engine

    def _init(self, config: EngineConfig) -> None:
        config = resolve(config)
        setup_logging(config.runtime.log_level)
        self._client_options = None
        if config.runtime.curve_secret_key is not None:  # this client's own key pair, admitted by the server
            config, self._client_options = _with_launcher_key(config)
        self.config = config
        self._ctx = zmq.asyncio.Context()
        self._launcher: Optional[Launcher] = None
        self._client: Optional[ZmqClient] = None
        self._starting: Optional[asyncio.Future] = None  # the one start, shared by every caller
        self._dead: Optional[EngineDeadError] = None
        self._dead_event: Optional[asyncio.Event] = None
        self._closed = False

    @classmethod
    async def create(cls, model: Optional[str] = None, **engine_args: Any) -> "AsyncEngine":
        engine = cls(model, **engine_args)
        await engine.start()
        return engine

    async def start(self) -> None:
        """Launch the actors and wait until they are ready; a start-up failure raises here, promptly.

        The rule: an engine starts at most once. Every caller that arrives while it starts waits for the
        same start, and if that start fails, each of them, and every later call, gets the same
        EngineStartError; to try again, make a new AsyncEngine. (A caller that gives up waiting does not
        stop the start for the others.)"""
        if self._starting is None:
            if self._closed:
                raise EngineDeadError("the engine is closed")
            if self._dead_event is None:
                self._dead_event = asyncio.Event()
            self._starting = asyncio.ensure_future(self._launch())
        await asyncio.shield(self._starting)

    async def _launch(self) -> None:
        launcher = launcher_for(self.config, self._ctx)
        try:
            await launcher.start(self._on_death)
        except EngineStartError as exc:
            self._dead = exc
            self._dead_event.set()
            raise
        except BaseException as exc:
            self._dead = EngineStartError(f"the engine failed to start: {type(exc).__name__}: {exc}")
            self._dead_event.set()
            raise self._dead from exc
        self._client = ZmqClient(launcher.addresses.client, self._ctx, watch_connection=False,  # supervised
                                 api_key=self.config.runtime.client_api_key, configure=self._client_options,
                                 backlog=self.config.runtime.stream_backlog,
                                 stall_timeout=self.config.runtime.stream_stall_timeout)
        self._launcher = launcher

    @property
    def is_dead(self) -> bool:
        return self._dead is not None

    @property
    def death(self) -> Optional[EngineDeadError]:
        """What ended the engine (its start's failure, a process's death, close); None while it serves."""
        return self._dead

    def replica_states(self) -> list[dict[str, Any]]:
        """For /health: this one engine ring, alive or not and why (DataParallelEngine lists several)."""
        return [{"rank": self.config.parallel.data_parallel_rank, "alive": self._dead is None,
                 **({"error": str(self._dead)} if self._dead is not None else {})}]

    @property
    def info(self) -> dict:
        """What the scheduler reported at start-up (vocab_size, max_model_len, num_kv_blocks)."""
        return self._launcher.info if self._launcher is not None else {}

    def child_pids(self) -> dict[str, int]:
        return self._launcher.pids() if self._launcher is not None else {}

    def _on_death(self, name: str, what: str) -> None:
        self._dead = EngineDeadError(f"the engine is dead: {what}")
        self._dead_event.set()
        if self._client is not None:
            self._client.fail_all(self._dead)

    async def wait_dead(self) -> EngineDeadError:
        """Returns once a child has died or the start failed (for launchers that serve until then)."""
        if self._dead_event is None:
            self._dead_event = asyncio.Event()
        await self._dead_event.wait()
        return self._dead

    async def generate(self, prompt: PromptInput, sampling_params: Union[SamplingParams, BeamSearchParams, None] = None,
                       request_id: Optional[str] = None) -> AsyncIterator[RequestOutput]:
        """Stream cumulative RequestOutputs; cancelling or leaving the loop aborts the request. With
        BeamSearchParams, one output at the search's end: its best sequences, best first."""
        if self._dead is not None:
            raise self._dead
        await self.start()
        async for out in self._client.generate(prompt, sampling_params, request_id):
            yield out

    async def abort(self, request_id: str) -> None:
        if self._client is not None:
            await self._client.abort(request_id)

    async def check_health(self) -> HealthPong:
        """The scheduler's answer (running, waiting, KV usage); EngineDeadError if a process died or the
        scheduler's loop does not answer in time."""
        if self._dead is not None:
            raise self._dead
        await self.start()
        try:
            return await self._client.check_health(self.config.runtime.health_timeout)
        except asyncio.TimeoutError:
            raise EngineDeadError(f"the scheduler did not answer a health ping in "
                                  f"{self.config.runtime.health_timeout} s") from None

    # -- sleep mode (vLLM's API) ------------------------------------------------------------------------
    async def sleep(self, level: int = 1) -> None:
        """Give back the KV cache's and the weights' memory (level 1 keeps a backing copy of the weights,
        level 2 reloads them on wake-up). The step in flight finishes; requests in flight wait, and are
        computed again after wake-up. Needs enable_sleep_mode."""
        check_level(level)
        await self._sleep_call(lambda client: client.sleep(level, self.config.runtime.start_timeout))

    async def wake_up(self, tags: Optional[list[str]] = None) -> None:
        """Restore ``tags`` ("weights", "kv_cache"; None: both); the engine serves again once both are back."""
        check_tags(tags)
        await self._sleep_call(lambda client: client.wake_up(tags, self.config.runtime.start_timeout))

    async def is_sleeping(self) -> bool:
        return (await self._sleep_call(lambda client: client.sleep_status(self.config.runtime.health_timeout))).sleeping

    async def _sleep_call(self, call):
        if not self.config.runtime.enable_sleep_mode:
            raise ValueError("sleep mode is off: start the engine with enable_sleep_mode=True")
        if self._dead is not None:
            raise self._dead
        await self.start()
        return await call(self._client)

    async def close(self) -> None:
        """Abort what is in flight, stop every actor, and wait for the processes (within the deadline)."""
        if self._closed:
            return
        self._closed = True
        if self._starting is not None and not self._starting.done():
            self._starting.cancel()  # the launcher kills what it had started
            await asyncio.gather(self._starting, return_exceptions=True)
        if self._launcher is not None:
            if self._dead is None:
                self._client.fail_all(EngineDeadError("the engine was closed"))
            await self._launcher.stop("close")
            await self._client.close()
        self._ctx.term()

    async def __aenter__(self) -> "AsyncEngine":
        await self.start()
        return self

    async def __aexit__(self, *exc_info) -> None:
        await self.close()


def _with_launcher_key(config: EngineConfig):
    """A fresh CurveZMQ key pair for the embedded client: the public half goes to the server in the config."""
    import dataclasses

    import zmq.auth

    from actorserve.runtime.transport.client_security import curve_keys

    public, secret = zmq.curve_keypair()
    server_public, _ = zmq.auth.load_certificate(config.runtime.curve_secret_key)
    runtime = dataclasses.replace(config.runtime, curve_launcher_key=public.decode())
    return dataclasses.replace(config, runtime=runtime), curve_keys(server_public, public, secret)
