"""One rank of the two-process gloo test: rank 0 fires sends and drops the handles; rank 1 starts late."""
import os
import sys
import time
from datetime import timedelta

import msgspec
import torch
import torch.distributed as dist

from actorserve.runtime.transport.pipeline import TensorDictSender, recv_tensor_dict

STEPS = 200
BOUND = 4


class Meta(msgspec.Struct):
    step: int
    note: str
    values: list[int]


def payload(step: int) -> tuple[dict, Meta]:
    g = torch.Generator().manual_seed(step)
    kind = step % 7
    if kind == 6:
        return {}, Meta(step, "metadata only", [step])
    tensors = {
        "f32": torch.randn(1 + step % 5, 3 + step % 11, generator=g),
        "bf16": torch.randn(4, 1 + step % 3, generator=g).to(torch.bfloat16),
        "i64": torch.randint(-2**40, 2**40, (step % 9,), generator=g),
        "mask": torch.rand(3, 2, generator=g) > 0.5,
        "empty": torch.empty(0, 7),
    }
    if kind == 3:
        tensors["scalar"] = torch.tensor(float(step))
        tensors["f32"][0, 0] = float("nan")
    return tensors, Meta(step, "x" * (step % 13), list(range(step % 4)))


def main() -> int:
    rank, port = int(sys.argv[1]), int(sys.argv[2])
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2,
                            timeout=timedelta(seconds=60))
    if rank == 0:
        sender = TensorDictSender(dst=1, max_pending=BOUND)
        for step in range(STEPS):
            tensors, meta = payload(step)
            sender.isend_tensor_dict(tensors, meta)  # the handles are not kept
            del tensors
            assert len(sender.pending) <= BOUND
        sender.drain()
        print(f"high water {sender.pending.high_water}", flush=True)
    else:
        time.sleep(0.5)  # start late: the sender runs ahead until its bounded FIFO makes it wait
        for step in range(STEPS):
            meta, got = recv_tensor_dict(0, Meta)
            want, want_meta = payload(step)
            assert meta == want_meta, (meta, want_meta)
            assert set(got) == set(want)
            for k, t in want.items():
                assert got[k].dtype == t.dtype and got[k].shape == t.shape, k
                if t.numel():  # bit-identical, NaN included
                    assert torch.equal(got[k].reshape(-1).view(torch.uint8), t.reshape(-1).view(torch.uint8))
        print("received all", flush=True)
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
    sys.exit(main())
