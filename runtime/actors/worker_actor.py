"""WorkerActor: runs in a worker process; holds the weights and the KV cache.

Receives ExecuteBatch (and Shutdown) on its PULL inbox; sends WorkerReady once loaded and a StepResult
per step to the scheduler. Stateless apart from weights, KV memory and per-request sampler state.
"""
from __future__ import annotations

import logging

import zmq.asyncio

from runtime.actor import Actor
from runtime.actors.addresses import Addresses
from runtime.config import EngineConfig
from runtime.inprocess import load_worker
from runtime.transport.channel import Channel, Envelope
from runtime.transport.messages import ExecuteBatch, Shutdown, StepResult, WorkerReady

log = logging.getLogger("actorserve.worker")


class WorkerActor(Actor):
    def __init__(self, ctx: zmq.asyncio.Context, config: EngineConfig, addresses: Addresses, rank: int = 0) -> None:
        super().__init__(f"worker{rank}")
        self.ctx = ctx
        self.config = config
        self.addresses = addresses
        self.rank = rank
        self.runner = None

    async def on_start(self) -> dict:
        self.channel(Channel(self.ctx, "pull", self.addresses.worker_in[self.rank], bind=True), listen=True)
        self.out = self.channel(Channel(self.ctx, "push", self.addresses.scheduler_in, bind=False))
        self.runner, facts, _ = load_worker(self.config, with_tokenizer=False)
        await self.out.send(WorkerReady(self.rank, facts.vocab_size, facts.eos_token_id, facts.max_model_len,
                                        facts.num_kv_blocks))
        return {"num_kv_blocks": facts.num_kv_blocks}

    async def handle_execute_batch(self, message: ExecuteBatch, envelope: Envelope) -> None:
        result = self.runner.execute(message.batch)
        await self.out.send(StepResult(result))

    def handle_shutdown(self, message: Shutdown, envelope: Envelope) -> None:
        self.stop()

    def on_failure(self, exc: BaseException, envelope: Envelope) -> None:
        # A failed step leaves the scheduler waiting and the KV cache in doubt: die, and let supervision act.
        log.exception("%s: step failed; stopping", self.name, exc_info=exc)
        self.failed = exc
        self.stop()
