"""Spawning an actor as a child process: ready handshake, death pipe, signals.

The launcher calls ``spawn``: a fresh interpreter runs ``python -m actorserve.runtime.process`` (so the caller's
``__main__`` is never re-imported, guard or no guard), reads its typed ChildSpec from stdin, builds its
actor on a uvloop loop, and reports ``{"kind": "ready" | "error", ...}`` as one JSON line on the ready
pipe, then beats on the same pipe (``runtime.liveness``: the supervisor's hang detection). It stops on SIGTERM,
when the launcher's end of the death pipe closes (the launcher died), or when its actor stops. SIGINT is
left to the launcher, which drives shutdown for the whole engine.
"""
from __future__ import annotations

import asyncio
import ctypes
import json
import logging
import os
import signal
import subprocess
import sys
from dataclasses import dataclass
from typing import Any, Optional

import msgspec

from actorserve import SOURCE_ROOT
from actorserve.kernels.capability import library_env
from actorserve.runtime.actors.addresses import Addresses
from actorserve.runtime.config import EngineConfig, environment
from actorserve.runtime.liveness import Heartbeat
from actorserve.runtime.logs import setup_logging

log = logging.getLogger("actorserve.process")

_PR_SET_PDEATHSIG = 1


class ChildSpec(msgspec.Struct, frozen=True):
    name: str
    role: str  # "worker" or "scheduler"
    config: EngineConfig
    addresses: Addresses
    rank: int = 0
    parent_pid: int = 0


@dataclass
class Child:
    name: str
    process: subprocess.Popen
    ready: Any  # the launcher's end of the ready pipe (a binary file)
    death_fd: int  # held open by the launcher; its closing tells the child the launcher is gone
    sentinel: int  # a pidfd: readable once the child has exited

    def alive(self) -> bool:
        return self.process.poll() is None

    @property
    def exitcode(self) -> Optional[int]:
        return self.process.poll()


def held_libraries(config: EngineConfig) -> dict[str, str]:
    """The variables that start an engine process with torch's libraries held at the level the capability
    gates see (``capability.library_env``: a CPU override emulates the lesser CPU whole in the engine's
    processes, local children and Ray actors alike), less those the caller has set."""
    device = config.device
    if device.cpu_paths is None:
        return {}
    held = library_env(device.cpu_isa, device.cpu_paths.hardware_isa)
    caller = environment()
    return {name: value for name, value in held.items() if name not in caller}


def checkout_path() -> dict[str, str]:
    """Where actorserve runs from a checkout: the PYTHONPATH under which an engine process (a child or a Ray
    actor) imports the same actorserve as its launcher; else nothing."""
    if SOURCE_ROOT is None:
        return {}
    return {"PYTHONPATH": os.pathsep.join(p for p in (SOURCE_ROOT, environment().get("PYTHONPATH")) if p)}


def child_env(config: EngineConfig) -> dict[str, str]:
    """A child's environment: this process's, with torch's libraries held (``held_libraries``), and this
    checkout on the path (``checkout_path``)."""
    return {**environment(), **held_libraries(config), **checkout_path()}


def spawn(spec: ChildSpec) -> Child:
    ready_r, ready_w = os.pipe()
    death_r, death_w = os.pipe()
    env = child_env(spec.config)
    process = subprocess.Popen(
        [sys.executable, "-m", "actorserve.runtime.process", str(ready_w), str(death_r), spec.name],  # name: for ps
        stdin=subprocess.PIPE, pass_fds=(ready_w, death_r), env=env,
    )
    os.close(ready_w)
    os.close(death_r)
    process.stdin.write(msgspec.json.encode(msgspec.structs.replace(spec, parent_pid=os.getpid())))
    process.stdin.close()
    return Child(spec.name, process, os.fdopen(ready_r, "rb", buffering=0), death_w, os.pidfd_open(process.pid))


def _main() -> int:
    ready_fd, death_fd = int(sys.argv[1]), int(sys.argv[2])
    spec = msgspec.json.decode(sys.stdin.buffer.read(), type=ChildSpec)
    _die_with_parent(spec.parent_pid)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    setup_logging(spec.config.runtime.log_level, spec.name)
    import uvloop

    with os.fdopen(ready_fd, "wb", buffering=0) as ready:
        return uvloop.run(_run(spec, ready, death_fd))


async def _run(spec: ChildSpec, ready, death_fd: int) -> int:
    import zmq.asyncio

    from actorserve.runtime.actors.scheduler_actor import SchedulerActor
    from actorserve.runtime.actors.worker_actor import WorkerActor

    loop = asyncio.get_running_loop()
    zctx = zmq.asyncio.Context()
    reported = False

    def report(kind: str, **fields) -> None:
        ready.write(json.dumps({"kind": kind, **fields}).encode() + b"\n")

    def on_ready(info: dict) -> None:
        nonlocal reported
        report("ready", info=info)
        reported = True
        heartbeat.start(loop)

    heartbeat = Heartbeat(ready.fileno(), spec.config.runtime.heartbeat_interval)

    try:
        if spec.role == "worker":
            actor = WorkerActor(zctx, spec.config, spec.addresses, spec.rank)
        else:
            actor = SchedulerActor(zctx, spec.config, spec.addresses)
        loop.add_signal_handler(signal.SIGTERM, actor.stop)
        loop.add_reader(death_fd, _on_launcher_gone, loop, death_fd, actor)
        await actor.run(on_ready)
        return 1 if actor.failed is not None else 0
    except Exception as exc:
        log.exception("%s failed", spec.name)
        if not reported:
            report("error", message=f"{spec.name}: {type(exc).__name__}: {exc}")
        return 1
    finally:
        heartbeat.stop()
        zctx.term()


def _on_launcher_gone(loop, death_fd: int, actor) -> None:
    loop.remove_reader(death_fd)
    actor.stop()


def _die_with_parent(parent_pid: int) -> None:
    """Ask Linux to SIGTERM us when the launcher exits, and check it had not already gone."""
    try:
        libc = ctypes.CDLL("libc.so.6", use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)
    except OSError:
        pass  # not Linux: the death pipe alone does it
    if os.getppid() != parent_pid:
        os._exit(1)


if __name__ == "__main__":
    sys.exit(_main())
