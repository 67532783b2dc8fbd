"""A start that fails reaches every caller: eight concurrent generate() calls on a new AsyncEngine all get
the one EngineStartError, whether the model path is bad or a child is killed while it loads, and the
engine never starts a second time (the rule in AsyncEngine.start)."""
import asyncio
import os
import signal

import psutil
import pytest

from actorserve import AsyncEngine, EngineDeadError, EngineStartError, SamplingParams
from actorserve.runtime import launcher

PARAMS = SamplingParams(temperature=0, max_tokens=4, ignore_eos=True)
CALLERS = 8


async def collect(engine, prompt):
    last = None
    async for out in engine.generate({"prompt_token_ids": prompt}, PARAMS):
        last = out
    return last


def count_starts(monkeypatch) -> list:
    starts = []
    original = launcher.MultiprocessLauncher.start

    async def counted(self, on_death):
        starts.append(self)
        return await original(self, on_death)

    monkeypatch.setattr(launcher.MultiprocessLauncher, "start", counted)
    return starts


async def kill_child_when_it_appears(name: str, known: set[int]) -> int:
    """SIGKILL the actor process ``name`` (the last word of its command line) as soon as it exists: a
    direct child of this process not in ``known`` (other tests' servers have actors of the same names)."""
    me = psutil.Process()
    while True:
        for child in me.children():
            if child.pid in known:
                continue
            try:
                if child.cmdline()[-1:] == [name]:
                    os.kill(child.pid, signal.SIGKILL)
                    return child.pid
            except (psutil.NoSuchProcess, psutil.ZombieProcess):
                pass
        await asyncio.sleep(0.02)


async def all_callers_fail(engine) -> list[BaseException]:
    results = await asyncio.wait_for(asyncio.gather(*[collect(engine, [1, 2, 3]) for _ in range(CALLERS)],
                                                    return_exceptions=True), 120)
    assert all(isinstance(r, EngineStartError) for r in results), results
    return results


async def test_a_bad_model_path_fails_every_waiting_caller_once(tmp_path, monkeypatch):
    starts = count_starts(monkeypatch)
    engine = AsyncEngine(str(tmp_path / "missing.gguf"), skip_tokenizer_init=True)
    try:
        results = await all_callers_fail(engine)
        assert "does not exist" in str(results[0]) and len({id(r) for r in results}) == 1  # one error, shared
        with pytest.raises(EngineStartError, match="does not exist"):  # later calls: the same, at once
            await asyncio.wait_for(collect(engine, [1]), 1)
        with pytest.raises(EngineStartError):
            await engine.check_health()
        assert len(starts) == 1  # no second, silent start
        assert isinstance(results[0], EngineDeadError)  # a start failure is also a dead engine to callers
    finally:
        await engine.close()


@pytest.mark.parametrize("victim", ["worker0", "scheduler"])
async def test_a_child_killed_while_loading_fails_every_waiting_caller(victim, monkeypatch):
    starts = count_starts(monkeypatch)
    known = {p.pid for p in psutil.Process().children()}
    engine = AsyncEngine(kv_cache_memory=32 << 20, max_model_len=512)  # the real model: seconds of loading
    killer = asyncio.ensure_future(kill_child_when_it_appears(victim, known))
    try:
        results = await all_callers_fail(engine)
        assert killer.done()
        assert victim in str(results[0]) or "exited" in str(results[0])
        with pytest.raises(EngineStartError):
            await asyncio.wait_for(collect(engine, [1]), 1)
        assert len(starts) == 1
        await asyncio.sleep(0.5)
        assert not [p for p in psutil.Process().children() if p.pid not in known and _alive(p)]
    finally:
        killer.cancel()
        await engine.close()


async def test_close_during_start_stops_the_start(tiny_llama_dir):
    known = {p.pid for p in psutil.Process().children()}
    engine = AsyncEngine(str(tiny_llama_dir), skip_tokenizer_init=True, kv_cache_memory=4 << 20)
    caller = asyncio.ensure_future(collect(engine, [1, 2]))
    await asyncio.sleep(0.3)
    await engine.close()
    with pytest.raises(EngineDeadError):
        await asyncio.wait_for(caller, 30)
    await asyncio.sleep(0.5)
    assert not [p for p in psutil.Process().children() if p.pid not in known and _alive(p)]


def _alive(p: psutil.Process) -> bool:
    try:
        return p.status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False
