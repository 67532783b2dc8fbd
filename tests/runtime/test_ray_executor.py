"""The Ray executor on a local 2-CPU Ray cluster: the scheduler and the worker stages as Ray actors.

Each engine reserves the whole cluster (one bundle of 2 CPUs a stage), so an engine whose predecessor's
placement group were not yet free could not be placed: five in a row must each start at once, and the
cores must be free the moment close() returns. A Ray actor that is killed, or frozen as if its node were
gone, fails every open stream with EngineDeadError within 2 s."""
import asyncio
import logging
import os
import re
import signal
import time

import pytest

ray = pytest.importorskip("ray")

from actorserve import LLM, AsyncEngine, EngineDeadError, EngineStartError, SamplingParams  # noqa: E402

PROMPT = "The capital of France is"
GREEDY = SamplingParams(max_tokens=16, temperature=0)
ARGS = {"distributed_executor_backend": "ray", "max_model_len": 1024, "kv_cache_memory": 64 << 20}


@pytest.fixture(scope="module")
def cluster():
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    yield
    ray.shutdown()


@pytest.fixture(scope="module")
def reference():
    return LLM(max_model_len=1024, kv_cache_memory=64 << 20).generate(PROMPT, GREEDY, use_tqdm=False)[0].outputs[0].text


async def _text(engine, prompt=PROMPT, params=GREEDY) -> str:
    last = None
    async for out in engine.generate(prompt, params):
        last = out
    return last.outputs[0].text


def _free_cpus() -> float:
    return ray.available_resources().get("CPU", 0.0)


class _Placements(logging.Handler):
    """The placement waits the Ray executor logs."""

    def __init__(self) -> None:
        super().__init__(logging.INFO)
        self.waits: list[float] = []

    def emit(self, record: logging.LogRecord) -> None:
        placed = re.fullmatch(r"Ray placed .* in ([0-9.]+) s", record.getMessage())
        if placed:
            self.waits.append(float(placed.group(1)))


def test_five_engines_in_a_row_each_start_at_once(cluster, reference):
    placements = _Placements()
    logger = logging.getLogger("actorserve")

    async def run() -> None:
        for i in range(5):
            engine = AsyncEngine(None, **ARGS)
            await engine.start()
            assert len(placements.waits) == i + 1 and placements.waits[-1] < 1.0
            assert _free_cpus() == 0.0  # the engine holds the cluster's two cores
            assert await _text(engine) == reference
            await engine.close()
            assert _free_cpus() == 2.0  # free when close() returns, not some time later

    logger.addHandler(placements)
    level, logger.level = logger.level, logging.INFO
    try:
        asyncio.run(run())
    finally:
        logger.removeHandler(placements)
        logger.setLevel(level)


@pytest.mark.parametrize("victim, how", [("worker0", signal.SIGKILL), ("scheduler", signal.SIGKILL),
                                         ("worker0", signal.SIGSTOP)])
def test_a_dead_or_unanswering_actor_fails_every_stream_within_2s(cluster, victim, how):
    async def run() -> float:
        engine = AsyncEngine(None, **ARGS)
        await engine.start()
        pid = engine.child_pids()[victim]
        long = SamplingParams(max_tokens=900, temperature=0, ignore_eos=True)
        streams = [asyncio.ensure_future(_text(engine, PROMPT, long)) for _ in range(2)]
        await asyncio.sleep(1.0)
        os.kill(pid, how)
        hit = time.monotonic()
        try:
            for stream in streams:
                with pytest.raises(EngineDeadError):
                    await stream
            took = time.monotonic() - hit
            with pytest.raises(EngineDeadError):
                await _text(engine)
        finally:
            if how == signal.SIGSTOP:
                os.kill(pid, signal.SIGCONT)
            await engine.close()
        assert _free_cpus() == 2.0
        return took

    assert asyncio.run(run()) < 2.0


def test_a_busy_engine_is_not_taken_for_dead(cluster):
    """16 streams at once on both cores for seconds: the liveness pings are answered on their own thread."""
    async def run() -> None:
        async with AsyncEngine(None, **ARGS) as engine:
            params = SamplingParams(max_tokens=64, temperature=0, ignore_eos=True)
            texts = await asyncio.gather(*(_text(engine, f"Story number {i}:", params) for i in range(16)))
            assert all(texts) and not engine.is_dead

    asyncio.run(run())


