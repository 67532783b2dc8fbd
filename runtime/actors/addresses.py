"""Where each actor's inbox lives, derived once by the launcher and handed to every actor."""
from __future__ import annotations

import os
from dataclasses import dataclass


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

    @classmethod
    def inproc(cls, tag: str) -> "Addresses":
        return cls(f"inproc://{tag}-client", f"inproc://{tag}-scheduler", f"inproc://{tag}-worker0",
                   f"inproc://{tag}-control")
