"""SchedulerActor: runs in the scheduler process and owns all request state.

Receives AddRequest / AbortRequest / HealthPing / Shutdown from clients on its ROUTER socket, and
WorkerReady / StepResult from the last worker stage on its PULL inbox. Sends ExecuteBatch to the first
stage, RequestOutputDelta, HealthPong and ErrorReply back to the client that asked. Up to
pipeline_parallel_size steps are in flight (one per stage); requests are admitted and aborted between.
"""
from __future__ import annotations

import asyncio
import logging
from typing import Optional

import msgspec
import zmq.asyncio

from actorserve.runtime.actor import Actor
from actorserve.runtime.actors.addresses import Addresses
from actorserve.runtime.config import EngineConfig
from actorserve.runtime.engine.core import EngineCore, ModelFacts
from actorserve.runtime.engine.outputs import RequestUpdate
from actorserve.runtime.engine.sampling_params import SamplingParams
from actorserve.runtime.transport.channel import Channel, Envelope
from actorserve.runtime.transport.messages import (AbortRequest, AddRequest, ErrorReply, ExecuteBatch, HealthPing, HealthPong,
                                        PROTOCOL_VERSION, RequestOutputDelta, SampleDelta, Shutdown, StepResult,
                                        TokenLogprob, WorkerReady)

log = logging.getLogger("actorserve.scheduler")


