"""Acceptance: AsyncEngine over real processes: many concurrent streams, cancellation, abort, health."""
import asyncio
import os
import random

import pytest

from actorserve import AsyncEngine, SamplingParams
from actorserve.runtime.errors import EngineDeadError
from actorserve.runtime.errors import EngineStartError

GREEDY = SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True)


def engine_args(tiny_llama_dir, **kw):
    args = dict(skip_tokenizer_init=True, kv_cache_memory=4 << 20, max_model_len=512)
    args.update(kw)
    return str(tiny_llama_dir), args


async def collect(engine, prompt, params, request_id=None):
    last = None
    async for out in engine.generate({"prompt_token_ids": prompt}, params, request_id):
        last = out
    return last


def prompts(count, seed=0):
    rng = random.Random(seed)
    return [[rng.randrange(384) for _ in range(rng.randint(1, 60))] for _ in range(count)]


async def test_500_concurrent_streams_match_the_in_process_engine(tiny_llama_dir):
    model, args = engine_args(tiny_llama_dir)
    work = prompts(500)
    async with AsyncEngine(model, **args) as engine:
        multi = await asyncio.gather(*[collect(engine, p, GREEDY) for p in work])
    async with AsyncEngine(model, mode="inprocess", **args) as engine:
        single = await asyncio.gather(*[collect(engine, p, GREEDY) for p in work])
    assert all(o.finished and len(o.outputs[0].token_ids) == 12 for o in multi)
    assert [o.outputs[0].token_ids for o in multi] == [o.outputs[0].token_ids for o in single]
    assert [o.prompt_token_ids for o in multi] == work


async def test_cancelled_streams_free_the_kv_pool(tiny_llama_dir):
    model, args = engine_args(tiny_llama_dir)
    long = SamplingParams(temperature=0.0, max_tokens=400, ignore_eos=True)
    async with AsyncEngine(model, **args) as engine:
        async def cancel_after_first(prompt, i):
            async for out in engine.generate({"prompt_token_ids": prompt}, long, f"c{i}"):
                if len(out.outputs[0].token_ids) >= 2:
                    break  # leaving the loop aborts the request

        tasks = [asyncio.ensure_future(cancel_after_first(p, i)) for i, p in enumerate(prompts(150, seed=1))]
        others = [asyncio.ensure_future(collect(engine, p, long)) for p in prompts(50, seed=2)]
        await asyncio.gather(*tasks)
        await asyncio.sleep(0.3)
        for t in others:
            t.cancel()  # task cancellation aborts too
        await asyncio.gather(*others, return_exceptions=True)
        for _ in range(100):
            pong = await engine._client.check_health()
            if pong.num_running == 0 and pong.num_waiting == 0 and pong.kv_cache_usage == 0.0:
                break
            await asyncio.sleep(0.05)
        assert (pong.num_running, pong.num_waiting, pong.kv_cache_usage) == (0, 0, 0.0)
        fresh = await collect(engine, [1, 2, 3], GREEDY)
        assert fresh.finished and len(fresh.outputs[0].token_ids) == 12


async def test_abort_ends_the_stream_with_abort(tiny_llama_dir):
    model, args = engine_args(tiny_llama_dir, mode="inprocess")
    async with AsyncEngine(model, **args) as engine:
        stream = engine.generate({"prompt_token_ids": [4, 5, 6]},
                                 SamplingParams(temperature=0, max_tokens=400, ignore_eos=True), "a")
        first = await stream.__anext__()
        await engine.abort("a")
        last = first
        async for out in stream:
            last = out
        assert last.finished and last.outputs[0].finish_reason == "abort"


async def test_bad_request_is_a_value_error_and_the_engine_serves_on(tiny_llama_dir):
    model, args = engine_args(tiny_llama_dir)
    async with AsyncEngine(model, **args) as engine:
        with pytest.raises(ValueError, match="stop_token_ids"):
            await collect(engine, [1, 2], SamplingParams(stop_token_ids=[384]))
        with pytest.raises(ValueError, match="prompt_token_ids"):
            await collect(engine, [1, 999], GREEDY)
        with pytest.raises(ValueError, match="max_model_len"):
            await collect(engine, [1] * 600, GREEDY)
        with pytest.raises(ValueError, match="at most 128"):  # the server's max_n, as HTTP and ZMQ refuse it
            await collect(engine, [1, 2], SamplingParams(n=129, max_tokens=1))
        with pytest.raises(ValueError, match="you requested"):
            await collect(engine, [1, 2], SamplingParams(max_tokens=10 ** 7))
        with pytest.raises(ValueError, match="prompt_token_ids"):  # past 64 bits: no wire can carry it
            await collect(engine, [1, 2 ** 70], GREEDY)
        out = await collect(engine, [1, 2], GREEDY)
        assert len(out.outputs[0].token_ids) == 12
        await engine.check_health()


async def test_streamed_text_adds_up_with_stop_strings(greedy_reference):
    ref = greedy_reference["prompts"][1]
    params = SamplingParams(temperature=0, max_tokens=64, stop=["endless love"])
    async with AsyncEngine(kv_cache_memory=64 << 20, max_model_len=1024) as engine:
        texts, last = [], None
        async for out in engine.generate({"prompt_token_ids": ref["prompt_ids"]}, params):
            last = out
            texts.append(out.outputs[0].text)
    assert last.outputs[0].text == ref["output_text"].split("endless love")[0]
    assert last.outputs[0].finish_reason == "stop" and last.outputs[0].stop_reason == "endless love"
    assert all(b.startswith(a) for a, b in zip(texts, texts[1:]))  # cumulative, never retracted


async def test_start_up_failure_is_reported_promptly(tmp_path):
    loop = asyncio.get_running_loop()
    start = loop.time()
    with pytest.raises(EngineStartError, match="does not exist"):
        await AsyncEngine.create(str(tmp_path / "missing.gguf"), skip_tokenizer_init=True)
    assert loop.time() - start < 30


async def test_closed_engine_refuses_work(tiny_llama_dir):
    model, args = engine_args(tiny_llama_dir)
    engine = await AsyncEngine.create(model, **args)
    pids = engine.child_pids()
    directory = engine._launcher.directory
    await engine.close()
    assert not os.path.exists(directory)  # ipc socket files removed
    import psutil

    assert not [p for p in pids.values() if psutil.pid_exists(p) and psutil.Process(p).status() != "zombie"]
    with pytest.raises(EngineDeadError):
        await collect(engine, [1], GREEDY)
