"""Where each actor's inbox lives, derived once by the launcher and handed to every actor.

Multiprocess engines keep their ipc sockets in one private folder. The binder of each socket removes its
file when it closes, and the last one out removes the folder, so a launcher killed outright leaves
nothing behind. Until every child is ready, the launcher holds the folder with a mark file: a child that
fails at start-up and closes early must not take the folder from a sibling that has yet to bind there
(the launcher removes it when the start fails).
"""
from __future__ import annotations

import os
import random
import socket
from dataclasses import dataclass


LAUNCHER_MARK = "launcher"
# Ray's workers listen on 10002-19999 unless told otherwise; ports for the engine's sockets are looked for
# above them and below the kernel's ephemeral range
_FIRST_PORT = 20000
_EPHEMERAL_FALLBACK = (32768, 60999)


@dataclass(frozen=True)
class Addresses:
    client: str  # the scheduler's ROUTER: clients (the embedded engine, ZmqClient, raw programs)
    scheduler_in: str  # the scheduler's PULL: WorkerReady and StepResult from the last stage
    worker_in: str  # the first worker stage's PULL: ExecuteBatch (later stages hear from the one before)
    # the scheduler's PULL for the launcher alone (Shutdown): in the launcher's private folder (0700),
    # whatever address the client socket has
    control: str

    @classmethod
    def ipc(cls, directory: str, client: str | None = None) -> "Addresses":
        path = lambda name: "ipc://" + os.path.join(directory, name)  # noqa: E731
        return cls(client or path("client"), path("scheduler"), path("worker0"), path("control"))

    @property
    def folder(self) -> str | None:
        """The ipc folder, for addresses made by ``ipc``."""
        if not self.control.startswith("ipc://"):
            return None
        return os.path.dirname(self.control[len("ipc://"):])

    def hold_folder(self) -> None:
        with open(os.path.join(self.folder, LAUNCHER_MARK), "w") as f:
            f.write(str(os.getpid()))

    def release_folder(self) -> None:
        """Drop the launcher's mark, and the folder with it if no socket is left there."""
        if self.folder is None:
            return
        for remove, path in ((os.unlink, os.path.join(self.folder, LAUNCHER_MARK)), (os.rmdir, self.folder)):
            try:
                remove(path)
            except OSError:
                pass  # dropped already, or a socket is still there

    @classmethod
    def inproc(cls, tag: str) -> "Addresses":
        return cls(f"inproc://{tag}-client", f"inproc://{tag}-scheduler", f"inproc://{tag}-worker0",
                   f"inproc://{tag}-control")


def free_ports(host: str, count: int) -> list[int]:
    """``count`` distinct ports that a listener on ``host`` can bind now, for sockets that bind later.

    A free port is a promise that holds only until someone else binds it. A port taken with ``bind(0)``
    comes from the kernel's ephemeral range, where every outgoing connection on the machine (and Ray makes
    many) gets its own port too, so between the pick and the actor's bind a connect() can take it. These
    are picked at random below that range, where only other listeners go, and all in one call, so that
    they differ from each other. Where the ephemeral range leaves no room below it, ``bind(0)`` it is.
    """
    low = _ephemeral_range()[0]
    choices = random.SystemRandom()  # independent of any seed a program or a test sets
    held: list[socket.socket] = []
    try:
        for _ in range(count * 64 if low - _FIRST_PORT >= 1024 else 0):
            if len(held) == count:
                break
            s = socket.socket()
            try:
                s.bind((host, choices.randrange(_FIRST_PORT, low)))
            except OSError:
                s.close()  # taken, or lingering in TIME_WAIT
                continue
            held.append(s)
        while len(held) < count:
            s = socket.socket()
            s.bind((host, 0))
            held.append(s)
        return [s.getsockname()[1] for s in held]
    finally:
        for s in held:
            s.close()


def _ephemeral_range() -> tuple[int, int]:
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
            low, high = (int(x) for x in f.read().split())
        return low, high
    except (OSError, ValueError):
        return _EPHEMERAL_FALLBACK