def test_pipeline_stages_as_ray_actors(cluster, reference):
    """Two stages, one CPU each, wired by the addresses the actors report: the tokens of one process."""
    async def run() -> str:
        async with AsyncEngine(None, **ARGS, pipeline_parallel_size=2) as engine:
            assert sorted(engine.child_pids()) == ["scheduler", "worker0", "worker1"]
            return await _text(engine)

    assert asyncio.run(run()) == reference
    assert _free_cpus() == 2.0


def test_the_offline_llm_on_ray(cluster, reference):
    with LLM(**ARGS) as llm:
        assert llm.generate(PROMPT, GREEDY, use_tqdm=False)[0].outputs[0].text == reference
    assert _free_cpus() == 2.0


def test_start_failures_are_clear_and_free_the_cluster(cluster):
    async def start(**args) -> str:
        engine = AsyncEngine(**{**ARGS, **args})
        with pytest.raises(EngineStartError) as failed:
            await engine.start()
        await engine.close()
        return str(failed.value)

    assert "could not place" in asyncio.run(start(model=None, threads_per_worker=3, start_timeout=2))
    assert "no-such-model.gguf" in asyncio.run(start(model="/nonexistent/no-such-model.gguf"))
    assert _free_cpus() == 2.0


def test_data_parallel_replicas_on_ray(cluster, reference):
    """Two replicas, a placement group of one CPU each."""
    from actorserve.runtime.data_parallel import DataParallelEngine
    from actorserve.runtime.resolve import engine_config

    async def run() -> list[str]:
        async with DataParallelEngine(engine_config(None, **ARGS, data_parallel_size=2)) as engine:
            assert _free_cpus() == 0.0
            return [await _text_on(engine, rank) for rank in (0, 1)]

    async def _text_on(engine, rank: int) -> str:
        last = None
        async for out in engine.generate(PROMPT, GREEDY, data_parallel_rank=rank):
            last = out
        return last.outputs[0].text

    assert asyncio.run(run()) == [reference, reference]
    assert _free_cpus() == 2.0


def test_sleep_mode_on_ray(cluster, reference):
    async def run() -> str:
        async with AsyncEngine(None, **ARGS, enable_sleep_mode=True) as engine:
            await engine.sleep(2)
            assert await engine.is_sleeping()
            await engine.wake_up()
            return await _text(engine)

    assert asyncio.run(run()) == reference


def test_ray_actors_start_with_torchs_libraries_at_the_override(cluster, monkeypatch):
    """A CPU override emulates the lesser CPU whole in the Ray actors too, as in local children: each
    actor's process starts with the variables that hold oneDNN, MKL and ATen at the override's level."""
    from actorserve.kernels import capability
    from actorserve.runtime.resolve import engine_config

    for name in ("ONEDNN_MAX_CPU_ISA", "MKL_ENABLE_INSTRUCTIONS", "ATEN_CPU_CAPABILITY"):
        monkeypatch.delenv(name, raising=False)
    hardware = engine_config(None, cpu_isa="generic").device.cpu_paths.hardware_isa
    want = capability.library_env("generic", hardware)
    if not want:
        pytest.skip("this CPU is at the generic level already")

    async def run() -> dict[str, dict[str, str]]:
        async with AsyncEngine(None, **ARGS, cpu_isa="generic") as engine:
            assert await _text(engine, params=SamplingParams(max_tokens=2, temperature=0))
            envs = {}
            for name, pid in engine.child_pids().items():
                with open(f"/proc/{pid}/environ", "rb") as f:
                    env = dict(item.split(b"=", 1) for item in f.read().split(b"\0") if b"=" in item)
                envs[name] = {k: env.get(k.encode(), b"").decode() for k in want}
            return envs

    envs = asyncio.run(run())
    assert sorted(envs) == ["scheduler", "worker0"] and all(env == want for env in envs.values())
    assert _free_cpus() == 2.0
