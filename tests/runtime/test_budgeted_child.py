"""The budgeted child process: a job's value, a handler's failure (the child kept), a job past its time
(the child replaced, the next job served), memory past the budget; and a script without a ``__main__``
guard is not run again in the child (spawn would import it there)."""
import subprocess
import sys
import time

import pytest

from actorserve.runtime.budgeted_child import BudgetedChild, ChildOutOfMemory, ChildTimeout, JobFailed, Replace


class _Jobs:
    def __call__(self, job):
        kind, value = job
        if kind == "echo":
            return value
        if kind == "sleep":
            time.sleep(value)
            return "woke"
        if kind == "raise":
            raise ValueError(value)
        if kind == "replace":
            raise Replace(value)
        if kind == "allocate":
            return len(bytearray(value))
        if kind == "pid":
            import os

            return os.getpid()
        raise AssertionError(kind)


@pytest.fixture(scope="module")
def child():
    c = BudgetedChild("test-child", _Jobs(), 128 << 20)
    c.start()
    yield c
    c.close()


def test_values_failures_timeouts_and_memory(child):
    assert child.run(("echo", [1, "a"]), 5) == [1, "a"]
    pid = child.run(("pid", None), 5)
    with pytest.raises(JobFailed, match="bad input"):
        child.run(("raise", "bad input"), 5)
    assert child.run(("pid", None), 5) == pid  # (kept)
    with pytest.raises(JobFailed, match="start afresh"):
        child.run(("replace", "start afresh"), 5)
    pid2 = child.run(("pid", None), 30)
    assert pid2 != pid
    start = time.monotonic()
    with pytest.raises(ChildTimeout):
        child.run(("sleep", 60), 1.0)
    assert time.monotonic() - start < 5
    with pytest.raises(ChildOutOfMemory, match="128 MiB"):
        child.run(("allocate", 1 << 30), 30)
    assert child.run(("echo", "after"), 30) == "after"
    assert child.run(("pid", None), 5) not in (pid, pid2)


def test_a_script_without_a_main_guard_runs_once(tmp_path):
    marks = tmp_path / "marks"
    script = tmp_path / "unguarded.py"
    script.write_text(
        "import sys\n"
        f"open({str(marks)!r}, 'a').write('ran\\n')\n"
        "sys.path.insert(0, " + repr(str(__import__('pathlib').Path(__file__).resolve().parents[2])) + ")\n"
        "from actorserve.runtime.budgeted_child import BudgetedChild\n"
        "from tests.runtime.test_budgeted_child import _Jobs\n"
        "c = BudgetedChild('unguarded', _Jobs(), 64 << 20)\n"
        "print(c.run(('echo', 'hello'), 30))\n"
        "c.close()\n")
    done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.strip() == "hello"
    assert marks.read_text() == "ran\n"
