"""WorkerActor: runs in a worker process; holds the weights and KV cache of one pipeline stage.

Stage 0 receives ExecuteBatch (and Shutdown) from the scheduler on its ZMQ PULL inbox. Every later stage
receives the same messages, with the previous stage's hidden states, over torch.distributed (gloo): a
receiver thread posts them to the mailbox, so one handler serves both. A stage that is not the last
fires its output to the next stage and goes on (the sends are retained, never awaited in the step); the
last stage samples and sends StepResult to the scheduler. The last stage announces WorkerReady. Sleep mode's
SleepRequest and WakeUpRequest go round the same ring between steps; the last stage answers SleepStatus.
"""
from __future__ import annotations

import asyncio
import logging
import threading
from datetime import timedelta

import msgspec
import zmq.asyncio

from actorserve.runtime.actor import Actor
from actorserve.runtime.transport.addresses import Addresses
from actorserve.runtime.config import EngineConfig
from actorserve.runtime.worker_assembly import load_worker
from actorserve.runtime.transport.channel import Channel, Envelope
from actorserve.runtime.transport.messages import (ExecuteBatch, Message, Shutdown, SleepRequest, SleepStatus,
                                                   StepResult, WakeUpRequest, WorkerReady)

log = logging.getLogger("actorserve.worker")


class WorkerActor(Actor):
    def __init__(self, ctx: zmq.asyncio.Context, config: EngineConfig, addresses: Addresses, rank: int = 0) -> None:
        super().__init__(f"worker{rank}")
        self.ctx = ctx
        self.config = config
        self.addresses = addresses
        self.rank = rank
        self.size = config.parallel.pipeline_parallel_size
        self.runner = None
        self.sender = None
        self.staging = None
        self.device = "cpu"
        self.device_group = None  # NCCL between CUDA stages

    @property
    def is_last(self) -> bool:
        return self.rank == self.size - 1

    async def on_start(self) -> dict:
        if self.rank == 0:
            self.channel(Channel(self.ctx, "pull", self.addresses.worker_in, bind=True), listen=True)
        self.out = self.channel(Channel(self.ctx, "push", self.addresses.scheduler_in, bind=False))
        threads = self.config.parallel.worker_threads()
        if threads is not None:
            import torch

            torch.set_num_threads(threads)
        if self.size > 1:
            self._join_pipeline()
        self.runner, facts, _ = load_worker(self.config, with_tokenizer=False, pp_rank=self.rank)
        if self.is_last:
            await self.out.send(WorkerReady(self.rank, facts.vocab_size, facts.eos_token_id, facts.max_model_len,
                                            facts.num_kv_blocks, facts.sliding_window, facts.num_state_slots))
        return {"num_kv_blocks": facts.num_kv_blocks, "stage": [self.runner.model.stage.start,
                                                                self.runner.model.stage.end]}

    def _join_pipeline(self) -> None:
        import torch.distributed as dist

        from actorserve.runtime.transport.pipeline import StagingBuffer, TensorDictSender

        p = self.config.parallel
        dist.init_process_group("gloo", init_method=f"tcp://{p.master_addr}:{p.master_port}", rank=self.rank,
                                world_size=self.size, timeout=timedelta(seconds=self.config.runtime.start_timeout))
        self.device = self.config.device.torch_device(self.rank)
        if self.device.startswith("cuda"):  # hidden states over NCCL; the headers stay on gloo
            import torch

            torch.cuda.set_device(self.device)
            self.device_group = dist.new_group(backend="nccl")
        if not self.is_last:
            self.sender = TensorDictSender(dst=self.rank + 1, device_group=self.device_group)
            self.staging = StagingBuffer(self.sender.pending)
        if self.rank > 0:
            loop = asyncio.get_running_loop()
            threading.Thread(target=self._receive_from_previous, args=(loop,), daemon=True,
                             name=f"pp-recv-{self.rank}").start()

    def _receive_from_previous(self, loop: asyncio.AbstractEventLoop) -> None:
        """Blocking gloo receives, off the loop; each arrival becomes a mailbox envelope."""
        from actorserve.runtime.transport.pipeline import recv_tensor_dict

        while True:
            try:
                message, tensors = recv_tensor_dict(self.rank - 1, Message, device_group=self.device_group,
                                                    device=self.device)
            except Exception as exc:  # the previous stage is gone; supervision tears the engine down
                log.warning("%s: pipeline receive ended: %s", self.name, exc)
                return
            envelope = Envelope(message, list(tensors.values()))
            loop.call_soon_threadsafe(self.mailbox.put_nowait, envelope)
            if isinstance(message, Shutdown):
                return

    async def handle_execute_batch(self, message: ExecuteBatch, envelope: Envelope) -> None:
        hidden_in = envelope.tensors[0] if envelope.tensors else None
        result = self.runner.execute(message.batch, hidden_in)
        if self.is_last:
            await self.out.send(StepResult(result))
            return
        staged = self.staging.stage(result)  # waits first if an earlier send still reads the buffer
        self.sender.isend_tensor_dict({"hidden": staged}, message, retain=(self.staging.buffer,))

    async def handle_sleep_request(self, message: SleepRequest, envelope: Envelope) -> None:
        """Release this stage's memory (the scheduler sends this only with nothing in flight), add the bytes
        to the message, and pass it on; the last stage answers the scheduler."""
        released, error = dict(message.released), message.error
        if error is None:
            try:
                for tag, n in self._sleep_mode().sleep(message.level).items():
                    released[tag] = released.get(tag, 0) + n
            except Exception as exc:  # noqa: BLE001 - the operator gets the reason; the stage stays as it is
                log.exception("%s: sleep failed", self.name)
                error = f"{self.name}: {type(exc).__name__}: {exc}"
        passed = msgspec.structs.replace(message, released=released, error=error)
        await self._pass_on(passed, SleepStatus(message.nonce, True, message.level, released, error))

    async def handle_wake_up_request(self, message: WakeUpRequest, envelope: Envelope) -> None:
        error = message.error
        if error is None:
            try:
                self._sleep_mode().wake_up(message.tags)
            except Exception as exc:  # noqa: BLE001 - the stage stays asleep; a later wake_up tries again
                log.exception("%s: wake-up failed", self.name)
                error = f"{self.name}: {type(exc).__name__}: {exc}"
        sleeping = self.runner.sleep_mode is not None and self.runner.sleep_mode.sleeping
        passed = msgspec.structs.replace(message, error=error)
        await self._pass_on(passed, SleepStatus(message.nonce, sleeping, error=error))

    def _sleep_mode(self):
        if self.runner.sleep_mode is None:
            raise ValueError("the engine was not started with enable_sleep_mode")
        return self.runner.sleep_mode

    async def _pass_on(self, message, answer: SleepStatus) -> None:
        if self.is_last:
            await self.out.send(answer)
        else:
            self.sender.isend_tensor_dict({}, message)

    def handle_shutdown(self, message: Shutdown, envelope: Envelope) -> None:
        if self.sender is not None:
            self.sender.isend_tensor_dict({}, message)
        self.stop()

    async def on_stop(self) -> None:
        if self.sender is not None:
            self.sender.drain()

    def on_failure(self, exc: BaseException, envelope: Envelope) -> None:
        # A failed step leaves the scheduler waiting and the KV cache in doubt: die, and let supervision act.
        log.exception("%s: step failed; stopping", self.name, exc_info=exc)
        self.failed = exc
        self.stop()
