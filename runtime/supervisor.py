"""Supervision in the launcher: start children, wait for ready, watch their sentinels and heartbeats,
shut down.

Runs in the launcher (the caller's process, or ``actorserve serve-zmq``). A child that dies is seen
through its pidfd on the launcher's loop, at once. A child that hangs (stopped, deadlocked, stuck in a
call that never returns) is seen by its heartbeat: once ready, every child beats on its ready pipe while
its event loop turns or a step of it computes (``runtime.liveness``), so a slow step is never a hang, and
one whose beats stop for ``hang_timeout`` seconds is declared dead and killed. Either way the launcher's
callback marks the engine dead and the supervisor tears the rest down. Shutdown waits for a clean exit
until a deadline, then terminates, then kills: no child outlives it.
"""
from __future__ import annotations

import asyncio
import json
import logging
import os
import shutil
from typing import Callable, Optional

from actorserve.runtime.errors import EngineStartError
from actorserve.runtime.liveness import LOOP
from actorserve.runtime.process import Child, ChildSpec, spawn

log = logging.getLogger("actorserve.supervisor")


class Supervisor:
    def __init__(self, cleanup_dir: Optional[str] = None, hang_timeout: float = 30.0,
                 heartbeat_interval: float = 1.0) -> None:
        self.children: list[Child] = []
        self._cleanup_dir = cleanup_dir
        self._on_death: Optional[Callable[[str, str], None]] = None
        self._closing = False
        self._released = False
        self._hang_timeout = hang_timeout
        self._interval = heartbeat_interval
        self._last_beat: dict[str, float] = {}
        self._last_turn: dict[str, float] = {}  # the last beat that said the child's loop turned
        self._slow_said: set[str] = set()  # children whose long step the log has named
        self._check_timer: Optional[asyncio.TimerHandle] = None

    @property
    def closing(self) -> bool:
        """Shutting down, or a child died: the engine is not there to be asked anything."""
        return self._closing

    def spawn(self, spec: ChildSpec) -> None:
        self.children.append(spawn(spec))

    async def wait_ready(self, timeout: float) -> dict[str, dict]:
        """Every child's ready info; the first failure or death raises EngineStartError with its reason."""
        loop = asyncio.get_running_loop()
        pending = {c.name: loop.create_future() for c in self.children}
        started = loop.time()
        for child in self.children:
            loop.add_reader(child.ready.fileno(), _read_ready, child, pending[child.name], started)
            loop.add_reader(child.sentinel, _died_early, child, pending[child.name])
        try:
            done, waiting = await asyncio.wait(pending.values(), timeout=timeout, return_when=asyncio.FIRST_EXCEPTION)
        finally:
            for child in self.children:
                loop.remove_reader(child.ready.fileno())
                loop.remove_reader(child.sentinel)
        failed = next((f for f in pending.values() if f in done and f.exception() is not None), None)
        if failed is not None:
            raise failed.exception()
        if waiting:
            raise EngineStartError(f"the engine did not start within {timeout:.0f} s")
        return {name: fut.result() for name, fut in pending.items()}

    def watch(self, on_death: Callable[[str, str], None]) -> None:
        """From now on, a child's exit or hang calls on_death(name, what happened) once and stops the others."""
        self._on_death = on_death
        loop = asyncio.get_running_loop()
        for child in self.children:
            loop.add_reader(child.sentinel, self._exited, child)
            os.set_blocking(child.ready.fileno(), False)
            loop.add_reader(child.ready.fileno(), self._drain_beats, child)
            self._last_beat[child.name] = self._last_turn[child.name] = loop.time()
        self._check_timer = loop.call_later(self._interval, self._check_beats)

    def _drain_beats(self, child: Child) -> None:
        try:
            while beats := os.read(child.ready.fileno(), 4096):
                now = asyncio.get_running_loop().time()
                self._last_beat[child.name] = now
                if LOOP in beats:
                    self._last_turn[child.name] = now
                    self._slow_said.discard(child.name)
        except BlockingIOError:
            pass
        except OSError:
            pass  # the child is gone: its sentinel says so

    def _check_beats(self) -> None:
        """Judge only on what has arrived: beats that queued while this loop was busy count."""
        loop = asyncio.get_running_loop()
        for child in self.children:
            self._drain_beats(child)
        if self._closing:
            return
        for child in self.children:
            silent = loop.time() - self._last_beat[child.name]
            if silent > self._hang_timeout and child.alive():
                self._dead(child, f"{child.name} stopped answering (no heartbeat for {silent:.1f} s, "
                                  f"hang_timeout is {self._hang_timeout:g} s)")
                return
            busy = loop.time() - self._last_turn[child.name]
            if busy > self._hang_timeout and child.name not in self._slow_said:
                self._slow_said.add(child.name)
                log.warning("%s has computed one step for %.0f s (past hang_timeout, %g s, and still computing: "
                            "slow, not hung)", child.name, busy, self._hang_timeout)
        self._check_timer = loop.call_later(self._interval, self._check_beats)

    def _exited(self, child: Child) -> None:
        asyncio.get_running_loop().remove_reader(child.sentinel)
        if not self._closing:
            self._dead(child, f"{child.name} exited (code {child.exitcode})")

    def _dead(self, child: Child, what: str) -> None:
        self._closing = True
        log.error("%s; the engine is dead", what)
        if self._on_death is not None:
            self._on_death(child.name, what)
        self.kill_all()

    def kill_all(self) -> None:
        self._closing = True
        if self._check_timer is not None:
            self._check_timer.cancel()
        for child in self.children:
            if child.alive():
                child.process.kill()
        for child in self.children:
            child.process.wait(5)
        self._release()

    async def shutdown(self, timeout: float) -> None:
        """Wait for the children to exit by themselves until the deadline, then terminate, then kill."""
        self._closing = True
        if self._check_timer is not None:
            self._check_timer.cancel()
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        await self._wait_exit(deadline - 1.0)  # a clean exit: the actors drained and stopped
        for child in self.children:
            if child.alive():
                child.process.terminate()
        await self._wait_exit(deadline)
        for child in self.children:
            if child.alive():
                child.process.kill()
                child.process.wait(1)
        self._release()

    async def _wait_exit(self, until: float) -> None:
        loop = asyncio.get_running_loop()
        while any(c.alive() for c in self.children) and loop.time() < until:
            await asyncio.sleep(0.02)

    def _release(self) -> None:
        if self._released:
            return
        self._released = True
        loop = asyncio.get_event_loop()
        for child in self.children:
            for fd in (child.sentinel, child.ready.fileno()):
                try:
                    loop.remove_reader(fd)
                except (ValueError, OSError, RuntimeError):
                    pass
            child.ready.close()
            for fd in (child.death_fd, child.sentinel):
                os.close(fd)
        if self._cleanup_dir is not None:
            shutil.rmtree(self._cleanup_dir, ignore_errors=True)


def _read_ready(child: Child, fut: asyncio.Future, started: float = 0.0) -> None:
    if fut.done():
        return
    line = child.ready.readline()
    if not line:
        return  # EOF: the sentinel reports the death
    report = json.loads(line)
    if report["kind"] == "ready":
        elapsed = asyncio.get_running_loop().time() - started
        log.info("%s ready in %.2f s (pid %d)", child.name, elapsed, child.process.pid)
        fut.set_result(report.get("info", {}))
    else:
        fut.set_exception(EngineStartError(report.get("message", "start-up failed")))


def _died_early(child: Child, fut: asyncio.Future) -> None:
    if fut.done():
        return
    _read_ready(child, fut)  # an error report may have landed just before the exit
    if not fut.done():
        child.process.wait(1)
        fut.set_exception(EngineStartError(f"{child.name} exited with code {child.exitcode} during start-up"))
