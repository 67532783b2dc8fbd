"""The reference client of the ZMQ protocol (docs/protocol.md), and the embedded engine's front door.

Runs in the caller's process. One DEALER socket to the scheduler's ROUTER; a receive task routes each
RequestOutputDelta to its request's stream, and HealthPong to the ping waiting for it. Streams yield
cumulative vLLM-shaped RequestOutputs. Leaving a stream early (break, cancel) sends AbortRequest.

A socket monitor watches the connection: when the server closes it (its process died or was stopped),
every call in flight fails at once instead of waiting for answers that cannot come: with EngineStartError
if the server never answered on that connection (it went away while starting), else EngineDeadError. ZMQ
reconnects by itself, so a later call goes to whatever serves the address then; but a server that refuses
this client's CurveZMQ key is never tried again, and every call fails with PermissionError. A call that
finds no server listening for ``connect_timeout`` seconds fails with EngineStartError too (the server
process binds its socket early in its start, long before the model is loaded).

Flow control: a stream whose reader falls ``backlog`` outputs behind (an HTTP client that stopped
reading its SSE stream leaves the server's writer blocked) has its request paused in the engine, so that
it holds no place in the batch, and resumed once the reader has taken three quarters of them. A request
that stays paused ``stall_timeout`` seconds without its reader taking anything is aborted.
"""
from __future__ import annotations

import asyncio
import itertools
import uuid
from typing import AsyncIterator, Callable, Optional, Union

import zmq.asyncio

from actorserve.runtime.engine.beam_search import BeamSearchParams
from actorserve.runtime.engine.outputs import CompletionOutput, RequestOutput, logprob_dict
from actorserve.runtime.engine.sampling_params import SamplingParams
from actorserve.runtime.errors import EngineDeadError, EngineOverloadedError, EngineSleepingError, EngineStartError
from actorserve.runtime.transport.channel import Channel
from actorserve.runtime.transport.messages import (AbortRequest, AddRequest, ErrorReply, HealthPing, HealthPong,
                                                   PauseRequest, RequestOutputDelta, SleepRequest, SleepStatus,
                                                   SleepStatusRequest, WakeUpRequest)

PromptInput = Union[str, list[int], dict]
_HANDSHAKE_FAILED = zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL | zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL
_WATCHED_EVENTS = zmq.EVENT_CONNECTED | zmq.EVENT_DISCONNECTED | zmq.EVENT_HANDSHAKE_FAILED_AUTH | _HANDSHAKE_FAILED


class _Stream:
    """One request's outputs on their way to its reader, and whether the engine holds it paused."""

    def __init__(self) -> None:
        self.queue: asyncio.Queue = asyncio.Queue()
        self.paused = False
        self.taken = 0  # outputs the reader has taken
        self.stall: Optional[asyncio.TimerHandle] = None  # the check that its reader still takes outputs
        self.aborting: Optional[asyncio.Task] = None  # its abort, once its reader stalled (held till it is sent)