class SchedulerActor(Actor):
    def __init__(self, ctx: zmq.asyncio.Context, config: EngineConfig, addresses: Addresses) -> None:
        super().__init__("scheduler")
        self.ctx = ctx
        self.config = config
        self.addresses = addresses
        self.core: Optional[EngineCore] = None
        self.tokenizer = None
        self._clients: dict[str, tuple[bytes, str]] = {}  # engine request id -> (client identity, its id)
        self._announced: set[str] = set()
        self._work = asyncio.Event()
        self._results: asyncio.Queue = asyncio.Queue()  # StepResults, in the order the batches went out
        self._loop_task: Optional[asyncio.Task] = None

    async def on_start(self) -> dict:
        self.client = self.channel(Channel(self.ctx, "router", self.addresses.client, bind=True), listen=True)
        inbox = self.channel(Channel(self.ctx, "pull", self.addresses.scheduler_in, bind=True))
        self.to_worker = self.channel(Channel(self.ctx, "push", self.addresses.worker_in, bind=False))
        if not self.config.model.skip_tokenizer_init:
            from actorserve.runtime.model.loader import resolve_model_path
            from actorserve.runtime.model.tokenizer import load_tokenizer

            self.tokenizer = load_tokenizer(self.config.model.tokenizer or resolve_model_path(self.config.model.model))
        envelope = await asyncio.wait_for(inbox.recv(), self.config.runtime.start_timeout)
        ready = envelope.message
        if not isinstance(ready, WorkerReady):
            raise RuntimeError(f"expected WorkerReady from the worker, got {envelope.message or envelope.error!r}")
        eos = self.tokenizer.eos_token_id if self.tokenizer is not None else None
        facts = ModelFacts(ready.vocab_size, eos if eos is not None else ready.eos_token_id, ready.max_model_len,
                           ready.num_kv_blocks)
        self.core = EngineCore(self.config, None, facts, self.tokenizer)
        self.channel(inbox, listen=True)
        self._loop_task = asyncio.ensure_future(self._engine_loop())
        return {"vocab_size": facts.vocab_size, "max_model_len": facts.max_model_len,
                "num_kv_blocks": facts.num_kv_blocks}

    async def on_stop(self) -> None:
        if self._loop_task is not None:
            self._loop_task.cancel()
            await asyncio.gather(self._loop_task, return_exceptions=True)

    # -- the step loop --------------------------------------------------------------------------------------
    async def _engine_loop(self) -> None:
        """Keep up to pipeline_parallel_size batches in flight; results come back in order."""
        depth = self.config.parallel.pipeline_parallel_size
        try:
            while True:
                while self.core.num_in_flight < depth:
                    batch = self.core.schedule()
                    if batch is None:
                        break
                    await self.to_worker.send(ExecuteBatch(batch))
                if self.core.num_in_flight == 0:
                    self._work.clear()
                    await self._work.wait()
                    continue
                result = await self._results.get()
                for update in self.core.apply(result):
                    await self._publish(update)
                await asyncio.sleep(0)  # let the mailbox admit and abort between steps
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            log.exception("scheduler step loop failed")
            self.failed = exc
            self.stop()

    async def _publish(self, update: RequestUpdate) -> None:
        rid = update.output.request_id
        origin, client_id = self._clients[rid]
        samples = [SampleDelta(s.index, s.token_ids, s.text, _wire_logprobs(s.logprobs), s.finish_reason,
                               s.stop_reason) for s in update.samples]
        first = rid not in self._announced
        self._announced.add(rid)
        if update.output.finished:
            del self._clients[rid]
            self._announced.discard(rid)
        await self.client.send(RequestOutputDelta(
            client_id, samples, update.output.finished,
            prompt_token_ids=update.output.prompt_token_ids if first else None,
            num_cached_tokens=update.output.num_cached_tokens), to=origin)

    # -- handlers ---------------------------------------------------------------------------------------------
    async def handle_add_request(self, message: AddRequest, envelope: Envelope) -> None:
        origin = envelope.origin
        rid = _engine_id(origin, message.request_id)
        try:
            if message.version != PROTOCOL_VERSION:
                raise ValueError(f"protocol version {message.version} is not supported (this is {PROTOCOL_VERSION})")
            params = SamplingParams(**msgspec.structs.asdict(message.params))
            ids = message.prompt_token_ids
            if ids is None:
                if message.prompt is None:
                    raise ValueError("prompt: the request needs prompt or prompt_token_ids")
                if self.tokenizer is None:
                    raise ValueError("prompt_token_ids are required: the engine runs without a tokenizer")
                ids = self.tokenizer.encode(message.prompt)
            self.core.add_request(rid, list(ids), params, prompt=message.prompt)
        except (ValueError, TypeError) as exc:
            await self.client.send(ErrorReply("ValueError", str(exc), message.request_id), to=origin)
            return
        self._clients[rid] = (origin, message.request_id)
        self._work.set()

    async def handle_abort_request(self, message: AbortRequest, envelope: Envelope) -> None:
        rid = _engine_id(envelope.origin, message.request_id)
        update = self.core.abort_request(rid)
        if update is not None and rid in self._clients:
            await self._publish(update)

    async def handle_health_ping(self, message: HealthPing, envelope: Envelope) -> None:
        s = self.core.scheduler
        await self.client.send(HealthPong(message.nonce, len(s.running), len(s.waiting), self.core.kv.pool.usage),
                               to=envelope.origin)

    def handle_step_result(self, message: StepResult, envelope: Envelope) -> None:
        self._results.put_nowait(message.result)

    async def handle_shutdown(self, message: Shutdown, envelope: Envelope) -> None:
        for rid in list(self._clients):
            update = self.core.abort_request(rid)
            if update is not None:
                await self._publish(update)
        await self.to_worker.send(Shutdown(message.reason))
        self.stop()

    async def on_reject(self, envelope: Envelope, reason: str) -> None:
        log.warning("rejected a message: %s", reason)
        if envelope.origin is not None:
            await self.client.send(ErrorReply("ProtocolError", reason), to=envelope.origin)


def _engine_id(origin: Optional[bytes], request_id: str) -> str:
    return f"{(origin or b'').hex()}/{request_id}"


def _wire_logprobs(logprobs) -> Optional[list[list[TokenLogprob]]]:
    if logprobs is None:
        return None
    return [[TokenLogprob(tid, lp.logprob, lp.rank, lp.decoded_token) for tid, lp in entry.items()]
            for entry in logprobs]
