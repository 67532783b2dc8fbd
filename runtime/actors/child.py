"""An actor's process: ready handshake, heartbeat, death pipe, signals.

``runtime.process.spawn`` starts ``python -m actorserve.runtime.actors.child``, which reads its typed ChildSpec
from stdin, builds its actor on a uvloop loop, and reports ``{"kind": "ready" | "error", ...}`` as one JSON
line on the ready pipe, then beats on the same pipe (``runtime.liveness``: the supervisor's hang
detection). It stops on SIGTERM, when the launcher's end of the death pipe closes (the launcher died), or
when its actor stops. SIGINT is left to the launcher, which drives shutdown for the whole engine.
"""
from __future__ import annotations

import asyncio
import ctypes
import json
import logging
import os
import signal
import sys

import msgspec

from actorserve.runtime.liveness import Heartbeat
from actorserve.runtime.logs import setup_logging
from actorserve.runtime.process import ChildSpec

log = logging.getLogger("actorserve.process")

_PR_SET_PDEATHSIG = 1


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
