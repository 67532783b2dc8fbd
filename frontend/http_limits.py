"""What one HTTP connection may take from the server: body size, time to send its request, idle time.

Runs in the frontend process. ``BodyLimit`` wraps the ASGI app: a body larger than the limit is refused
with 413 (at once when Content-Length says so, else as soon as the bytes pass it), and a body that does
not arrive whole within the read timeout (a slow sender, a Content-Length larger than what follows) is
refused with 408; both in the OpenAI error shape, before the app sees the request. ``header_timeout_protocol`` gives uvicorn an h11
protocol that closes a connection whose request line and headers do not arrive within the same
timeout, on a new connection and between keep-alive requests alike (uvicorn's keep-alive timeout only
covers a connection that sends nothing at all).
"""
from __future__ import annotations

import asyncio
import json

from uvicorn.protocols.http.h11_impl import H11Protocol

from actorserve.frontend.errors import error_body


class BodyLimit:
    """Reads the body (FastAPI would buffer it whole anyway) within the limits, answering 413 or 408
    itself, then hands the app the body it read."""

    def __init__(self, app, max_bytes: int, read_timeout: float) -> None:
        self.app, self.max_bytes, self.read_timeout = app, max_bytes, read_timeout

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        length = dict(scope["headers"]).get(b"content-length")
        if length is not None and not length.isdigit():
            return await _respond(send, 400, "Content-Length is not a number")
        if length is not None and int(length) > self.max_bytes:
            return await _respond(send, 413, self._too_large())
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.read_timeout
        parts, size, more = [], 0, True
        while more:
            try:
                message = await asyncio.wait_for(receive(), max(0.0, deadline - loop.time()))
            except asyncio.TimeoutError:
                return await _respond(send, 408, f"the request body did not arrive within {self.read_timeout:g} s "
                                                 "(--request-read-timeout)")
            if message["type"] != "http.request":  # the client left: the app sees it leave
                return await self.app(scope, _replay([message], receive), send)
            parts.append(message.get("body", b""))
            size += len(parts[-1])
            if size > self.max_bytes:
                return await _respond(send, 413, self._too_large())
            more = message.get("more_body", False)
        body = {"type": "http.request", "body": b"".join(parts), "more_body": False}
        await self.app(scope, _replay([body], receive), send)

    def _too_large(self) -> str:
        return f"the request body is larger than the server's limit of {self.max_bytes} bytes (--max-request-body-bytes)"


def _replay(messages: list, receive):
    async def replayed():
        return messages.pop(0) if messages else await receive()
    return replayed


async def _respond(send, status: int, message: str) -> None:
    body = json.dumps(error_body(status, message)).encode()
    await send({"type": "http.response.start", "status": status,
                "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode()),
                            (b"connection", b"close")]})
    await send({"type": "http.response.body", "body": body})


def header_timeout_protocol(timeout: float, write_buffer_bytes: int) -> type:
    """An H11Protocol whose every request must have its head complete within ``timeout`` seconds, and whose
    transport holds at most ``write_buffer_bytes`` unsent before its writer waits (asyncio's default, 64 KiB,
    would be a second buffer beside the kernel's that a client which stops reading fills first)."""

    class HeaderTimeoutH11Protocol(H11Protocol):
        _head_timer = None

        def connection_made(self, transport) -> None:
            super().connection_made(transport)
            transport.set_write_buffer_limits(high=write_buffer_bytes)
            self._arm_head_timer()

        def connection_lost(self, exc) -> None:
            self._disarm_head_timer()
            super().connection_lost(exc)

        def handle_events(self) -> None:
            super().handle_events()
            if self.cycle is not None and not self.cycle.response_complete:
                self._disarm_head_timer()  # the head arrived: the body has BodyLimit's deadline

        def on_response_complete(self) -> None:
            super().on_response_complete()
            self._arm_head_timer()

        def _arm_head_timer(self) -> None:
            self._disarm_head_timer()
            self._head_timer = self.loop.call_later(timeout, self._head_timed_out)

        def _disarm_head_timer(self) -> None:
            if self._head_timer is not None:
                self._head_timer.cancel()
                self._head_timer = None

        def _head_timed_out(self) -> None:
            if (self.cycle is None or self.cycle.response_complete) and not self.transport.is_closing():
                self.transport.close()

    return HeaderTimeoutH11Protocol
