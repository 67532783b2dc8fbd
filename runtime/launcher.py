"""Start an engine's actors and stop them: the one launcher interface, and the launcher a config names.

Runs in the process that starts the engine (``AsyncEngine``, the one client of a launcher). Three launchers
keep the same promise (``Launcher``): multiprocess (worker and scheduler start at once as supervised child
processes, the worker loading weights while the scheduler loads the tokenizer, and each reports ready),
in-loop (the same actors as tasks on the caller's loop over inproc:// sockets, ``mode="inprocess"``), and
Ray (the actors as Ray actors, ``runtime/ray_executor.py``). ``launcher_for`` picks one, once.
"""
from __future__ import annotations

import asyncio
import dataclasses
import tempfile
import uuid
from typing import Callable, Optional, Protocol

import zmq.asyncio

from actorserve.runtime.transport.addresses import Addresses, free_ports
from actorserve.runtime.actors.scheduler_actor import SchedulerActor
from actorserve.runtime.actors.worker_actor import WorkerActor
from actorserve.runtime.config import EngineConfig
from actorserve.runtime.process import ChildSpec
from actorserve.runtime.errors import EngineStartError
from actorserve.runtime.supervisor import Supervisor
from actorserve.runtime.transport.channel import Channel
from actorserve.runtime.transport.messages import Shutdown


class Launcher(Protocol):
    """What ``AsyncEngine`` needs of the actors' launcher: start them (``on_death(name, why)`` is called if
    one dies after the start), the address of the scheduler's client socket and what it reported when
    ready, their process ids, and a stop that lets the scheduler abort what is in flight."""

    config: EngineConfig
    addresses: Addresses
    info: dict

    async def start(self, on_death: Callable[[str, str], None]) -> None: ...

    async def stop(self, reason: str = "close") -> None: ...

    def pids(self) -> dict[str, int]: ...


def launcher_for(config: EngineConfig, ctx: zmq.asyncio.Context) -> Launcher:
    if config.runtime.mode == "inprocess":
        return InLoopLauncher(config, ctx)
    if config.parallel.distributed_executor_backend == "ray":
        from actorserve.runtime.ray_executor import RayLauncher  # ray is an extra

        return RayLauncher(config, ctx)
    return MultiprocessLauncher(config, ctx)


class _Control:
    """The launcher's end of the scheduler's control socket: the only way to send Shutdown."""

    def __init__(self, ctx: zmq.asyncio.Context, addresses: Addresses) -> None:
        self._ctx, self._address = ctx, addresses.control
        self._channel: Optional[Channel] = None

    async def shutdown(self, reason: str) -> None:
        if self._channel is None:
            self._channel = Channel(self._ctx, "push", self._address, bind=False)
        await self._channel.send(Shutdown(reason))

    def close(self) -> None:
        if self._channel is not None:
            self._channel.close()


class MultiprocessLauncher:
    """The actors in child processes under a Supervisor."""

    def __init__(self, config: EngineConfig, ctx: zmq.asyncio.Context) -> None:
        parallel = config.parallel
        if parallel.pipeline_parallel_size > 1 and parallel.master_port is None:
            port = free_ports("127.0.0.1", 1)[0]
            config = dataclasses.replace(config, parallel=dataclasses.replace(parallel, master_port=port))
        self.config = config
        self.size = config.parallel.pipeline_parallel_size
        self.directory = tempfile.mkdtemp(prefix="actorserve-")
        self.addresses = Addresses.ipc(self.directory, config.runtime.client_address)
        self.addresses.hold_folder()
        self.supervisor = Supervisor(self.directory, config.runtime.hang_timeout, config.runtime.heartbeat_interval)
        self.control = _Control(ctx, self.addresses)
        self.info: dict = {}

    async def start(self, on_death: Callable[[str, str], None]) -> None:
        dp = self.config.parallel.data_parallel_rank
        suffix = f"-dp{dp}" if dp else ""  # replica 0 keeps the plain names
        for rank in range(self.size):
            self.supervisor.spawn(ChildSpec(f"worker{rank}{suffix}", "worker", self.config, self.addresses, rank))
        self.supervisor.spawn(ChildSpec(f"scheduler{suffix}", "scheduler", self.config, self.addresses))
        try:
            self.info = (await self.supervisor.wait_ready(self.config.runtime.start_timeout))[f"scheduler{suffix}"]
        except BaseException:
            self.supervisor.kill_all()
            raise
        self.addresses.release_folder()  # every socket is bound: from now on the last child out removes it
        self.supervisor.watch(on_death)

    def pids(self) -> dict[str, int]:
        return {c.name: c.process.pid for c in self.supervisor.children}

    async def stop(self, reason: str = "close") -> None:
        """Ask the scheduler to abort what is in flight and stop (a dead engine is not asked), then wait."""
        if not self.supervisor.closing:
            await self.control.shutdown(reason)
        try:
            await self.supervisor.shutdown(self.config.runtime.shutdown_timeout)
        finally:
            self.control.close()


class InLoopLauncher:
    """The same actors as tasks on the caller's loop, for tests and debugging."""

    def __init__(self, config: EngineConfig, ctx: zmq.asyncio.Context) -> None:
        self.config = config
        self.addresses = Addresses.inproc(uuid.uuid4().hex[:8])
        self.actors = [WorkerActor(ctx, config, self.addresses, 0), SchedulerActor(ctx, config, self.addresses)]
        self.control = _Control(ctx, self.addresses)
        self.tasks: list[asyncio.Task] = []
        self.info: dict = {}

    async def start(self, on_death: Callable[[str, str], None]) -> None:
        loop = asyncio.get_running_loop()
        ready = [loop.create_future() for _ in self.actors]
        for actor, fut in zip(self.actors, ready):
            task = asyncio.ensure_future(actor.run(lambda info, fut=fut: fut.set_result(info)))
            task.add_done_callback(lambda t, a=actor, f=fut: self._ended(t, a, f, on_death))
            self.tasks.append(task)
            await asyncio.sleep(0)  # bind each inbox before the next actor connects to it
        try:
            self.info = (await asyncio.wait_for(asyncio.gather(*ready), self.config.runtime.start_timeout))[1]
        except BaseException:
            await self.stop()
            raise

    def _ended(self, task: asyncio.Task, actor, ready: asyncio.Future, on_death) -> None:
        error = None if task.cancelled() else task.exception()
        if not ready.done():
            ready.set_exception(EngineStartError(f"{actor.name}: {error!r}" if error else f"{actor.name} stopped"))
        elif error is not None or actor.failed is not None:
            on_death(actor.name, f"{actor.name} stopped: {error or actor.failed!r}")

    def pids(self) -> dict[str, int]:
        return {}

    async def stop(self, reason: str = "close") -> None:
        if self.tasks and not any(t.done() for t in self.tasks):
            await self.control.shutdown(reason)
            await asyncio.wait(self.tasks, timeout=self.config.runtime.shutdown_timeout)
        for actor in self.actors:
            actor.stop()
        if self.tasks:
            await asyncio.wait(self.tasks, timeout=self.config.runtime.shutdown_timeout)
        for task in self.tasks:
            task.cancel()
        self.control.close()