class ZmqClient:
    def __init__(self, address: str, ctx: Optional[zmq.asyncio.Context] = None,
                 connect_timeout: Optional[float] = 30.0, watch_connection: bool = True,
                 api_key: Optional[str] = None, curve_server_key: Optional[str] = None,
                 curve_client_key: Optional[str] = None,
                 configure: Optional[Callable[[zmq.Socket], None]] = None, backlog: int = 8,
                 stall_timeout: float = 60.0) -> None:
        """``watch_connection=False``: the caller supervises the server itself (the embedded engine
        watches its child processes, and fails every stream with the exact cause). ``api_key``: sent
        with every message, for a server started with one. ``curve_server_key`` (the server's public
        certificate file) and ``curve_client_key`` (this client's key pair file): CurveZMQ (or
        ``configure``: socket options set before connecting). ``backlog`` and ``stall_timeout``: flow
        control (above; RuntimeConfig.stream_backlog and stream_stall_timeout)."""
        self.address = address
        self.api_key = api_key
        self._configure = configure
        if (curve_server_key is None) != (curve_client_key is None):
            raise ValueError("curve_server_key and curve_client_key go together")
        if curve_server_key is not None:
            from actorserve.runtime.transport.client_security import curve_client

            self._configure = curve_client(curve_server_key, curve_client_key)
        self.watch_connection = watch_connection
        self.connect_timeout = connect_timeout
        self._own_ctx = ctx is None
        self._ctx = ctx or zmq.asyncio.Context()
        self._channel: Optional[Channel] = None
        self._streams: dict[str, _Stream] = {}
        self.backlog, self.stall_timeout = backlog, stall_timeout
        self._pings: dict[int, asyncio.Future] = {}
        self._nonces = itertools.count(1)
        self._receiver: Optional[asyncio.Task] = None
        self._dead: Optional[BaseException] = None
        self._monitor: Optional[asyncio.Task] = None
        self._answered = False  # the server has sent something on the current connection
        self._connected = asyncio.Event()

    def _connect(self) -> Channel:
        if self._channel is None:
            # inproc has no connection events
            watched = self.watch_connection and not self.address.startswith("inproc://")
            self._channel = Channel(self._ctx, "dealer", self.address, bind=False, identity=uuid.uuid4().hex.encode(),
                                    monitor_events=_WATCHED_EVENTS if watched else 0,
                                    configure=self._configure)
            self._receiver = asyncio.ensure_future(self._receive())
            if watched:
                self._monitor = asyncio.ensure_future(self._watch(self._channel.monitor))
            else:
                self._connected.set()
        return self._channel

    async def _watch(self, monitor) -> None:
        from zmq.utils.monitor import parse_monitor_message

        while True:
            event = parse_monitor_message(await monitor.recv_multipart())["event"]
            if event == zmq.EVENT_CONNECTED:
                self._answered = False
                self._connected.set()
            elif event == zmq.EVENT_DISCONNECTED:
                self._connected.clear()
                self._fail_in_flight(self._went_away())
            elif event == zmq.EVENT_HANDSHAKE_FAILED_AUTH:
                # ZMQ does not reconnect after a refusal: this client can never be answered
                self.fail_all(PermissionError(f"the engine at {self.address} refused this client's CurveZMQ key: "
                                              "its public key is not among the server's authorized keys"))
            elif event & _HANDSHAKE_FAILED:
                self._fail_in_flight(EngineStartError(
                    f"the CurveZMQ handshake with the engine at {self.address} failed: curve_server_key must be "
                    "the server's public key, and client and server must both use CurveZMQ or both not"))

    def _went_away(self) -> EngineDeadError:
        if self._answered:
            return EngineDeadError(f"the engine at {self.address} closed the connection (it died or was stopped)")
        return EngineStartError(f"the engine at {self.address} went away before it answered (it failed "
                                "during start-up, or was stopped)")

    def _fail_in_flight(self, exc: BaseException) -> None:
        for stream in self._streams.values():
            stream.queue.put_nowait(exc)
        for fut in self._pings.values():
            if not fut.done():
                fut.set_exception(exc)
        self._pings.clear()

    async def _receive(self) -> None:
        while True:
            envelope = await self._channel.recv()
            self._answered = True
            self._connected.set()  # an answer proves the connection, whatever the monitor said
            message = envelope.message
            if isinstance(message, RequestOutputDelta):
                stream = self._streams.get(message.request_id)
                if stream is not None:
                    stream.queue.put_nowait(message)
                    if not stream.paused and not message.finished and stream.queue.qsize() >= self.backlog:
                        await self._pause(message.request_id, stream, True)
            elif isinstance(message, (HealthPong, SleepStatus)):
                fut = self._pings.pop(message.nonce, None)
                if fut is not None and not fut.done():
                    fut.set_result(message)
            elif isinstance(message, ErrorReply) and message.nonce in self._pings:
                fut = self._pings.pop(message.nonce)
                if not fut.done():
                    fut.set_exception(_error(message))
            elif isinstance(message, ErrorReply) and message.request_id in self._streams:
                self._streams[message.request_id].queue.put_nowait(_error(message))
            elif isinstance(message, ErrorReply) and message.kind == "AuthenticationError":
                for fut in self._pings.values():  # a refused ping names no request
                    if not fut.done():
                        fut.set_exception(_error(message))

    def fail_all(self, exc: BaseException) -> None:
        """The engine died: every open stream and ping raises exc, and so does every later call."""
        self._dead = exc
        self._fail_in_flight(exc)

    async def generate(self, prompt: PromptInput, params: Union[SamplingParams, BeamSearchParams, None] = None,
                       request_id: Optional[str] = None) -> AsyncIterator[RequestOutput]:
        """Stream cumulative outputs of one request. A ValueError from the engine is raised here. With
        BeamSearchParams, the engine runs a beam search and answers once, at its end, with its best
        sequences as the samples."""
        if self._dead is not None:
            raise self._dead
        params = params or SamplingParams()
        request_id = request_id or uuid.uuid4().hex
        if request_id in self._streams:
            raise ValueError(f"request_id {request_id!r} is already streaming")
        text, ids = _split_prompt(prompt)
        self._streams[request_id] = stream = _Stream()
        output = RequestOutput(request_id, text, list(ids or []), [CompletionOutput(i) for i in range(params.n)])
        finished = False
        try:
            try:
                if isinstance(params, BeamSearchParams):
                    message = AddRequest(request_id, SamplingParams(), ids, text, beam_search=params,
                                         api_key=self.api_key)
                else:
                    message = AddRequest(request_id, params, ids, text, api_key=self.api_key)
                await self._connect().send(message)
            except (OverflowError, TypeError) as exc:  # msgpack cannot carry it: no server can take it
                raise ValueError(f"prompt_token_ids: {exc}") from None
            while not finished:
                item = await self._next(stream.queue)
                stream.taken += 1
                if isinstance(item, BaseException):
                    raise item
                if stream.paused and stream.queue.qsize() <= self.backlog // 4:
                    await self._pause(request_id, stream, False)
                finished = _apply(output, item)
                yield output
        finally:
            self._streams.pop(request_id, None)
            if stream.stall is not None:
                stream.stall.cancel()
            if not finished and self._dead is None and self._channel is not None:
                await self._channel.send(AbortRequest(request_id, api_key=self.api_key))

    async def _pause(self, request_id: str, stream: _Stream, paused: bool) -> None:
        stream.paused = paused
        if stream.stall is not None:
            stream.stall.cancel()
            stream.stall = None
        if paused:
            self._watch_stall(request_id, stream)
        if self._dead is None and self._channel is not None:
            await self._channel.send(PauseRequest(request_id, paused, api_key=self.api_key))

    def _watch_stall(self, request_id: str, stream: _Stream) -> None:
        stream.stall = asyncio.get_running_loop().call_later(self.stall_timeout, self._check_stalled, request_id,
                                                             stream, stream.taken)

    def _check_stalled(self, request_id: str, stream: _Stream, taken: int) -> None:
        """A paused request's reader took nothing for stall_timeout: abort it (it ends with "abort", which
        the reader sees if it ever reads again); one that took some waits another stall_timeout."""
        stream.stall = None
        if not stream.paused or self._streams.get(request_id) is not stream:
            return
        if stream.taken != taken:
            self._watch_stall(request_id, stream)
            return
        stream.aborting = asyncio.ensure_future(self.abort(request_id))

    async def _next(self, queue: asyncio.Queue):
        """The stream's next item; EngineStartError if no server is listening for connect_timeout s."""
        if self._connected.is_set() or self.connect_timeout is None:
            return await queue.get()
        get, connected = asyncio.ensure_future(queue.get()), asyncio.ensure_future(self._connected.wait())
        try:
            done, _ = await asyncio.wait({get, connected}, timeout=self.connect_timeout,
                                         return_when=asyncio.FIRST_COMPLETED)
        finally:
            connected.cancel()
        if not done:
            get.cancel()
            raise EngineStartError(f"no engine is listening at {self.address} (waited {self.connect_timeout:g} s)")
        return await get

    async def abort(self, request_id: str) -> None:
        if self._dead is None:
            await self._connect().send(AbortRequest(request_id, api_key=self.api_key))

    async def check_health(self, timeout: float = 5.0) -> HealthPong:
        """A ping through the scheduler's loop: a stuck loop times out (asyncio.TimeoutError)."""
        return await self._ask(lambda nonce: HealthPing(nonce, api_key=self.api_key), timeout)

    async def sleep(self, level: int = 1, timeout: Optional[float] = None) -> SleepStatus:
        """Sleep mode: the engine finishes its step, keeps its requests waiting, and releases its memory."""
        return await self._ask(lambda nonce: SleepRequest(nonce, level, api_key=self.api_key), timeout)

    async def wake_up(self, tags: Optional[list[str]] = None, timeout: Optional[float] = None) -> SleepStatus:
        return await self._ask(lambda nonce: WakeUpRequest(nonce, tags, api_key=self.api_key), timeout)

    async def sleep_status(self, timeout: Optional[float] = 5.0) -> SleepStatus:
        return await self._ask(lambda nonce: SleepStatusRequest(nonce, api_key=self.api_key), timeout)

    async def _ask(self, message, timeout: Optional[float]):
        """A control-plane question by nonce (``message(nonce)``), answered or failed by the server."""
        if self._dead is not None:
            raise self._dead
        nonce = next(self._nonces)
        fut = asyncio.get_running_loop().create_future()
        self._pings[nonce] = fut
        await self._connect().send(message(nonce))
        try:
            return await asyncio.wait_for(fut, timeout)
        finally:
            self._pings.pop(nonce, None)

    async def close(self) -> None:
        for task in (self._receiver, self._monitor):
            if task is not None:
                task.cancel()
                await asyncio.gather(task, return_exceptions=True)
        if self._channel is not None:
            self._channel.close()
        if self._own_ctx:
            self._ctx.term()


