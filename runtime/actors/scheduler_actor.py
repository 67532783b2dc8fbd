"""SchedulerActor: runs in the scheduler process and owns all request state.

Receives AddRequest / AbortRequest / PauseRequest / HealthPing (and sleep mode's SleepRequest / WakeUpRequest /
SleepStatusRequest) from clients on its ROUTER socket, WorkerReady / StepResult / SleepStatus from the
last worker stage on its PULL inbox, and Shutdown from the launcher alone, on a control socket in the
launcher's private folder. Sends ExecuteBatch to the first stage,
RequestOutputDelta, HealthPong and ErrorReply back to the client that asked. Up to
pipeline_parallel_size steps are in flight (one per stage); requests are admitted and aborted between.

The client socket is the engine's edge (docs/protocol.md): a message over the size limit disconnects
its sender, a client key (and CurveZMQ, where configured) is checked on every message, a prompt is
length-checked before it is tokenized and tokenized on a thread (the step loop never waits for it),
and when a client's connection closes, its requests are aborted.
"""
from __future__ import annotations

import asyncio
import concurrent.futures
import hmac
import logging
from typing import Optional

import msgspec
import zmq
import zmq.asyncio

from actorserve.runtime.actor import Actor
from actorserve.runtime.transport.addresses import Addresses
from actorserve.runtime.actors.sleep_control import SleepControl
from actorserve.runtime.config import EngineConfig
from actorserve.runtime.engine.beam_search import BeamSearchParams
from actorserve.runtime.engine.core import EngineCore, ModelFacts
from actorserve.runtime.engine.outputs import RequestUpdate, SampleDelta, logprob_entries
from actorserve.runtime.engine.sampling_params import SamplingParams, StructuredOutputsParams, verify_prompt_text
from actorserve.runtime.engine.stats import StatsLine
from actorserve.runtime.errors import EngineOverloadedError, EngineSleepingError
from actorserve.runtime.heap import trim_heap
from actorserve.runtime.text.tokenizer import encode
from actorserve.runtime.transport.channel import Channel, Envelope, PeerNotReading
from actorserve.runtime.transport.client_security import curve_server
from actorserve.runtime.transport.codec import RefusedValue
from actorserve.runtime.transport.messages import (PROTOCOL_VERSION, AbortRequest, AddRequest, ErrorReply, ExecuteBatch,
                                                   HealthPing, HealthPong, PauseRequest, RequestOutputDelta,
                                                   Shutdown, SleepRequest, SleepStatus, SleepStatusRequest,
                                                   StepResult, WakeUpRequest, WorkerReady)

log = logging.getLogger("actorserve.scheduler")

