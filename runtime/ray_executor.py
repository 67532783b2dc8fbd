"""The Ray executor (``distributed_executor_backend="ray"``): the scheduler and the worker stages as Ray
actors, placed by one placement group with a bundle per stage.

Runs in the launcher. It joins a running cluster (``RAY_ADDRESS``, ``ray start --head``'s file) or starts a
local one when there is none; the placement group reserves each stage's cores (or GPU), and the scheduler
goes beside stage 0, asking for no cores of its own. Each actor is an ``ActorHost`` that runs one of the
engine's actors on its loop, so the actors, the messages and the transport are the multiprocess engine's:
ZMQ over tcp:// on the nodes' addresses, which the hosts report, and torch.distributed between stages
(the same retained-send FIFO) with stage 0's node as the rendezvous. The cluster's network is trusted, as
Ray's own is. Shutdown goes to the scheduler through its host, never over the network.

Supervision: each host's ``wait_stopped`` call ends when its actor stops or its process dies, and a
liveness ping, answered on a thread of its own, sees a node that is gone (or a process that is frozen)
within ``RAY_LIVENESS_S``; either way every open stream fails with EngineDeadError. Teardown removes the
placement group, then waits until Ray reports the bundles' resources free again (or raises, naming what
is missing), so that the next engine in this process finds them.
"""
from __future__ import annotations

import asyncio
import logging
import os
import shutil
import tempfile
import time
from typing import Callable, Optional

import zmq.asyncio

from actorserve.runtime.transport.addresses import Addresses, free_ports
from actorserve.runtime.config import EngineConfig
from actorserve.runtime.errors import EngineStartError
from actorserve.runtime.process import checkout_path, held_libraries

log = logging.getLogger("actorserve.ray")

RAY_LIVENESS_S = 1.5  # a ping unanswered this long: the actor's node is gone, or its process frozen
_PING_EVERY_S = 0.25
_RESOURCES_TIMEOUT_S = 30.0


def _ray():
    try:
        import ray
    except ImportError:
        raise EngineStartError("distributed_executor_backend='ray' needs Ray: pip install 'actorserve[ray]'") from None
    return ray


class ActorHost:
    """A Ray actor that runs one engine actor (the scheduler or a worker stage) on its event loop."""

    def __init__(self, log_level: str, name: str) -> None:
        from actorserve.runtime.logs import setup_logging

        setup_logging(log_level, name)
        self.name, self.actor, self.task = name, None, None
        self._beat = time.monotonic()

    def node_ports(self, count: int) -> tuple[str, list[int]]:
        """This node's address and ``count`` distinct free ports on it."""
        import ray

        ip = ray.util.get_node_ip_address()
        return ip, free_ports(ip, count)

    async def start(self, role: str, config: EngineConfig, addresses: Addresses, rank: int) -> dict:
        """Build the actor and run it; returns its ready info, or raises what stopped its start."""
        from actorserve.runtime.actors.scheduler_actor import SchedulerActor
        from actorserve.runtime.actors.worker_actor import WorkerActor

        ctx = zmq.asyncio.Context()
        if role == "scheduler":  # its control socket stays on this node: Shutdown comes through ``shutdown``
            folder = tempfile.mkdtemp(prefix="actorserve-ray-")
            self.actor = SchedulerActor(ctx, config, _with_control(addresses, "ipc://" + folder + "/control"))
        else:
            folder, self.actor = None, WorkerActor(ctx, config, addresses, rank)
        loop = asyncio.get_running_loop()
        ready = loop.create_future()
        self.task = asyncio.ensure_future(self.actor.run(lambda info: ready.done() or ready.set_result(info)))
        if folder is not None:
            self.task.add_done_callback(lambda _: shutil.rmtree(folder, ignore_errors=True))
        self.task.add_done_callback(lambda t: ready.done() or ready.set_exception(
            EngineStartError(f"{self.name}: {t.exception()!r}" if not t.cancelled() and t.exception()
                             else f"{self.name} stopped while starting")))
        asyncio.ensure_future(self._beat_loop())
        return await ready

    async def _beat_loop(self) -> None:
        while True:
            self._beat = time.monotonic()
            await asyncio.sleep(_PING_EVERY_S)

    async def wait_stopped(self) -> Optional[str]:
        """Ends when the actor stops: None after a clean stop, else why it failed."""
        await asyncio.shield(self.task)
        return None if self.actor.failed is None else repr(self.actor.failed)

    async def ping(self) -> float:
        """Seconds since this actor's loop last turned (answered on the health group's own loop and thread)."""
        return time.monotonic() - self._beat

    def pid(self) -> int:
        return os.getpid()

    async def shutdown(self, reason: str) -> None:
        """The launcher's Shutdown, put straight into the scheduler's mailbox as its control channel."""
        from actorserve.runtime.transport.channel import Envelope
        from actorserve.runtime.transport.messages import Shutdown

        if self.actor is not None and self.actor.mailbox is not None:
            self.actor.mailbox.put_nowait(Envelope(Shutdown(reason), via="control"))


