"""Sleep mode of a worker's runner: give back the weights' and the KV cache's memory, and take it again.

Runs in a worker (or the in-process engine), on the scheduler's word: the scheduler has stopped
scheduling, nothing is in flight, and every request was preempted, so no step reads the memory while it
is gone. Level 1 keeps a backing copy of the weights (a file on the CPU, host memory beside a GPU) and
discards the KV cache; level 2 discards both, and wake-up loads the weights from the checkpoint again.
What is released and restored is exactly what the runner's ``AllocatorLedger`` holds; the step plans
(decode fast path, CUDA graphs), which bind the buffers' addresses, are dropped and built again.
"""
from __future__ import annotations

import logging
from typing import Callable, Optional, Sequence

import torch

from actorserve.runtime.engine.sleep import WAKE_TAGS, check_level, check_tags
from actorserve.runtime.heap import trim_heap
from actorserve.runtime.model.memory.memory_ledger import AllocatorLedger, TagState

log = logging.getLogger("actorserve")


class SleepMode:
    """The runner's ledger and its sleep / wake-up. ``reload`` loads the models (the target, then the
    draft where there is one) again from their checkpoints, for wake-up after level 2."""

    def __init__(self, runner, reload: Callable[[], list]) -> None:
        self.runner, self._reload = runner, reload
        self.ledger = AllocatorLedger()
        for prefix, r in runner.runners():
            self.ledger.record("weights", r.model, prefix + "model")
            self.ledger.record("kv_cache", r.kv_caches, prefix + "kv")
        self._record_workspace()

    def _record_workspace(self) -> None:
        for prefix, r in self.runner.runners():
            self.ledger.record("workspace", (r.fast_decode, r._static), prefix + "plans")

    @property
    def sleeping(self) -> bool:
        return any(state != TagState.RESIDENT for state in self.ledger.state.values())

    def sleep(self, level: int) -> dict[str, int]:
        """Release the KV cache and the weights (backed up at level 1); returns the bytes by tag."""
        check_level(level)
        if self.sleeping:
            raise RuntimeError("the engine is already asleep")
        released = {"workspace": self.ledger.release("workspace", backup=False)}
        for _, r in self.runner.runners():
            r.drop_plans()
        released["kv_cache"] = self.ledger.release("kv_cache", backup=False)
        released["weights"] = self.ledger.release("weights", backup=level == 1)
        _give_back(self.runner.device)
        log.info("asleep (level %d): released %.1f MiB of weights, %.1f MiB of KV cache", level,
                 released["weights"] / 2**20, released["kv_cache"] / 2**20)
        return released

    def wake_up(self, tags: Optional[Sequence[str]] = None) -> list[str]:
        """Restore the tags that are released (each exactly once); once both are back, build the step
        plans again. Returns the tags restored by this call."""
        restored = []
        for tag in check_tags(tags):
            if self.ledger.state[tag] == TagState.RESIDENT:
                continue
            if tag == "weights" and self.ledger.state[tag] == TagState.DISCARDED:
                self.ledger.restore(tag, source=self._reloaded())
            else:
                self.ledger.restore(tag)
            restored.append(tag)
        if restored and all(self.ledger.state[t] == TagState.RESIDENT for t in WAKE_TAGS):
            for _, r in self.runner.runners():
                r.build_plans()
            self.runner.capture_graphs()
            self.ledger.restore("workspace", rebuilt=lambda ledger: self._record_workspace())
            log.info("awake")
        _give_back(self.runner.device)
        return restored

    def _reloaded(self) -> AllocatorLedger:
        """A ledger of freshly loaded weights, entry for entry as this one's (the loader is deterministic)."""
        source = AllocatorLedger()
        for (prefix, _), model in zip(self.runner.runners(), self._reload()):
            source.record("weights", model, prefix + "model")
        return source


def _give_back(device: torch.device) -> None:
    """What dropped buffers freed goes back to the OS (the host heap) or the device (torch's cache)."""
    trim_heap()
    if device.type == "cuda":
        torch.cuda.empty_cache()