def _split_prompt(prompt: PromptInput) -> tuple[Optional[str], Optional[list[int]]]:
    if isinstance(prompt, str):
        return prompt, None
    if isinstance(prompt, dict):
        ids = prompt.get("prompt_token_ids")
        return prompt.get("prompt"), None if ids is None else list(ids)
    return None, list(prompt)


def _apply(output: RequestOutput, delta: RequestOutputDelta) -> bool:
    if delta.prompt_token_ids is not None:
        output.prompt_token_ids = list(delta.prompt_token_ids)
    if delta.timings is not None:
        output.metrics = delta.timings
    if delta.prompt_logprobs is not None:
        output.prompt_logprobs = [None if tok is None else logprob_dict(tok) for tok in delta.prompt_logprobs]
    output.num_cached_tokens = delta.num_cached_tokens
    for s in delta.samples:
        out = output.outputs[s.index]
        out.token_ids.extend(s.token_ids)
        out.text += s.text
        if s.logprobs is not None:
            entries = [logprob_dict(tok) for tok in s.logprobs]
            out.logprobs = (out.logprobs or []) + entries
            out.cumulative_logprob = (out.cumulative_logprob or 0.0) + sum(
                next(iter(e.values())).logprob for e in entries)
        out.finish_reason = s.finish_reason or out.finish_reason
        out.stop_reason = s.stop_reason if s.finish_reason else out.stop_reason
    output.finished = delta.finished
    return delta.finished


def _error(reply: ErrorReply) -> BaseException:
    if reply.kind == "ValueError":
        return ValueError(reply.message)
    if reply.kind == "EngineDeadError":
        return EngineDeadError(reply.message)
    if reply.kind == "AuthenticationError":
        return PermissionError(reply.message)
    if reply.kind == "EngineSleepingError":
        return EngineSleepingError(reply.message)
    if reply.kind == "EngineOverloadedError":
        return EngineOverloadedError(reply.message)
    return RuntimeError(f"{reply.kind}: {reply.message}")
