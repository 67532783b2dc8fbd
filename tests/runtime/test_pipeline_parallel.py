"""Acceptance: pipeline parallelism gives PP=1's greedy outputs; a dead stage kills the engine cleanly."""
import asyncio
import os
import random
import signal

import psutil
import pytest
import torch

from actorserve import LLM, AsyncEngine, SamplingParams
from actorserve.runtime.errors import EngineDeadError
from actorserve.runtime.transport import pipeline
from actorserve.runtime.transport.pipeline import StagingBuffer, TensorDictSender
from tests.conftest import save_tiny_model

GREEDY = SamplingParams(temperature=0.0, max_tokens=64)


@pytest.fixture(scope="module")
def six_layers(tmp_path_factory):
    return save_tiny_model("llama", tmp_path_factory.mktemp("six"), seed=5, num_hidden_layers=6,
                           tie_word_embeddings=True)


def stress_set(seed=3, count=200):
    rng = random.Random(seed)
    shared = [rng.randrange(384) for _ in range(48)]
    prompts, params = [], []
    for i in range(count):
        n = rng.randint(1, 400)
        body = [rng.randrange(384) for _ in range(n)]
        prompts.append({"prompt_token_ids": (shared + body)[:n] if i % 2 == 0 else body})
        params.append(SamplingParams(temperature=0.0, max_tokens=rng.randint(1, 64), ignore_eos=True))
    return prompts, params


ARGS = dict(skip_tokenizer_init=True, kv_cache_memory=48 * 3 * 8192, max_model_len=512, max_num_batched_tokens=256)


@pytest.fixture(scope="module")
def stress_pp1(six_layers):
    """The stress set's outputs with one stage, which preempts and hits the prefix cache."""
    prompts, params = stress_set()
    single = LLM(str(six_layers), **ARGS)
    expected = [o.outputs[0].token_ids for o in single.generate(prompts, params, use_tqdm=False)]
    assert single.engine.scheduler.num_preemptions > 0 and single.engine.kv.pool.hits > 0
    return prompts, params, expected


@pytest.mark.parametrize("pp", [2, 3])
def test_stress_set_equals_pp1(six_layers, stress_pp1, pp):
    prompts, params, expected = stress_pp1
    with LLM(str(six_layers), pipeline_parallel_size=pp, **ARGS) as piped:
        got = [o.outputs[0].token_ids for o in piped.generate(prompts, params, use_tqdm=False)]
    assert got == expected


@pytest.mark.cuda
def test_two_gpu_stages_over_nccl_equal_one(six_layers):
    """Each stage on its own GPU, the hidden states over NCCL (the headers over gloo)."""
    if torch.cuda.device_count() < 2:
        pytest.skip("needs two CUDA devices")
    prompts, params = stress_set(count=40)
    args = dict(ARGS, device="cuda", dtype="bfloat16")
    single = LLM(str(six_layers), **args)
    expected = [o.outputs[0].token_ids for o in single.generate(prompts, params, use_tqdm=False)]
    with LLM(str(six_layers), pipeline_parallel_size=2, **args) as piped:
        got = [o.outputs[0].token_ids for o in piped.generate(prompts, params, use_tqdm=False)]
    assert got == expected


@pytest.mark.parametrize("pp", [2, 3])
def test_reference_prompts_equal_pp1(greedy_reference, pp):
    with LLM(kv_cache_memory=64 << 20, max_model_len=1024, pipeline_parallel_size=pp) as llm:
        outs = llm.generate([{"prompt_token_ids": p["prompt_ids"]} for p in greedy_reference["prompts"]], GREEDY,
                            use_tqdm=False)
        chat = llm.chat([{"role": "user", "content": greedy_reference["prompts"][0]["user_prompt"]}], GREEDY,
                        use_tqdm=False)[0]
    assert [o.outputs[0].token_ids for o in outs] == [p["output_ids"] for p in greedy_reference["prompts"]]
    assert chat.outputs[0].text == greedy_reference["prompts"][0]["output_text"]


@pytest.mark.parametrize("victim", ["worker1", "worker0"])
async def test_killing_a_stage_fails_streams_fast(six_layers, victim):
    engine = await AsyncEngine.create(str(six_layers), pipeline_parallel_size=2, **ARGS)
    pids = engine.child_pids()
    progress = asyncio.Event()
    errors = []

    async def stream(i):
        try:
            async for out in engine.generate({"prompt_token_ids": [i + 1, 2]},
                                             SamplingParams(max_tokens=480, ignore_eos=True)):
                if len(out.outputs[0].token_ids) > 3:
                    progress.set()
        except EngineDeadError:
            errors.append(asyncio.get_running_loop().time())

    tasks = [asyncio.ensure_future(stream(i)) for i in range(8)]
    await asyncio.wait_for(progress.wait(), 60)
    killed = asyncio.get_running_loop().time()
    os.kill(pids[victim], signal.SIGKILL)
    await asyncio.wait_for(asyncio.gather(*tasks), 10)
    assert len(errors) == 8 and max(errors) - killed < 2.0
    await engine.close()
    await asyncio.sleep(0.5)
    assert not [p for p in pids.values() if psutil.pid_exists(p) and psutil.Process(p).status() != "zombie"]


class LateHandle:
    """Completes only when told; records what the staging buffer held when it was waited."""

    def __init__(self, log, buffer_ref):
        self.done, self.log, self.buffer_ref = False, log, buffer_ref

    def is_completed(self):
        return self.done

    def wait(self):
        self.log.append(self.buffer_ref().clone() if self.buffer_ref() is not None else None)
        self.done = True


def test_a_buffer_still_being_sent_is_waited_before_reuse(monkeypatch):
    waited = []
    holder = {}
    monkeypatch.setattr(pipeline.dist, "isend", lambda t, dst, group=None: LateHandle(waited, lambda: holder.get("b")))
    sender = TensorDictSender(dst=1, max_pending=8)
    staging = StagingBuffer(sender.pending)
    first = staging.stage(torch.full((2, 3), 1.0))
    holder["b"] = staging.buffer
    sender.isend_tensor_dict({"hidden": first}, None, retain=(staging.buffer,))
    assert len(sender.pending) == 1 and not waited
    second = staging.stage(torch.full((2, 3), 2.0))  # must wait the first send before writing
    assert waited and all(torch.equal(w[:6], torch.ones(6)) for w in waited if w is not None)
    assert torch.equal(second, torch.full((2, 3), 2.0)) and len(sender.pending) == 0