def _with_control(addresses: Addresses, control: str) -> Addresses:
    return Addresses(addresses.client, addresses.scheduler_in, addresses.worker_in, control)


class RayLauncher:
    """The actors as Ray actors: a ``Launcher`` (start, stop, pids) as the multiprocess one is."""

    def __init__(self, config: EngineConfig, ctx: zmq.asyncio.Context) -> None:
        self.config = config
        self.size = config.parallel.pipeline_parallel_size
        self.addresses: Optional[Addresses] = None
        self.info: dict = {}
        self.placement_group = None
        self._hosts: list = []  # stage 0 .. P-1, then the scheduler
        self._names: list[str] = []
        self._pids: dict[str, int] = {}
        self._reserved: dict[str, float] = {}
        self._watch: Optional[asyncio.Task] = None
        self._closing = False
        self._freed_to: Optional[dict[str, float]] = None  # removed: the free resources to wait for

    async def start(self, on_death: Callable[[str, str], None]) -> None:
        ray = _ray()
        if not ray.is_initialized():
            # no address: RAY_ADDRESS, else the cluster `ray start` left on this machine, else a new local one
            ray.init(include_dashboard=False, runtime_env=_runtime_env())
        try:
            await self._place(ray)
            await self._start_actors(ray)
        except BaseException:
            await self._teardown(ray, quick=False)  # a failed start leaves the cluster as it found it
            raise
        self._watch = asyncio.ensure_future(self._supervise(ray, on_death))

    async def _place(self, ray) -> None:
        from ray.util.placement_group import placement_group

        bundle = _bundle(self.config, ray.cluster_resources())
        for key, amount in bundle.items():
            self._reserved[key] = amount * self.size
        started = time.monotonic()
        self.placement_group = placement_group([dict(bundle) for _ in range(self.size)], strategy="PACK")
        ready, _ = await asyncio.get_running_loop().run_in_executor(
            None, lambda: ray.wait([self.placement_group.ready()], timeout=self.config.runtime.start_timeout))
        if not ready:
            raise EngineStartError(f"Ray could not place {self.size} bundle(s) of {bundle} within "
                                   f"{self.config.runtime.start_timeout:g} s (the cluster has "
                                   f"{ray.available_resources()} free)")
        log.info("Ray placed %d bundle(s) of %s in %.2f s", self.size, bundle, time.monotonic() - started)

    async def _start_actors(self, ray) -> None:
        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

        remote = ray.remote(concurrency_groups={"health": 1})(ActorHost)
        level = self.config.runtime.log_level
        dp = self.config.parallel.data_parallel_rank
        suffix = f"-dp{dp}" if dp else ""
        self._names = [f"worker{rank}{suffix}" for rank in range(self.size)] + [f"scheduler{suffix}"]
        runtime_env = _runtime_env(held_libraries(self.config))
        for index, name in enumerate(self._names):
            stage = index < self.size  # the scheduler (last) goes in stage 0's bundle, asking for nothing
            strategy = PlacementGroupSchedulingStrategy(self.placement_group,
                                                        placement_group_bundle_index=index if stage else 0)
            share = {k: v / self.size if stage else 0 for k, v in self._reserved.items()}
            self._hosts.append(remote.options(num_cpus=share.get("CPU", 0), num_gpus=share.get("GPU", 0),
                                              scheduling_strategy=strategy, runtime_env=runtime_env)
                               .remote(level, name))
        # the scheduler shares stage 0's bundle, so one node holds all four listeners: one pick keeps them apart
        (node,) = await _gather(ray, [self._hosts[-1].node_ports.remote(4)])
        self._pids = dict(zip(self._names, await _gather(ray, [h.pid.remote() for h in self._hosts])))
        config, self.addresses = _wired(self.config, node)
        jobs = [h.start.remote("worker", config, self.addresses, rank) for rank, h in enumerate(self._hosts[:-1])]
        jobs.append(self._hosts[-1].start.remote("scheduler", config, self.addresses, 0))
        try:
            infos = await asyncio.wait_for(_gather(ray, jobs), self.config.runtime.start_timeout)
        except asyncio.TimeoutError:
            raise EngineStartError(f"the engine did not start within {self.config.runtime.start_timeout:.0f} s")
        except ray.exceptions.RayTaskError as exc:
            raise EngineStartError(str(exc.cause if exc.cause is not None else exc)) from None
        except ray.exceptions.RayActorError as exc:
            raise EngineStartError(f"a Ray actor of the engine died while starting: {exc}") from None
        self.info = infos[-1]

    async def _supervise(self, ray, on_death: Callable[[str, str], None]) -> None:
        """Until close: a host's end (its actor stopped, or its process died) or an unanswered ping is a
        death; the others are then killed."""
        loop = asyncio.get_running_loop()
        stops = {asyncio.wrap_future(h.wait_stopped.remote().future()): name
                 for h, name in zip(self._hosts, self._names)}
        answered = {name: loop.time() for name in self._names}
        pings: dict = {}
        what = None
        while what is None:
            for host, name in zip(self._hosts, self._names):
                if name not in pings.values():
                    pings[asyncio.wrap_future(host.ping.options(concurrency_group="health").remote().future())] = name
            done, _ = await asyncio.wait(list(stops) + list(pings), timeout=_PING_EVERY_S,
                                         return_when=asyncio.FIRST_COMPLETED)
            for fut in done:
                if fut in stops:
                    what = _stopped(stops[fut], fut)
                    break
                name = pings.pop(fut)
                if fut.exception() is None and fut.result() < self.config.runtime.hang_timeout:
                    answered[name] = loop.time()
            silent = next((n for n, t in answered.items() if loop.time() - t > RAY_LIVENESS_S), None)
            if what is None and silent is not None:
                what = (silent, f"{silent} stopped answering for {RAY_LIVENESS_S:g} s (its node is gone, or its "
                                f"process is frozen or hung)")
        for fut in list(stops) + list(pings):  # what is left unanswered is of no interest now
            if not fut.done():
                fut.cancel()
            elif not fut.cancelled():
                fut.exception()
        if self._closing:
            return
        log.error("%s; the engine is dead", what[1])
        on_death(*what)
        await self._teardown(ray, quick=True)

    def pids(self) -> dict[str, int]:
        return dict(self._pids)

    async def stop(self, reason: str = "close") -> None:
        """Ask the scheduler to abort what is in flight and stop, wait for the actors, then free the
        placement group and wait until its resources are free again."""
        ray = _ray()
        self._closing = True
        if self._watch is not None and not self._watch.done() and self._hosts:
            try:
                await _gather(ray, [self._hosts[-1].shutdown.remote(reason)])
                stops = [h.wait_stopped.remote() for h in self._hosts]
                await asyncio.wait_for(_gather(ray, stops), self.config.runtime.shutdown_timeout)
            except (asyncio.TimeoutError, ray.exceptions.RayError) as exc:
                log.warning("the engine did not stop cleanly (%s); killing its actors", exc)
        if self._watch is not None:
            self._watch.cancel()
            await asyncio.gather(self._watch, return_exceptions=True)
        await self._teardown(ray, quick=False)

    async def _teardown(self, ray, quick: bool) -> None:
        """Kill the actors and remove the placement group; unless ``quick``, wait for its resources."""
        self._closing = True
        for host in self._hosts:
            ray.kill(host, no_restart=True)
        self._hosts = []
        if self.placement_group is not None:
            from ray.util.placement_group import remove_placement_group

            free, total = ray.available_resources(), ray.cluster_resources()
            self._freed_to = {k: min(free.get(k, 0.0) + v, total.get(k, 0.0)) for k, v in self._reserved.items()}
            remove_placement_group(self.placement_group)
            self.placement_group = None
        if not quick and self._freed_to is not None:
            await _resources_back(ray, self._freed_to, _RESOURCES_TIMEOUT_S)
            self._freed_to = None


