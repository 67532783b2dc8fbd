"""The ipc folder outlives a child that closes early while the launcher holds it (start-up), and goes with
the last socket once the mark is dropped (every child ready)."""
import os
import tempfile

import zmq.asyncio

from actorserve.runtime.actors.addresses import Addresses
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
