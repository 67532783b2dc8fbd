"""Async ZMQ channels carrying typed messages.

Runs in every process. A Channel is one socket plus the codec: ``send`` encodes a message (tensors as
extra frames, sent without copying and retained in PendingSends until ZMQ is done with them) and
``recv`` returns an Envelope whose message is typed, or whose error says why the frames were rejected:
no content of a message can make ``recv`` raise. Receivers bind their inbox (PULL or ROUTER); senders
connect (PUSH or DEALER). A socket that faces clients can cap the size of a message
(``max_message_bytes``) and the number of its frames (``max_frames``), and report which connection each
message came from (``Envelope.peer``: the connection's file descriptor, which the socket monitor names when
that connection closes). libzmq enforces a size per frame, before the frame is buffered, and delivers a
multipart message only once all of its frames have arrived: the frame count and the whole message's size
can only be checked on receipt. A message past either is dropped unread and its ``Envelope.drop_peer`` is
set, so that the receiver can close that connection (``disconnect``).
"""
from __future__ import annotations

import asyncio
import logging
import os
import socket
from dataclasses import dataclass, field
from typing import Callable, Optional, Sequence

import torch
import zmq
import zmq.asyncio

from actorserve.runtime.transport.codec import Codec, ProtocolError
from actorserve.runtime.transport.messages import Message
from actorserve.runtime.transport.pending import PendingSends

log = logging.getLogger("actorserve.transport")

_KINDS = {"push": zmq.PUSH, "pull": zmq.PULL, "router": zmq.ROUTER, "dealer": zmq.DEALER}


@dataclass
class Envelope:
    message: Optional[Message]
    tensors: list[torch.Tensor] = field(default_factory=list)
    origin: Optional[bytes] = None  # the ROUTER identity of the sender, where there is one
    error: Optional[ProtocolError] = None
    via: str = ""  # the name of the channel it came in on: a message is trusted only on its own channel
    peer: Optional[int] = None  # the sender's connection (a file descriptor), where the channel tracks peers
    drop_peer: bool = False  # the sender broke the channel's frame or size limit: close its connection


class _TrackerHandle:
    """A ZMQ MessageTracker seen as a send handle (host memory: waited before its buffers go)."""

    def __init__(self, tracker: zmq.MessageTracker) -> None:
        self._tracker = tracker

    def is_completed(self) -> bool:
        return self._tracker.done

    def wait(self) -> None:
        self._tracker.wait()


_PEER_SNDBUF = 256 << 10  # what each connection of a send-limited socket holds in the kernel


class PeerNotReading(Exception):
    """A ROUTER peer has ``peer_send_limit`` messages queued that it does not read."""

    def __init__(self, peer: Optional[bytes]) -> None:
        super().__init__(f"peer {peer!r} does not read its messages")
        self.peer = peer


