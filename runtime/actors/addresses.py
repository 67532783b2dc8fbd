"""Where each actor's inbox lives, derived once by the launcher and handed to every actor.

Multiprocess engines keep their ipc sockets in one private folder. The binder of each socket removes its
file when it closes, and the last one out removes the folder, so a launcher killed outright leaves
nothing behind. Until every child is ready, the launcher holds the folder with a mark file: a child that
fails at start-up and closes early must not take the folder from a sibling that has yet to bind there
(the launcher removes it when the start fails).
"""
from __future__ import annotations

import os
from dataclasses import dataclass


LAUNCHER_MARK = "launcher"


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
