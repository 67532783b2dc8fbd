"""Sleep mode across pipeline stages: SleepRequest and WakeUpRequest go round the worker ring, each stage
releasing its own layers' memory, and the engine answers as before once awake."""
import asyncio

import psutil

from actorserve import AsyncEngine, SamplingParams

GREEDY = SamplingParams(max_tokens=24, temperature=0)


async def _text(engine: AsyncEngine) -> str:
    last = None
    async for out in engine.generate("The capital of France is", GREEDY):
        last = out
    return last.outputs[0].text


def test_every_stage_sleeps_and_wakes():
    async def run() -> None:
        async with AsyncEngine(None, pipeline_parallel_size=2, enable_sleep_mode=True, max_model_len=1024,
                               kv_cache_memory=64 << 20) as engine:
            before = await _text(engine)
            stages = [psutil.Process(engine.child_pids()[f"worker{r}"]) for r in (0, 1)]
            awake = [p.memory_info().rss for p in stages]
            status = await engine._client.sleep(2, 60)
            assert status.sleeping and status.level == 2 and status.released["weights"] > 80 << 20
            asleep = [p.memory_info().rss for p in stages]
            assert all(a - s > 30 << 20 for a, s in zip(awake, asleep)), (awake, asleep)  # each its own half
            assert await engine.is_sleeping()
            await engine.wake_up()
            assert not await engine.is_sleeping()
            assert await _text(engine) == before

    asyncio.run(run())


def test_the_offline_llm_over_processes_refuses_while_asleep():
    """With its engine in processes, LLM.generate while asleep is an error, not a wait that nothing ends."""
    import pytest

    from actorserve import LLM, EngineSleepingError

    with LLM(pipeline_parallel_size=2, enable_sleep_mode=True, sleep_queue_requests=True, max_model_len=1024,
             kv_cache_memory=64 << 20) as llm:
        before = llm.generate("The capital of France is", GREEDY, use_tqdm=False)[0].outputs[0].text
        llm.sleep(level=1)
        assert llm.is_sleeping()
        with pytest.raises(EngineSleepingError):
            llm.generate("The capital of France is", GREEDY, use_tqdm=False)
        llm.wake_up()
        assert llm.generate("The capital of France is", GREEDY, use_tqdm=False)[0].outputs[0].text == before
