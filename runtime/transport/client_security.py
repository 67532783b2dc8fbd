"""CurveZMQ on the client socket: encryption, and only the clients whose public keys the server holds.

Runs in the scheduler process (the server side) and in a client's (ZmqClient). Keys are pyzmq's
``zmq.auth`` certificate files (``zmq.auth.create_certificates``): the server loads its own key pair
and admits a client whose public key is a certificate in the authorized folder (read at each new
connection, so a client can be added without a restart), or the launcher's own key, checked by pyzmq's
ZAP authenticator on the server's ZMQ context. A client needs the server's public certificate and its
own key pair; the launcher's embedded client makes a key pair of its own at start-up. The launcher's control socket and the worker sockets never face clients and stay in the
launcher's private folder.
"""
from __future__ import annotations

from typing import Optional

import zmq
import zmq.auth
from zmq.auth.asyncio import AsyncioAuthenticator


class _AuthorizedKeys:
    """pyzmq's credentials provider: the folder's public keys, and the launcher's."""

    def __init__(self, folder: str, launcher_key: Optional[str]) -> None:
        self.folder, self.launcher_key = folder, launcher_key.encode() if launcher_key else None

    def callback(self, domain: str, key: bytes) -> bool:
        return key == self.launcher_key or bool(zmq.auth.load_certificates(self.folder).get(key))


class CurveServer:
    def __init__(self, ctx: zmq.asyncio.Context, secret_key_file: str, authorized_keys: str,
                 launcher_key: Optional[str] = None) -> None:
        self.public, self.secret = zmq.auth.load_certificate(secret_key_file)
        if self.secret is None:
            raise ValueError(f"curve_secret_key: {secret_key_file} holds no secret key")
        self._auth = AsyncioAuthenticator(ctx)
        self._auth.start()
        self._auth.configure_curve_callback(domain="*", credentials_provider=_AuthorizedKeys(authorized_keys,
                                                                                            launcher_key))

    def configure(self, socket: zmq.Socket) -> None:
        socket.curve_secretkey = self.secret
        socket.curve_publickey = self.public
        socket.curve_server = True

    def stop(self) -> None:
        self._auth.stop()


def curve_server(ctx, secret_key_file: Optional[str], authorized_keys: Optional[str],
                 launcher_key: Optional[str] = None) -> Optional[CurveServer]:
    if secret_key_file is None:
        return None
    return CurveServer(ctx, secret_key_file, authorized_keys, launcher_key)


def curve_client(server_public_key_file: str, client_key_file: str):
    """The option setter of a client socket (before it connects)."""
    server_public, _ = zmq.auth.load_certificate(server_public_key_file)
    public, secret = zmq.auth.load_certificate(client_key_file)
    if secret is None:
        raise ValueError(f"{client_key_file} holds no secret key")
    return curve_keys(server_public, public, secret)


def curve_keys(server_public: bytes, public: bytes, secret: bytes):
    def configure(socket: zmq.Socket) -> None:
        socket.curve_serverkey = server_public
        socket.curve_publickey = public
        socket.curve_secretkey = secret

    return configure
