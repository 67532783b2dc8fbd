"""The actor base: one mailbox, one loop, a ``handle_<message>`` dispatch table built once per class.

Runs in every actor process (or on a shared loop in in-process mode). Channels feed the mailbox; the
loop takes one envelope at a time and calls the handler registered for its message type. A frame that
does not decode, or a message type the actor has no handler for, is logged and rejected (``on_reject``),
and the actor goes on. A handler that raises goes to ``on_failure``; the default logs and goes on.
"""
from __future__ import annotations

import asyncio
import logging
import re
import typing
from typing import Any, Callable, ClassVar, Optional

import zmq

from actorserve.runtime.transport.channel import Channel, Envelope
from actorserve.runtime.transport.messages import Message

log = logging.getLogger("actorserve.actor")


def handler_name(message_type: type) -> str:
    return "handle_" + re.sub(r"(?<!^)(?=[A-Z])", "_", message_type.__name__).lower()


class Actor:
    _handlers: ClassVar[dict[type, Callable[..., Any]]] = {}

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        table = {}
        for message_type in typing.get_args(Message):
            fn = next((klass.__dict__[handler_name(message_type)] for klass in cls.__mro__
                       if handler_name(message_type) in klass.__dict__), None)
            if fn is not None:
                table[message_type] = fn
        cls._handlers = table

    def __init__(self, name: str) -> None:
        self.name = name
        self.mailbox: Optional[asyncio.Queue[Envelope]] = None
        self._stopped: Optional[asyncio.Event] = None
        self._listeners: list[asyncio.Task] = []
        self._channels: list[Channel] = []
        self.failed: Optional[BaseException] = None  # set when the actor stops because of an error

    # -- lifecycle hooks ------------------------------------------------------------------------------------
    async def on_start(self) -> dict:
        """Set up; the returned dict goes to the launcher with the ready signal."""
        return {}

    async def on_stop(self) -> None:
        """Release what on_start took; every channel is closed after this."""

    def on_failure(self, exc: BaseException, envelope: Envelope) -> None:
        log.exception("%s: handler for %s failed", self.name, type(envelope.message).__name__, exc_info=exc)

    async def on_reject(self, envelope: Envelope, reason: str) -> None:
        log.warning("%s: rejected a message: %s", self.name, reason)

    # -- wiring -----------------------------------------------------------------------------------------------
    def channel(self, channel: Channel, listen: bool = False) -> Channel:
        self._channels.append(channel)
        if listen:
            self._listeners.append(asyncio.ensure_future(self._listen(channel)))
        return channel

    async def _listen(self, channel: Channel) -> None:
        """Feed the mailbox until the socket closes; a failing receive is logged, never the end of it."""
        while True:
            try:
                envelope = await channel.recv()
            except asyncio.CancelledError:
                raise
            except zmq.ZMQError as exc:
                if exc.errno in (zmq.ETERM, zmq.ENOTSOCK):
                    return
                log.exception("%s: receiving on %s failed", self.name, channel.name)
                await asyncio.sleep(0.01)
                continue
            except Exception:
                log.exception("%s: receiving on %s failed", self.name, channel.name)
                await asyncio.sleep(0.01)
                continue
            await self.mailbox.put(envelope)

    def stop(self) -> None:
        """Safe from signal handlers: only sets a state and wakes the loop."""
        if self._stopped is not None:
            self._stopped.set()

    @property
    def stopping(self) -> bool:
        return self._stopped is not None and self._stopped.is_set()

    # -- the loop ---------------------------------------------------------------------------------------------
    async def run(self, ready: Optional[Callable[[dict], None]] = None) -> None:
        self.mailbox = asyncio.Queue()
        self._stopped = asyncio.Event()
        try:
            info = await self.on_start()
            if ready is not None:
                ready(info)
            await self._serve()
        finally:
            for task in self._listeners:
                task.cancel()
            await asyncio.gather(*self._listeners, return_exceptions=True)
            try:
                await self.on_stop()
            finally:
                for ch in self._channels:
                    ch.close()

    async def _serve(self) -> None:
        stop_wait = asyncio.ensure_future(self._stopped.wait())
        try:
            while not self._stopped.is_set():
                get = asyncio.ensure_future(self.mailbox.get())
                await asyncio.wait({get, stop_wait}, return_when=asyncio.FIRST_COMPLETED)
                if not get.done():
                    get.cancel()
                    break
                await self.dispatch(get.result())
        finally:
            stop_wait.cancel()

    async def dispatch(self, envelope: Envelope) -> None:
        if envelope.error is not None:
            await self.on_reject(envelope, str(envelope.error))
            return
        fn = self._handlers.get(type(envelope.message))
        if fn is None:
            await self.on_reject(envelope, f"{self.name} has no handler for {type(envelope.message).__name__}")
            return
        try:
            result = fn(self, envelope.message, envelope)
            if asyncio.iscoroutine(result):
                await result
        except Exception as exc:  # one bad message must not take the actor down
            self.on_failure(exc, envelope)
