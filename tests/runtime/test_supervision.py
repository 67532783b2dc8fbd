"""Acceptance: a killed child turns every stream into EngineDeadError quickly and leaves no process."""
import asyncio
import glob
import os
import signal
import subprocess
import sys
import tempfile
import textwrap
import time

import psutil
import pytest

from actorserve import AsyncEngine, SamplingParams
from actorserve.runtime.errors import EngineDeadError

LONG = SamplingParams(temperature=0.0, max_tokens=480, ignore_eos=True)


def gone(pids, within):
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        alive = [p for p in pids if psutil.pid_exists(p) and psutil.Process(p).status() != psutil.STATUS_ZOMBIE]
        if not alive:
            return True
        time.sleep(0.05)
    return False


@pytest.mark.parametrize("victim", ["worker0", "scheduler"])
async def test_sigkill_fails_every_stream_fast(tiny_llama_dir, victim):
    engine = await AsyncEngine.create(str(tiny_llama_dir), skip_tokenizer_init=True, kv_cache_memory=4 << 20,
                                      max_model_len=512)
    pids = engine.child_pids()
    progress = asyncio.Event()
    errors = []

    async def stream(i):
        try:
            async for out in engine.generate({"prompt_token_ids": [i + 1, 7, 9]}, LONG):
                if len(out.outputs[0].token_ids) > 3:
                    progress.set()
        except EngineDeadError as exc:
            errors.append((asyncio.get_running_loop().time(), exc))

    tasks = [asyncio.ensure_future(stream(i)) for i in range(20)]
    await asyncio.wait_for(progress.wait(), 30)
    killed_at = asyncio.get_running_loop().time()
    os.kill(pids[victim], signal.SIGKILL)
    await asyncio.wait_for(asyncio.gather(*tasks), 5)
    assert len(errors) == 20
    assert max(t for t, _ in errors) - killed_at < 2.0
    assert engine.is_dead
    with pytest.raises(EngineDeadError):
        async for _ in engine.generate({"prompt_token_ids": [1]}, LONG):
            pass
    assert gone(pids.values(), within=3)
    await engine.close()


async def test_a_stuck_scheduler_fails_the_health_check(tiny_llama_dir):
    engine = await AsyncEngine.create(str(tiny_llama_dir), skip_tokenizer_init=True, kv_cache_memory=4 << 20,
                                      max_model_len=512, health_timeout=1.0)
    await engine.check_health()
    scheduler = engine.child_pids()["scheduler"]
    os.kill(scheduler, signal.SIGSTOP)
    try:
        with pytest.raises(EngineDeadError, match="health"):
            await engine.check_health()
    finally:
        os.kill(scheduler, signal.SIGCONT)
    await engine.check_health()
    await engine.close()


SCRIPT = textwrap.dedent("""
    import asyncio, sys
    from actorserve import AsyncEngine, SamplingParams

    async def main():
        engine = await AsyncEngine.create(sys.argv[1], skip_tokenizer_init=True, kv_cache_memory=4 << 20,
                                          max_model_len=512)
        print(" ".join(str(p) for p in engine.child_pids().values()), flush=True)
        while True:  # still generating when the signal comes
            async for _ in engine.generate({"prompt_token_ids": [1, 2]},
                                           SamplingParams(max_tokens=None, ignore_eos=True)):
                pass

    asyncio.run(main())  # no __main__ guard: children must not re-run this file
""")


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGKILL])
def test_children_exit_when_the_launcher_dies(tiny_llama_dir, tmp_path, sig):
    before = set(glob.glob(os.path.join(tempfile.gettempdir(), "actorserve-*")))
    script = tmp_path / "app.py"
    script.write_text(SCRIPT)
    proc = subprocess.Popen([sys.executable, str(script), str(tiny_llama_dir)], stdout=subprocess.PIPE)
    try:
        line = proc.stdout.readline().decode()
        pids = [int(p) for p in line.split()]
        assert len(pids) == 2, line
        time.sleep(0.5)  # mid-generation
        proc.send_signal(sig)
        proc.wait(10)
        assert gone(pids, within=5)
        assert set(glob.glob(os.path.join(tempfile.gettempdir(), "actorserve-*"))) <= before  # ipc files removed
    finally:
        if proc.poll() is None:
            proc.kill()
