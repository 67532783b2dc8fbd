"""Spawning an actor as a child process: its spec, its environment, its pipes.

The launcher calls ``spawn``: a fresh interpreter runs ``python -m actorserve.runtime.actors.child`` (so the
caller's ``__main__`` is never re-imported, guard or no guard) with the ready pipe and the death pipe, and
reads its typed ChildSpec from stdin; what the child does with them is ``runtime/actors/child.py``'s.
"""
from __future__ import annotations

import os
import subprocess
import sys
from dataclasses import dataclass
from typing import Any, Optional

import msgspec

from actorserve import SOURCE_ROOT
from actorserve.kernels.capability import library_env
from actorserve.runtime.transport.addresses import Addresses
from actorserve.runtime.config import EngineConfig, environment


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
        [sys.executable, "-m", "actorserve.runtime.actors.child", str(ready_w), str(death_r), spec.name],  # for ps
        stdin=subprocess.PIPE, pass_fds=(ready_w, death_r), env=env,
    )
    os.close(ready_w)
    os.close(death_r)
    process.stdin.write(msgspec.json.encode(msgspec.structs.replace(spec, parent_pid=os.getpid())))
    process.stdin.close()
    return Child(spec.name, process, os.fdopen(ready_r, "rb", buffering=0), death_w, os.pidfd_open(process.pid))
