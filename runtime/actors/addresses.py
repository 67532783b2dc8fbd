"""Where each actor's inbox lives, derived once by the launcher and handed to every actor."""
from __future__ import annotations

import os
from dataclasses import dataclass


@dataclass(frozen=True)
class Addresses:
    client: str  # the scheduler's ROUTER: clients (the embedded engine, ZmqClient, raw programs)
    scheduler_in: str  # the scheduler's PULL: WorkerReady and StepResult from the last stage
    worker_in: tuple[str, ...]  # each worker stage's PULL: ExecuteBatch

    @classmethod
    def ipc(cls, directory: str, num_workers: int, client: str | None = None) -> "Addresses":
        path = lambda name: "ipc://" + os.path.join(directory, name)  # noqa: E731
        return cls(client or path("client"), path("scheduler"), tuple(path(f"worker{i}") for i in range(num_workers)))

    @classmethod
    def inproc(cls, tag: str, num_workers: int) -> "Addresses":
        return cls(f"inproc://{tag}-client", f"inproc://{tag}-scheduler",
                   tuple(f"inproc://{tag}-worker{i}" for i in range(num_workers)))
