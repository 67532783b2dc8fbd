"""The ipc folder outlives a child that closes early while the launcher holds it (start-up), and goes with
the last socket once the mark is dropped (every child ready); tcp ports are picked where no outgoing
connection can take them before the bind."""
import os
import random
import socket
import tempfile

import zmq.asyncio

from actorserve.runtime.transport import addresses as addresses_module
from actorserve.runtime.transport.addresses import Addresses, free_ports
from actorserve.runtime.transport.channel import Channel


def test_folder_outlives_an_early_close_while_held():
    ctx = zmq.asyncio.Context()
    try:
        addresses = Addresses.ipc(tempfile.mkdtemp(prefix="actorserve-"))
        addresses.hold_folder()
        failed_early = Channel(ctx, "pull", addresses.worker_in, bind=True)
        failed_early.close()  # a worker whose model is missing
        assert os.path.isdir(addresses.folder)
        late = Channel(ctx, "pull", addresses.scheduler_in, bind=True)  # a sibling still starting binds
        addresses.release_folder()  # every child ready
        addresses.release_folder()  # idempotent
        late.close()
        assert not os.path.exists(addresses.folder)
    finally:
        ctx.destroy(linger=0)


def test_inproc_addresses_have_no_folder():
    addresses = Addresses.inproc("x")
    assert addresses.folder is None
    addresses.release_folder()


def _bindable(port: int) -> bool:
    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
        return True


def test_free_ports_are_distinct_bindable_and_below_the_ephemeral_range():
    low = addresses_module._ephemeral_range()[0]
    for _ in range(20):
        ports = free_ports("127.0.0.1", 4)
        assert len(set(ports)) == 4
        assert all(20000 <= p < low for p in ports), (ports, low)
        assert all(_bindable(p) for p in ports)


def test_a_listener_s_port_is_never_offered(monkeypatch):
    port = free_ports("127.0.0.1", 1)[0]
    taken = socket.socket()
    taken.bind(("127.0.0.1", port))
    taken.listen()
    picks = iter([port, port])  # the random picks land on the listener's port twice, then anywhere

    class Picks:
        def randrange(self, low, high):
            return next(picks, None) or random.randrange(low, high)

    monkeypatch.setattr(addresses_module.random, "SystemRandom", Picks)
    try:
        ports = free_ports("127.0.0.1", 2)
        assert port not in ports and len(set(ports)) == 2
    finally:
        taken.close()


def test_without_room_below_the_ephemeral_range_the_kernel_picks(monkeypatch):
    monkeypatch.setattr(addresses_module, "_ephemeral_range", lambda: (1024, 65535))
    ports = free_ports("127.0.0.1", 3)
    assert len(set(ports)) == 3 and all(_bindable(p) for p in ports)