# a client message is one frame, with an optional (empty) tensor-reference frame; the rest is room for the
# tensors a later protocol version may carry. More frames close the connection (docs/protocol.md).
MAX_CLIENT_FRAMES = 8
_CLIENT_HEARTBEAT_S = 10.0  # a client host that vanished without closing is dropped after 30 s of silence


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
        self._stats_task: Optional[asyncio.Task] = None
        self._tokenizing: dict[str, tuple[asyncio.Task, int]] = {}  # engine id -> (tokenize/compile job, n)
        self._tokenizer_pool: Optional[concurrent.futures.ThreadPoolExecutor] = None
        self._max_token_chars = 1
        self._peers: dict[int, set[bytes]] = {}  # client connection (fd) -> the identities seen on it
        self._closed: set[int] = set()  # connections (fds) the monitor saw close and no new one open since
        self._peer_watch: Optional[asyncio.Task] = None
        self._monitor_now: Optional[zmq.Socket] = None
        self._security = None
        self.sleep_control: Optional[SleepControl] = None
        self._control_jobs: set[asyncio.Task] = set()  # sleep-mode jobs (SleepControl's), off the mailbox

    async def on_start(self) -> dict:
        runtime = self.config.runtime
        tracked = not self.addresses.client.startswith("inproc://")  # inproc has no connections to watch
        self._security = curve_server(self.ctx, runtime.curve_secret_key, runtime.curve_authorized_keys,
                                      runtime.curve_launcher_key)
        self.client = self.channel(Channel(
            self.ctx, "router", self.addresses.client, bind=True, name="client",
            max_message_bytes=runtime.max_request_body_bytes, max_frames=MAX_CLIENT_FRAMES, track_peers=tracked,
            heartbeat_s=_CLIENT_HEARTBEAT_S, peer_send_limit=runtime.client_send_limit if tracked else None,
            monitor_events=zmq.EVENT_ACCEPTED | zmq.EVENT_DISCONNECTED if tracked else 0,
            configure=self._security.configure if self._security is not None else None), listen=True)
        if tracked:
            self._peer_watch = asyncio.ensure_future(self._watch_peers(self.client.monitor))
            self._monitor_now = zmq.Socket.shadow(self.client.monitor.underlying)  # its events, read at once
        self.channel(Channel(self.ctx, "pull", self.addresses.control, bind=True, name="control"), listen=True)
        inbox = self.channel(Channel(self.ctx, "pull", self.addresses.scheduler_in, bind=True, name="workers"))
        self.to_worker = self.channel(Channel(self.ctx, "push", self.addresses.worker_in, bind=False))
        if not self.config.model.skip_tokenizer_init:
            from actorserve.runtime.model_files import resolve_model_path
            from actorserve.runtime.text.tokenizer import load_tokenizer, max_token_chars

            self.tokenizer = load_tokenizer(self.config.model.tokenizer or resolve_model_path(self.config.model.model))
            self._max_token_chars = max_token_chars(self.tokenizer)
            self._tokenizer_pool = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="tokenize")
        envelope = await asyncio.wait_for(inbox.recv(), self.config.runtime.start_timeout)
        ready = envelope.message
        if not isinstance(ready, WorkerReady):
            raise RuntimeError(f"expected WorkerReady from the worker, got {envelope.message or envelope.error!r}")
        eos = self.tokenizer.eos_token_id if self.tokenizer is not None else None
        facts = ModelFacts(ready.vocab_size, eos if eos is not None else ready.eos_token_id, ready.max_model_len,
                           ready.num_kv_blocks, ready.sliding_window, ready.num_state_slots)
        self.core = EngineCore(self.config, None, facts, self.tokenizer)
        self.sleep_control = SleepControl(self.config, self.core, self.to_worker.send, self._work)
        self.channel(inbox, listen=True)
        self._loop_task = asyncio.ensure_future(self._engine_loop())
        if not self.config.runtime.disable_log_stats:
            self._stats_task = asyncio.ensure_future(self._log_stats(StatsLine()))
        return {"vocab_size": facts.vocab_size, "max_model_len": facts.max_model_len,
                "num_kv_blocks": facts.num_kv_blocks, "eos_token_id": facts.eos_token_id}

    async def on_stop(self) -> None:
        tasks = [t for t in (self._loop_task, self._peer_watch, self._stats_task) if t is not None]
        tasks += list(self._control_jobs)
        tasks += [job for job, _ in self._tokenizing.values()]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        if self._tokenizer_pool is not None:
            self._tokenizer_pool.shutdown(wait=False, cancel_futures=True)
        if self.core is not None:
            self.core.structured.close()
        if self._security is not None:
            self._security.stop()

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

    async def _log_stats(self, stats: StatsLine) -> None:
        stats.take(self.core)
        while True:
            await asyncio.sleep(stats.interval)
            line = stats.take(self.core)
            if line is not None:
                log.info("%s", line)

    async def _publish(self, update: RequestUpdate) -> None:
        rid = update.output.request_id
        if rid not in self._clients:
            return  # its client was dropped while this step's updates went out
        origin, client_id = self._clients[rid]
        first = rid not in self._announced
        self._announced.add(rid)
        if update.output.finished:
            del self._clients[rid]
            self._announced.discard(rid)
        await self._reply(RequestOutputDelta(
            client_id, update.samples, update.output.finished,
            prompt_token_ids=update.output.prompt_token_ids if first else None,
            num_cached_tokens=update.output.num_cached_tokens,
            prompt_logprobs=logprob_entries(update.output.prompt_logprobs) if first else None,
            timings=update.output.metrics), to=origin)

    # -- handlers ---------------------------------------------------------------------------------------------
    async def handle_add_request(self, message: AddRequest, envelope: Envelope) -> None:
        origin = envelope.origin
        if not await self._authorized(message, envelope):
            return
        rid = _engine_id(origin, message.request_id)
        try:
            if message.version != PROTOCOL_VERSION:
                raise ValueError(_version_refused(message.version))
            if message.beam_search is not None:
                params, structured = message.beam_search, None
            else:
                params = message.params
                structured = params.structured_outputs
            if rid in self._tokenizing:
                raise ValueError(f"request_id {message.request_id!r} is already in use")
            if message.prompt_token_ids is None:
                if message.prompt is None:
                    raise ValueError("prompt: the request needs prompt or prompt_token_ids")
                if self.tokenizer is None:
                    raise ValueError("prompt_token_ids are required: the engine runs without a tokenizer")
                verify_prompt_text(message.prompt, self.core.facts.max_model_len, self._max_token_chars)
            if message.prompt_token_ids is None or structured is not None:
                if structured is not None:  # (a schema that does not parse: refused at once)
                    self.core.structured.validate(structured)
                job = asyncio.ensure_future(self._prepare_then_add(rid, message, params, structured, origin))
                self._tokenizing[rid] = (job, params.n)
                self._remember_peer(envelope)
                return
            self._admit(rid, message, params, list(message.prompt_token_ids), origin)
        except (ValueError, TypeError) as exc:
            await self._reply(ErrorReply("ValueError", str(exc), message.request_id), to=origin)
            return
        except (EngineSleepingError, EngineOverloadedError) as exc:
            await self._reply(ErrorReply(type(exc).__name__, str(exc), message.request_id), to=origin)
            return
        self._remember_peer(envelope)

    def _admit(self, rid: str, message: AddRequest, params: SamplingParams, ids: list[int], origin) -> None:
        if self.core.structured.on_compiled is None:  # a compiled grammar's request may be admitted: wake up
            loop = asyncio.get_running_loop()
            self.core.structured.on_compiled = lambda: loop.call_soon_threadsafe(self._work.set)
        self.core.add_request(rid, ids, params, prompt=message.prompt)
        self._clients[rid] = (origin, message.request_id)
        self._work.set()

    async def _prepare_then_add(self, rid: str, message: AddRequest, params: SamplingParams | BeamSearchParams,
                                structured: Optional[StructuredOutputsParams], origin) -> None:
        """Tokenize on the pool's thread and compile the request's grammar (``structured``, its params') on
        the grammar thread (within its budget: one past it refuses the request), then admit; an abort
        meanwhile cancels this."""
        loop = asyncio.get_running_loop()
        try:
            compiling = None
            if structured is not None:
                compiling = asyncio.wrap_future(self.core.structured.prepare(structured))
            ids = message.prompt_token_ids
            if ids is None:
                ids = await loop.run_in_executor(self._tokenizer_pool, encode, self.tokenizer, message.prompt)
            if compiling is not None:
                await compiling
            ids = list(ids)
            self._tokenizing.pop(rid, None)
            self._admit(rid, message, params, ids, origin)
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            self._tokenizing.pop(rid, None)
            kind = "ValueError" if isinstance(exc, (ValueError, TypeError)) else type(exc).__name__
            await self._reply(ErrorReply(kind, str(exc), message.request_id), to=origin)

    def _remember_peer(self, envelope: Envelope) -> None:
        """Note whose request this is; one whose connection already closed (the monitor's event came
        first, since events and messages travel apart) is aborted at once. The monitor's pending events
        are taken first: a closed connection's descriptor may already serve a new one, whose requests must
        not be filed under the old (libzmq reports a close before the descriptor can be reused)."""
        if envelope.peer is None:
            return
        self._take_peer_events()
        self._peers.setdefault(envelope.peer, set()).add(envelope.origin)
        if envelope.peer in self._closed:
            self._abort_clients(self._peers.pop(envelope.peer))

    async def _watch_peers(self, monitor) -> None:
        """A client whose connection closed gets nothing more: its requests are aborted. The events are read
        by ``_take_peer_events`` alone, here and before a message is filed: an event read by this task but
        not yet handled would come after a message that followed it."""
        while True:
            await monitor.poll(flags=zmq.POLLIN)
            self._take_peer_events()

    def _take_peer_events(self) -> set[int]:
        """The monitor's pending events, taken now; returns the connections (fds) they closed."""
        closed = set()
        while True:
            try:
                fd, gone = self._on_peer_event(self._monitor_now.recv_multipart(zmq.NOBLOCK))
            except zmq.Again:
                return closed
            if gone:
                closed.add(fd)

    def _on_peer_event(self, frames: list[bytes]) -> tuple[int, bool]:
        from zmq.utils.monitor import parse_monitor_message

        event = parse_monitor_message(frames)
        fd = int(event["value"])
        identities = self._peers.pop(fd, set())
        if event["event"] == zmq.EVENT_DISCONNECTED:
            self._closed.add(fd)
            if identities:
                self._abort_clients(identities)
            return fd, True
        self._closed.discard(fd)  # a new connection on this descriptor
        return fd, False

    async def _reply(self, message, to: Optional[bytes]) -> None:
        """Send to a client; one that has left ``--client-send-limit`` messages unread is dropped whole: its
        connection closed and its requests aborted (what it left queued is let go with the connection)."""
        try:
            await self.client.send(message, to=to)
        except PeerNotReading:
            fds = [fd for fd, identities in self._peers.items() if to in identities]
            log.warning("a client left %d messages unread: its connection is closed, its requests aborted",
                        self.client.peer_send_limit)
            for fd in fds:
                self.client.disconnect(fd, delay_s=0)
                self._abort_clients(self._peers.pop(fd))
            if not fds:
                self._abort_clients({to})

    def _abort_clients(self, identities: set[bytes]) -> None:
        prefixes = tuple(f"{origin.hex()}/" for origin in identities)
        gone = [rid for rid in self._clients if rid.startswith(prefixes)]
        gone += [rid for rid in self._tokenizing if rid.startswith(prefixes)]
        for rid in gone:
            self._forget(rid)
        if gone:
            log.info("a client connection closed: aborted its %d request(s)", len(gone))

    def _forget(self, rid: str) -> None:
        """Abort without a reply (nobody is there to read it)."""
        job = self._tokenizing.pop(rid, None)
        if job is not None:
            job[0].cancel()
        self.core.abort_request(rid)
        self._clients.pop(rid, None)
        self._announced.discard(rid)

    async def _authorized(self, message, envelope: Envelope) -> bool:
        key = self.config.runtime.client_api_key
        if key is None or (message.api_key is not None and hmac.compare_digest(message.api_key.encode(), key.encode())):
            return True
        request_id = getattr(message, "request_id", None)
        await self._reply(ErrorReply("AuthenticationError", "invalid or missing api_key", request_id),
                          to=envelope.origin)
        return False

    async def handle_abort_request(self, message: AbortRequest, envelope: Envelope) -> None:
        """Request ids are the sending connection's own: an abort reaches only that socket's requests."""
        if not await self._authorized(message, envelope):
            return
        rid = _engine_id(envelope.origin, message.request_id)
        job = self._tokenizing.pop(rid, None)
        if job is not None:  # not admitted yet: end it here, as an admitted one would end
            job[0].cancel()
            samples = [SampleDelta(i, [], "", finish_reason="abort") for i in range(job[1])]
            await self._reply(RequestOutputDelta(message.request_id, samples, True), to=envelope.origin)
            return
        update = self.core.abort_request(rid)
        if update is not None and rid in self._clients:
            await self._publish(update)

    async def handle_pause_request(self, message: PauseRequest, envelope: Envelope) -> None:
        """Flow control, like an abort the sending connection's own requests only."""
        if not await self._authorized(message, envelope):
            return
        self.core.pause_request(_engine_id(envelope.origin, message.request_id), message.paused)
        if not message.paused:
            self._work.set()

    async def handle_health_ping(self, message: HealthPing, envelope: Envelope) -> None:
        if not await self._authorized(message, envelope):
            return
        s = self.core.scheduler
        steps = self.core.step_tokens
        spec = s.spec_stats
        await self._reply(HealthPong(message.nonce, len(s.running), len(s.waiting), self.core.kv.pool.usage,
                                     s.num_preemptions, list(steps.counts), steps.total, spec.num_drafts,
                                     spec.num_draft_tokens, spec.num_accepted_tokens,
                                     list(spec.num_accepted_tokens_per_pos)),
                          to=envelope.origin)

    # -- sleep mode -----------------------------------------------------------------------------------------
    async def handle_sleep_request(self, message: SleepRequest, envelope: Envelope) -> None:
        await self._control(message, envelope, self.sleep_control.sleep(message.level))

    async def handle_wake_up_request(self, message: WakeUpRequest, envelope: Envelope) -> None:
        await self._control(message, envelope, self.sleep_control.wake_up(message.tags))

    async def handle_sleep_status_request(self, message: SleepStatusRequest, envelope: Envelope) -> None:
        await self._control(message, envelope, self.sleep_control.status())

    async def _control(self, message, envelope: Envelope, job) -> None:
        """Run a sleep-mode job off the mailbox (it waits for steps in flight and for the workers, whose
        answers come through the mailbox), one at a time, and answer the client with its status."""
        if envelope.via == "workers" or not await self._authorized(message, envelope):
            job.close()
            return

        async def run() -> None:
            async with self.sleep_control.lock:
                try:
                    status = await job
                except (ValueError, RuntimeError) as exc:
                    await self._reply(ErrorReply(type(exc).__name__, str(exc), nonce=message.nonce),
                                      to=envelope.origin)
                    return
            await self._reply(msgspec.structs.replace(status, nonce=message.nonce), to=envelope.origin)

        self._control_jobs.add(task := asyncio.ensure_future(run()))
        task.add_done_callback(self._control_jobs.discard)

    async def handle_sleep_status(self, message: SleepStatus, envelope: Envelope) -> None:
        if envelope.via != "workers":
            await self.on_reject(envelope, "sleep_status is taken only from the workers")
            return
        self.sleep_control.answer(message)

    async def handle_step_result(self, message: StepResult, envelope: Envelope) -> None:
        if envelope.via != "workers":  # the engine's own traffic, never a client's
            await self.on_reject(envelope, "step_result is taken only from the workers")
            return
        self._results.put_nowait(message.result)

    async def handle_shutdown(self, message: Shutdown, envelope: Envelope) -> None:
        if envelope.via != "control":
            log.warning("refused a shutdown from a client")
            await self._reply(ErrorReply("PermissionError", "shutdown is taken only from the launcher"),
                              to=envelope.origin)
            return
        for rid in list(self._clients):
            update = self.core.abort_request(rid)
            if update is not None:
                await self._publish(update)
        await self.to_worker.send(Shutdown(message.reason))
        self.stop()

    async def on_reject(self, envelope: Envelope, reason: str) -> None:
        refused = envelope.error
        if isinstance(refused, RefusedValue) and refused.request_id is not None and envelope.origin is not None:
            # a request whose params are out of range: refused as the handler refuses a bad request
            if await self._authorized(refused, envelope):
                if refused.version != PROTOCOL_VERSION:
                    reason = _version_refused(refused.version)
                await self._reply(ErrorReply("ValueError", reason, refused.request_id), to=envelope.origin)
            return
        log.warning("rejected a message: %s", reason)
        if envelope.drop_peer and envelope.peer is not None:
            # before the reply: once answered, the client may close, and its descriptor serve a new client
            if envelope.peer not in self._take_peer_events():
                log.warning("closing the connection that sent it; its requests are aborted")
                self.client.disconnect(envelope.peer)
            trim_heap()  # what libzmq buffered of the message
        if envelope.origin is not None:
            await self._reply(ErrorReply("ProtocolError", reason), to=envelope.origin)


def _version_refused(version: int) -> str:
    return f"protocol version {version} is not supported (this is {PROTOCOL_VERSION})"


def _engine_id(origin: Optional[bytes], request_id: str) -> str:
    return f"{(origin or b'').hex()}/{request_id}"
