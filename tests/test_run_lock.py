"""runs/lock.py: a workdir is held by one run at a time. Fast: a second holder is refused with
the holder named, a SIGKILLed holder's lock is taken over, a fresh heartbeat of another host
refuses even where flock would allow, a stale one is taken over. Slow: two real `aepg_jax.main`
on one workdir (the second exits 2 in one line, the first's files equal an undisturbed run's);
the holder SIGKILLed mid-run, a new run takes over and ends with the undisturbed run's results."""

from __future__ import annotations

import json
import os
import pathlib
import signal
import socket
import subprocess
import sys
import textwrap
import time

import pytest
import sweep_fake

from aepg_jax.runs import lock

REPO = pathlib.Path(__file__).resolve().parents[1]

HOLDER = """
import sys, time
from aepg_jax.runs import lock
with lock.hold(sys.argv[1]):
    print("held", flush=True)
    time.sleep(600)
"""


def _holder(workdir) -> subprocess.Popen:
    proc = subprocess.Popen(
        [sys.executable, "-c", textwrap.dedent(HOLDER), str(workdir)],
        cwd=REPO,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert proc.stdout.readline().strip() == "held"
    return proc


def test_a_held_workdir_is_refused_naming_the_holder_and_a_killed_one_taken_over(tmp_path):
    proc = _holder(tmp_path / "run")
    try:
        before = sorted(os.listdir(tmp_path / "run"))
        with pytest.raises(lock.Busy) as err:
            lock.acquire(str(tmp_path / "run"))
        assert f"{socket.gethostname()} pid {proc.pid} since " in str(err.value)
        assert sorted(os.listdir(tmp_path / "run")) == before  # nothing touched
    finally:
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait()
    with lock.hold(str(tmp_path / "run")):  # the kernel freed the flock; its pid is gone
        holder = lock.read_holder(str(tmp_path / "run"))
        assert holder.pid == os.getpid()
        with lock.hold(str(tmp_path / "run")):  # reentrant in one process
            pass
        assert lock.running(str(tmp_path / "run")).pid == os.getpid()
    assert lock.read_holder(str(tmp_path / "run")) is None  # released: no heartbeat left


def _foreign_heartbeat(workdir: pathlib.Path, age: float) -> None:
    workdir.mkdir(parents=True, exist_ok=True)
    now = time.time()
    beat = {"host": "other-node", "pid": 1234, "since": now - age - 60, "beat": now - age}
    (workdir / lock.HEARTBEAT_FILE).write_text(json.dumps(beat))


def test_heartbeats_guard_where_flock_is_not_shared_and_go_stale(tmp_path, monkeypatch):
    monkeypatch.setenv(lock.ENV_STALE, "30")
    _foreign_heartbeat(tmp_path / "run", age=5)  # another host, flock not shared with it
    with pytest.raises(lock.Busy) as err:
        lock.acquire(str(tmp_path / "run"))
    assert "other-node pid 1234 since " in str(err.value)
    assert lock.running(str(tmp_path / "run")).host == "other-node"
    _foreign_heartbeat(tmp_path / "run", age=31)  # its holder stopped beating: dead
    assert lock.running(str(tmp_path / "run")) is None
    with lock.hold(str(tmp_path / "run")):
        assert lock.read_holder(str(tmp_path / "run")).host == socket.gethostname()


def test_the_heartbeat_is_refreshed_while_held(tmp_path, monkeypatch):
    monkeypatch.setenv(lock.ENV_BEAT, "0.1")
    with lock.hold(str(tmp_path)):
        first = lock.read_holder(str(tmp_path)).beat
        time.sleep(0.5)
        later = lock.read_holder(str(tmp_path))
    assert later.beat > first and later.since <= first


# ---------------------------------------------------------------- slow: real runs
# The fixture and both tests: 4 min on the project's 2-core CPU shared with other jobs, 2026-11-25.


def _main(config: str, workdir, wait=True):
    cmd = [sys.executable, "-m", "aepg_jax.main", f"--config={config}", f"--workdir={workdir}"]
    kwargs = dict(cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    if not wait:
        return subprocess.Popen(cmd, **kwargs)
    return subprocess.run(cmd, timeout=900, **kwargs)


def _files(workdir: pathlib.Path) -> tuple[int, dict]:
    """(metrics.jsonl line count, results.json without timings: compile seconds included, and
    the compile counts, which a resumed run adds to)."""
    lines = (workdir / "metrics.jsonl").read_text().count("\n")
    results = json.loads((workdir / "results.json").read_text())
    timings = ("time", "elapsed", "compilations")
    return lines, {k: v for k, v in results.items() if not any(t in k for t in timings)}


@pytest.fixture(scope="module")
def undisturbed(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("undisturbed")
    sweep_fake.write(tmp, steps=12, every=2)
    config = f"{tmp}/fake_config.py:seed=0"
    proc = _main(config, tmp / "run")
    assert proc.returncode == 0, proc.stderr
    return config, _files(tmp / "run")


def _wait_for(predicate, proc, seconds=600):
    deadline = time.time() + seconds
    while time.time() < deadline and proc.poll() is None and not predicate():
        time.sleep(0.05)
    assert proc.poll() is None, "the first run ended before the test could act"


@pytest.mark.slow
def test_a_second_main_on_a_running_workdir_exits_2_at_once(undisturbed, tmp_path):
    config, expected = undisturbed
    first = _main(config, tmp_path / "run", wait=False)
    _wait_for(lambda: (tmp_path / "run" / "metrics.jsonl").exists(), first)
    start = time.monotonic()
    second = _main(config, tmp_path / "run")
    took = time.monotonic() - start
    assert first.poll() is None, "the first run ended before the second was refused"
    lines = second.stderr.strip().splitlines()
    assert second.returncode == 2 and len(lines) == 1, second.stderr
    assert lines[0].startswith("error: ") and f"pid {first.pid} since " in lines[0]
    assert took < 60, took  # start-up (imports, backend) only: it trains nothing
    assert first.wait(timeout=900) == 0, first.stderr.read()
    assert _files(tmp_path / "run") == expected


@pytest.mark.slow
def test_a_sigkilled_holder_is_taken_over_and_the_run_resumes_exactly(undisturbed, tmp_path):
    config, expected = undisturbed
    first = _main(config, tmp_path / "run", wait=False)
    ckpts = tmp_path / "run" / "checkpoints"
    _wait_for(
        lambda: ckpts.exists() and any(s.isdigit() and int(s) >= 4 for s in os.listdir(ckpts)),
        first,
    )
    os.kill(first.pid, signal.SIGKILL)
    first.wait()
    assert not (tmp_path / "run" / "results.json").exists()
    again = _main(config, tmp_path / "run")
    assert again.returncode == 0, again.stderr
    assert "resum" in (again.stdout + again.stderr).lower()
    assert _files(tmp_path / "run")[1] == expected[1]