def _bundle(config: EngineConfig, cluster: dict) -> dict[str, float]:
    """One stage's reservation: a GPU on CUDA, else its cores (threads_per_worker, or the cluster's cores
    shared out over every stage of every replica)."""
    if config.device.device.startswith("cuda") or (config.device.device == "auto" and cluster.get("GPU")):
        return {"GPU": 1.0, "CPU": 1.0}
    parallel = config.parallel
    threads = parallel.threads_per_worker or max(
        1, int(cluster.get("CPU", 1)) // (parallel.pipeline_parallel_size * parallel.data_parallel_size))
    return {"CPU": float(threads)}


def _wired(config: EngineConfig, node: tuple[str, list[int]]) -> tuple[EngineConfig, Addresses]:
    """Addresses on the node of the scheduler and stage 0, stage 0 the pipeline's rendezvous."""
    import dataclasses

    ip, (client_port, scheduler_port, worker_port, master_port) = node
    client = config.runtime.client_address or f"tcp://{ip}:{client_port}"
    addresses = Addresses(client, f"tcp://{ip}:{scheduler_port}", f"tcp://{ip}:{worker_port}", "unused://control")
    parallel = dataclasses.replace(config.parallel, master_addr=ip, master_port=master_port)
    return dataclasses.replace(config, parallel=parallel), addresses


def _stopped(name: str, fut: asyncio.Future) -> tuple[str, str]:
    exc = fut.exception()
    if exc is not None:
        return name, f"{name} died ({type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''})"
    failed = fut.result()
    return name, f"{name} stopped" + (f": {failed}" if failed else "")


async def _gather(ray, refs: list) -> list:
    return await asyncio.gather(*(asyncio.wrap_future(r.future()) for r in refs))


async def _resources_back(ray, freed_to: dict[str, float], timeout: float) -> None:
    """Wait until Ray reports free what was free when the placement group was removed plus what it held
    (vLLM's teardown lesson: the next engine in this process must not fail for resources that are still
    being freed). Counted from what was free, not from nothing: where another engine's resources are free
    already, they must not pass for this one's."""
    deadline = time.monotonic() + timeout
    while True:
        free = ray.available_resources()
        missing = {k: v for k, v in freed_to.items() if free.get(k, 0.0) + 1e-9 < v}
        if not missing:
            return
        if time.monotonic() > deadline:
            raise RuntimeError(f"Ray did not free the engine's placement group within {timeout:g} s: still "
                               f"missing {missing} (free now: {free})")
        await asyncio.sleep(0.02)


def _runtime_env(env: Optional[dict[str, str]] = None) -> Optional[dict]:
    """Ray's runtime environment for the engine's actors: ``env`` (torch's libraries held, for an actor's
    own options), and a checkout's actors import the same actorserve as the launcher (``checkout_path``)."""
    env = {**(env or {}), **checkout_path()}
    return {"env_vars": env} if env else None
