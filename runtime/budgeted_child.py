"""Work that a request's input decides the cost of, run in a process of its own within a time and memory
budget: a chat template (a program: a few hundred bytes of Jinja can loop for minutes or build gigabytes),
a grammar (a 1 MB ``choice`` compiles for minutes). A thread that runs one cannot be stopped; a process can.

``BudgetedChild`` keeps one spawned child for one kind of job, started ahead of the first (``start``):
- a job that runs past its seconds is abandoned: the child is killed, and a new one serves the next job;
- one that allocates past ``memory_bytes`` fails inside the child (its data segment is limited), which is
  then replaced, so that what it took goes back to the system;
- the handler may ask for a replacement itself (``Replace``), and any other exception it raises is the
  job's failure, the child kept.
Jobs and answers cross the pipe pickled: plain values (strings, lists, dicts). The handler is pickled to
the child once, at its start, and called there with each job.
"""
from __future__ import annotations

import contextlib
import multiprocessing
import os
import sys
import threading
from typing import Any, Callable, Optional

STARTUP_S = 60.0  # for a child to import what its handler needs, apart from a job's own budget


class Replace(Exception):
    """Raised by a handler: this job failed (its message says why), and the child is to be replaced."""


class ChildTimeout(Exception):
    """The job ran past its seconds (the child was replaced), or the child did not start in time."""


class ChildDied(Exception):
    """The child died while it ran the job (it was replaced)."""


class ChildOutOfMemory(Exception):
    """The job allocated past the child's memory budget (the child was replaced)."""


class JobFailed(Exception):
    """The handler raised: its message."""


class BudgetedChild:
    def __init__(self, name: str, handler: Callable[[Any], Any], memory_bytes: int) -> None:
        self.name, self.handler, self.memory_bytes = name, handler, memory_bytes
        self._lock = threading.Lock()  # one job at a time through the one child
        self._conn = None
        self._proc: Optional[multiprocessing.Process] = None
        self._ready = False  # the child said it is ready: a job's clock starts then, not at the child's start

    def start(self) -> None:
        """The child, ahead of the first job (its start imports what the handler needs)."""
        with self._lock:
            self._ensure()
            self._wait_ready()

    def run(self, job: Any, seconds: float) -> Any:
        """The handler's value for ``job``; JobFailed (the handler raised), ChildOutOfMemory, ChildTimeout
        (past ``seconds``) or ChildDied otherwise."""
        with self._lock:
            self._ensure()
            try:
                self._wait_ready()
                self._conn.send(job)
                if not self._conn.poll(seconds):
                    self._replace()
                    raise ChildTimeout(f"past {seconds:g} s")
                status, value, replace = self._conn.recv()
            except (EOFError, OSError, BrokenPipeError):
                self._replace()
                raise ChildDied(self.name) from None
            if replace:
                self._replace()  # (a fresh child gives back what this job took)
        if status == "memory":
            raise ChildOutOfMemory(f"more than {self.memory_bytes >> 20} MiB of memory")
        if status == "failed":
            raise JobFailed(value)
        return value

    def close(self) -> None:
        with self._lock:
            self._stop()

    def _ensure(self) -> None:
        if self._proc is not None and self._proc.is_alive():
            return
        self._stop()
        ctx = multiprocessing.get_context("spawn")  # (no fork of a process that holds threads and a model)
        parent, child = ctx.Pipe()
        self._proc = ctx.Process(target=_serve, args=(child, self.handler, self.memory_bytes), name=self.name,
                                 daemon=True)
        with _main_module_hidden():
            self._proc.start()
        child.close()
        self._conn, self._ready = parent, False

    def _wait_ready(self) -> None:
        if self._ready:
            return
        if not self._conn.poll(STARTUP_S):
            self._stop()
            raise ChildTimeout(f"{self.name} did not start within {STARTUP_S:g} s")
        self._conn.recv()
        self._ready = True

    def _replace(self) -> None:
        """A new child in this one's place, starting while the caller answers (its imports take a moment)."""
        self._stop()
        self._ensure()

    def _stop(self) -> None:
        if self._proc is not None:
            self._proc.kill()
            self._proc.join(5)
        if self._conn is not None:
            self._conn.close()
        self._proc = self._conn = None


@contextlib.contextmanager
def _main_module_hidden():
    """Spawn re-imports the parent's main module in the child; this child needs nothing of it, and a script
    without a ``__main__`` guard (``LLM(...)`` at its top level) would run again there. So the child is told
    of no main module: multiprocessing reads ``__file__`` and ``__spec__`` only while it starts one."""
    main = sys.modules.get("__main__")
    saved = {k: main.__dict__[k] for k in ("__file__", "__spec__") if main is not None and k in main.__dict__}
    with _STARTING:
        try:
            for k in saved:
                if k == "__file__":
                    del main.__file__
                else:
                    main.__spec__ = None
            yield
        finally:
            for k, v in saved.items():
                setattr(main, k, v)


_STARTING = threading.Lock()


def _serve(conn, handler: Callable[[Any], Any], memory_bytes: int) -> None:
    """The child: runs jobs until its parent's end of the pipe closes."""
    import resource

    prepare = getattr(handler, "prepare", None)
    if prepare is not None:  # (imports and tables the handler needs, before the budget is set)
        prepare()
    used = _data_bytes()
    resource.setrlimit(resource.RLIMIT_DATA, (used + memory_bytes, resource.RLIM_INFINITY))
    conn.send(("ready",))
    while True:
        try:
            job = conn.recv()
        except (EOFError, OSError):
            return
        try:  # (status, value or reason, whether this child should be replaced)
            reply = ("ok", handler(job), False)
        except MemoryError:
            reply = ("memory", None, True)
        except Replace as exc:
            reply = ("failed", str(exc), True)
        except Exception as exc:  # the job's own failure: the child is kept
            reply = ("failed", str(exc), False)
        conn.send(reply)


def _data_bytes() -> int:
    """This process's data segment now (VmData), what RLIMIT_DATA counts."""
    with open(f"/proc/{os.getpid()}/status") as f:
        for line in f:
            if line.startswith("VmData:"):
                return int(line.split()[1]) * 1024
    return 0
