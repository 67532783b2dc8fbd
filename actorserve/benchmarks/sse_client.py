"""A lean streaming HTTP/1.1 POST for the load generator: asyncio streams, no client library.

The load generator shares the machine with the server it measures, so its own CPU per token is taken
from the server. Parsing every SSE chunk into the ``openai`` client's pydantic models cost about a fifth
of a core at 32 streams here (vLLM's benchmark reads raw SSE over aiohttp for the same reason); this reads
the ``data:`` lines and leaves them to ``json.loads``.
"""
from __future__ import annotations

import asyncio
import json
import ssl
from typing import AsyncIterator, Optional
from urllib.parse import urlsplit


class HTTPStatusError(Exception):
    def __init__(self, status: int, body: str) -> None:
        super().__init__(f"HTTP {status}: {body[:300]}")
        self.status = status


async def post_sse(url: str, payload: dict, headers: Optional[dict] = None,
                   timeout: float = 3600.0) -> AsyncIterator[dict]:
    """POST ``payload`` as JSON and yield each SSE ``data:`` event, decoded, until ``[DONE]`` or the end."""
    parts = urlsplit(url)
    tls = parts.scheme == "https"
    port = parts.port or (443 if tls else 80)
    reader, writer = await asyncio.wait_for(
        asyncio.open_connection(parts.hostname, port, ssl=ssl.create_default_context() if tls else None,
                                limit=1 << 20), timeout)
    try:
        body = json.dumps(payload).encode()
        head = [f"POST {parts.path or '/'}{'?' + parts.query if parts.query else ''} HTTP/1.1",
                f"Host: {parts.netloc}", "Content-Type: application/json", "Accept: text/event-stream",
                f"Content-Length: {len(body)}", "Connection: close"]
        head += [f"{k}: {v}" for k, v in (headers or {}).items()]
        writer.write(("\r\n".join(head) + "\r\n\r\n").encode() + body)
        await writer.drain()
        status_line = await reader.readline()
        fields = status_line.split(None, 2)
        if len(fields) < 2 or not fields[1].isdigit():
            raise HTTPStatusError(0, f"not an HTTP response: {status_line[:100]!r}")
        status = int(fields[1])
        response_headers = {}
        while True:
            line = await reader.readline()
            if line in (b"\r\n", b"\n", b""):
                break
            key, _, value = line.decode("latin-1").partition(":")
            response_headers[key.strip().lower()] = value.strip()
        chunked = "chunked" in response_headers.get("transfer-encoding", "").lower()
        blocks = _chunks(reader) if chunked else _plain(reader, response_headers.get("content-length"))
        if status != 200:
            raise HTTPStatusError(status, b"".join([b async for b in blocks]).decode("utf-8", "replace"))
        pending = b""
        async for block in blocks:
            pending += block
            *lines, pending = pending.split(b"\n")
            for line in lines:
                if not line.startswith(b"data:"):
                    continue
                data = line[5:].strip()
                if data == b"[DONE]":
                    return
                yield json.loads(data)
    finally:
        writer.close()


async def _chunks(reader: asyncio.StreamReader) -> AsyncIterator[bytes]:
    while True:
        size_line = await reader.readline()
        if not size_line:
            return
        size = int(size_line.split(b";")[0].strip() or b"0", 16)
        if size == 0:
            return
        yield await reader.readexactly(size)
        await reader.readexactly(2)  # the CRLF after each chunk


async def _plain(reader: asyncio.StreamReader, length: Optional[str]) -> AsyncIterator[bytes]:
    if length is not None:
        if int(length):
            yield await reader.readexactly(int(length))
        return
    while True:
        block = await reader.read(1 << 16)
        if not block:
            return
        yield block