class Channel:
    def __init__(self, ctx: zmq.asyncio.Context, kind: str, address: str, bind: bool,
                 identity: Optional[bytes] = None, monitor_events: int = 0, name: str = "",
                 max_message_bytes: Optional[int] = None, max_frames: Optional[int] = None,
                 track_peers: bool = False,
                 configure: Optional[Callable[[zmq.Socket], None]] = None,
                 heartbeat_s: Optional[float] = None, peer_send_limit: Optional[int] = None) -> None:
        """``configure`` sets socket options that must precede bind or connect (CurveZMQ keys).
        ``heartbeat_s``: ZMTP pings on every connection, so that a peer gone without closing (a host
        that vanished) is disconnected after three intervals of silence. ``peer_send_limit`` (a ROUTER):
        messages queued for one peer that does not read them, beyond which ``send`` to it raises
        ``PeerNotReading`` (instead of libzmq's silent drop) rather than queueing more."""
        self.kind = kind
        self.address = address
        self.name = name or kind
        self.track_peers = track_peers
        self.max_message_bytes, self.max_frames = max_message_bytes, max_frames
        self.socket = ctx.socket(_KINDS[kind])
        self.socket.setsockopt(zmq.LINGER, 0)
        if max_message_bytes is not None:
            self.socket.setsockopt(zmq.MAXMSGSIZE, max_message_bytes)
        if heartbeat_s is not None:
            self.socket.setsockopt(zmq.HEARTBEAT_IVL, int(heartbeat_s * 1000))
            self.socket.setsockopt(zmq.HEARTBEAT_TIMEOUT, int(3 * heartbeat_s * 1000))
        if configure is not None:
            configure(self.socket)
        # Outputs must never be dropped at a high-water mark (ROUTER drops silently): no limit, or a limit
        # that raises (ROUTER_MANDATORY) for the owner to drop the peer whole.
        self.peer_send_limit = peer_send_limit
        self.socket.setsockopt(zmq.SNDHWM, peer_send_limit or 0)
        if peer_send_limit is not None:
            self.socket.setsockopt(zmq.ROUTER_MANDATORY, 1)
            # and the kernel's send buffer fixed, which would otherwise grow to megabytes for a peer
            self.socket.setsockopt(zmq.SNDBUF, _PEER_SNDBUF)
        self.socket.setsockopt(zmq.RCVHWM, 0)
        if identity is not None:
            self.socket.setsockopt(zmq.IDENTITY, identity)
        self.bind = bind
        # attached before connecting, so that no event (the first connection above all) goes unseen
        self.monitor = self.socket.get_monitor_socket(monitor_events) if monitor_events else None
        (self.socket.bind if bind else self.socket.connect)(address)
        self._codec = Codec()
        self._pending = PendingSends(max_entries=64)

    async def send(self, message: Message, tensors: Sequence[torch.Tensor] = (),
                   to: Optional[bytes] = None) -> None:
        frames = self._codec.encode(message, tensors)
        if to is not None:
            frames.insert(0, to)
        if self.peer_send_limit is not None:
            # now or never: a send that waited for room would hold every other peer's messages behind it (the
            # socket's own NOBLOCK send, which also wakes its receivers, as a bare sync send would not)
            try:
                await self.socket.send_multipart(frames, zmq.NOBLOCK)
            except zmq.Again:
                raise PeerNotReading(to) from None
            except zmq.ZMQError as exc:
                if exc.errno != zmq.EHOSTUNREACH:  # (a peer gone: let go, as a ROUTER without the limit does)
                    raise
            return
        if not tensors:
            await self.socket.send_multipart(frames)
            return
        tracker = await self.socket.send_multipart(frames, copy=False, track=True)
        self._pending.add([tensors, frames], host=[_TrackerHandle(tracker)])

    async def recv(self) -> Envelope:
        peer = None
        if self.track_peers:
            raw = await self.socket.recv_multipart(copy=False)
            peer = raw[0].get(zmq.SRCFD)
            frames = [f.bytes for f in raw]
        else:
            frames = await self.socket.recv_multipart(copy=True)
        origin = None
        if self.kind == "router":
            origin, frames = frames[0], frames[1:]
        refused = self._past_limits(frames)
        if refused is not None:
            del frames  # its buffers go now, not when the envelope does
            return Envelope(None, origin=origin, error=refused, via=self.name, peer=peer, drop_peer=True)
        try:
            message, tensors = self._codec.decode(frames)
        except ProtocolError as exc:
            return Envelope(None, origin=origin, error=exc, via=self.name, peer=peer)
        return Envelope(message, tensors, origin, via=self.name, peer=peer)

    def _past_limits(self, frames: list) -> Optional[ProtocolError]:
        if self.max_frames is not None and len(frames) > self.max_frames:
            return ProtocolError(f"a message of {len(frames)} frames: this socket takes at most {self.max_frames}")
        size = sum(len(f) for f in frames)
        if self.max_message_bytes is not None and size > self.max_message_bytes:
            return ProtocolError(f"a message of {size} bytes: this socket takes at most {self.max_message_bytes}")
        return None

    def disconnect(self, peer: int, delay_s: float = 0.2) -> None:
        """Close a client's connection (``Envelope.peer``) after ``delay_s``, time for a reply already queued
        to it to go out. ZMQ has no call that drops one peer of a ROUTER; shutting the connection's socket
        down makes libzmq see it end, and its monitor report the disconnection, as when a client leaves. The
        descriptor is shut only if it still holds the same connection (a new one may have reused it)."""
        try:
            with socket.socket(fileno=os.dup(peer)) as conn:
                remote = conn.getpeername()
        except OSError:
            return  # already gone
        asyncio.get_running_loop().call_later(delay_s, _shut_down, peer, remote)

    def close(self) -> None:
        self._pending.drain()
        if self.monitor is not None:
            self.socket.disable_monitor()
            self.monitor.close(linger=0)
        self.socket.close(linger=0)
        if self.bind and self.address.startswith("ipc://"):
            _remove_ipc_path(self.address[len("ipc://"):])


def _shut_down(fd: int, remote) -> None:
    try:
        with socket.socket(fileno=os.dup(fd)) as conn:
            if conn.getpeername() == remote:
                conn.shutdown(socket.SHUT_RDWR)
    except OSError:
        pass  # closed meanwhile


def _remove_ipc_path(path: str) -> None:
    """The binder removes its socket file, and the last one out its actorserve temp folder."""
    try:
        os.unlink(path)
    except OSError:
        return
    folder = os.path.dirname(path)
    if os.path.basename(folder).startswith("actorserve-"):
        try:
            os.rmdir(folder)
        except OSError:
            pass  # not empty yet: another actor's socket is still there
