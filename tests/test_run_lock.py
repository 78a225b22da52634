"""runs/lock.py: a workdir is held by one run at a time. Fast: a second holder is refused with
the holder named, a SIGKILLed holder's lock is taken over, a fresh heartbeat of another host
refuses even where flock would allow, a stale one is taken over; a stalled taker does not hold,
the first fence checks, a dead pid counts only on the same machine, a lost holder's in-flight
save is not committed, both processes of a two-process run are fenced. Slow: two real
`aepg_jax.main` on one workdir (the second exits 2 in one line, the first's files equal an
undisturbed run's); the holder SIGKILLed mid-run, a new run takes over and ends with the
undisturbed run's results."""

from __future__ import annotations

import errno
import json
import os
import pathlib
import signal
import socket
import subprocess
import sys
import textwrap
import threading
import time

import numpy as np
import pytest
import sweep_fake
from tiny import child_cpu_seconds

from aepg_jax.runs import lock, records

REPO = pathlib.Path(__file__).resolve().parents[1]
TMP = ".orbax-checkpoint-tmp"  # Orbax's unfinished saves: `<step>.orbax-checkpoint-tmp.<claim>`

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


def _foreign_claim(workdir: pathlib.Path, age: float, **fields) -> None:
    """A claim of another host whose heartbeat is `age` seconds old (by the file's mtime)."""
    (workdir / lock.CLAIMS_DIR).mkdir(parents=True, exist_ok=True)
    now = time.time()
    beat = {"host": "other-node", "pid": 1234, "since": now - age - 60, "beat": now - age}
    path = workdir / lock.CLAIMS_DIR / f"{1:010d}.json"
    path.write_text(json.dumps({**beat, **fields}))
    os.utime(path, (now - age, now - age))


def test_heartbeats_guard_where_flock_is_not_shared_and_go_stale(tmp_path, monkeypatch):
    monkeypatch.setenv(lock.ENV_STALE, "30")
    _foreign_claim(tmp_path / "run", age=5)  # another host, flock not shared with it
    with pytest.raises(lock.Busy) as err:
        lock.acquire(str(tmp_path / "run"))
    assert "other-node pid 1234 since " in str(err.value)
    assert lock.running(str(tmp_path / "run")).host == "other-node"
    _foreign_claim(tmp_path / "run", age=31)  # its holder stopped beating: dead
    assert lock.running(str(tmp_path / "run")) is None
    with lock.hold(str(tmp_path / "run")):
        assert lock.read_holder(str(tmp_path / "run")).host == socket.gethostname()


def test_a_requeued_slurm_job_takes_over_its_earlier_run_at_once(tmp_path, monkeypatch):
    _foreign_claim(tmp_path / "run", age=1, job="77_3", restart=0)  # fresh: alive by its beat
    monkeypatch.setenv("SLURM_ARRAY_JOB_ID", "77")
    monkeypatch.setenv("SLURM_ARRAY_TASK_ID", "3")
    with pytest.raises(lock.Busy) as err:  # the same restart: not a requeue of it
        lock.acquire(str(tmp_path / "run"))
    assert "other-node pid 1234 since " in str(err.value)
    assert ", SLURM job 77_3" in str(err.value)  # what scancel and squeue take
    monkeypatch.setenv("SLURM_RESTART_COUNT", "1")
    with lock.hold(str(tmp_path / "run")):
        holder = lock.read_holder(str(tmp_path / "run"))
        assert (holder.pid, holder.job, holder.restart) == (os.getpid(), "77_3", 1)
    monkeypatch.setenv("SLURM_ARRAY_TASK_ID", "4")  # another task of the array: not its own
    _foreign_claim(tmp_path / "other", age=1, job="77_3", restart=0)
    with pytest.raises(lock.Busy):
        lock.acquire(str(tmp_path / "other"))


def test_the_heartbeat_is_refreshed_while_held(tmp_path, monkeypatch):
    monkeypatch.setenv(lock.ENV_BEAT, "0.1")
    with lock.hold(str(tmp_path)):
        first = lock.read_holder(str(tmp_path)).beat
        time.sleep(0.5)
        later = lock.read_holder(str(tmp_path))
    assert later.beat > first and later.since <= first


@pytest.mark.parametrize(
    ("env", "value", "says"),
    [
        (lock.ENV_BEAT, "0", "AEPG_LOCK_BEAT_S='0' is not a number of seconds > 0"),
        (lock.ENV_BEAT, "nan", "AEPG_LOCK_BEAT_S='nan' is not a number of seconds > 0"),
        (lock.ENV_STALE, "-5", "AEPG_LOCK_STALE_S='-5' is not a number of seconds > 0"),
        (lock.ENV_BEAT, "120", "AEPG_LOCK_BEAT_S=120 must be below AEPG_LOCK_STALE_S=120"),
        (lock.ENV_FLOCK, "no", "AEPG_LOCK_FLOCK='no' must be 1"),
    ],
)
def test_lock_settings_are_validated_naming_the_variable(tmp_path, monkeypatch, env, value, says):
    monkeypatch.setenv(env, value)
    with pytest.raises(ValueError) as err:
        lock.acquire(str(tmp_path / "run"))
    assert says in str(err.value) and "\n" not in str(err.value)
    assert not (tmp_path / "run").exists()


def test_a_lock_that_cannot_be_written_is_one_line_and_touches_nothing_else(tmp_path, monkeypatch):
    def full(path, record):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), path)

    monkeypatch.setattr(lock, "_write_json", full)
    with pytest.raises(lock.LockError) as err:
        lock.acquire(str(tmp_path / "run"))
    line = str(err.value)
    assert "\n" not in line and "No space left on device" in line and "free space" in line
    assert lock.read_holder(str(tmp_path / "run")) is None
    monkeypatch.undo()
    with lock.hold(str(tmp_path / "run")):  # the disk has room again: nothing left in the way
        assert lock.read_holder(str(tmp_path / "run")).pid == os.getpid()


TAKER = """
import os, sys, time
from aepg_jax.runs import lock
time.sleep(max(0.0, float(sys.argv[2]) - time.time()))
try:
    lock.acquire(sys.argv[1])
except lock.Busy:
    print("busy", flush=True)
    sys.exit(0)
print("held", flush=True)
time.sleep(3)
"""


def test_of_takers_starting_together_exactly_one_holds(tmp_path):
    """Heartbeats alone (AEPG_LOCK_FLOCK=0), a stale claim: every taker sees it stale at once,
    and exactly one gets the next claim."""
    for attempt in range(3):
        run = tmp_path / f"run{attempt}"
        _foreign_claim(run, age=500)
        env = {**os.environ, lock.ENV_FLOCK: "0", lock.ENV_STALE: "60"}
        at = time.time() + 3
        procs = [
            subprocess.Popen(
                [sys.executable, "-c", TAKER, str(run), str(at)],
                cwd=REPO,
                env=env,
                stdout=subprocess.PIPE,
                text=True,
            )
            for _ in range(4)
        ]
        said = sorted(p.communicate(timeout=120)[0].strip() for p in procs)
        assert said == ["busy", "busy", "busy", "held"], said
        assert sorted(os.listdir(run / lock.CLAIMS_DIR)) == [f"{2:010d}.json"]


WRITER = """
import sys, time
from aepg_jax.runs import lock, records
with lock.hold(sys.argv[1]):
    writer = records.MetricsWriter(sys.argv[1])
    step = 0
    try:
        while True:
            writer.write("train", step=step)
            step += 1
            time.sleep(0.01)
    except lock.Lost as err:
        print(err, file=sys.stderr, flush=True)
        sys.exit(3)
"""


def test_a_paused_holder_taken_over_writes_nothing_after_it_resumes(tmp_path):
    """Heartbeats alone: a holder stopped (SIGSTOP) past AEPG_LOCK_STALE_S is taken over; once
    continued (SIGCONT) it stops with one line at its next write, and its claim is left alone."""
    run = tmp_path / "run"
    env = {**os.environ, lock.ENV_FLOCK: "0", lock.ENV_STALE: "2", lock.ENV_BEAT: "0.5"}
    holder = subprocess.Popen(
        [sys.executable, "-c", WRITER, str(run)],
        cwd=REPO, env=env, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    metrics = run / records.METRICS_FILE
    deadline = time.time() + 120
    while (
        time.time() < deadline and metrics.read_text().count("\n") < 20
        if metrics.exists()
        else True
    ):
        time.sleep(0.05)
    os.kill(holder.pid, signal.SIGSTOP)
    try:
        with pytest.raises(lock.Busy):  # not stale yet
            lock.acquire(str(run))
        time.sleep(2.5)
        for var, value in env.items():
            os.environ[var] = value
        with lock.hold(str(run)):
            frozen = metrics.read_bytes()
            os.kill(holder.pid, signal.SIGCONT)
            assert holder.wait(timeout=60) == 3
            assert metrics.read_bytes() == frozen  # nothing written after it resumed
            mine = lock.read_holder(str(run))
            assert (mine.host, mine.pid, mine.gen) == (socket.gethostname(), os.getpid(), 2)
    finally:
        for var in (lock.ENV_FLOCK, lock.ENV_STALE, lock.ENV_BEAT):
            os.environ.pop(var, None)
        if holder.poll() is None:
            os.kill(holder.pid, signal.SIGKILL)
    lines = holder.stderr.read().strip().splitlines()
    assert len(lines) == 1 and "was taken over by " in lines[0], lines
    assert f"pid {os.getpid()} since " in lines[0]


def _claim(workdir: pathlib.Path, gen: int, age: float = 0.0, **fields) -> None:
    """Claim `gen` in `workdir`: this host's, a dead pid, `fields` over those (its heartbeat
    `age` seconds old by the file's mtime)."""
    (workdir / lock.CLAIMS_DIR).mkdir(parents=True, exist_ok=True)
    now = time.time()
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                          capture_output=True, text=True).stdout  # fmt: skip
    record = {"host": socket.gethostname(), "pid": int(dead), "since": now - age - 60,
              "beat": now - age, **fields}  # fmt: skip
    path = workdir / lock.CLAIMS_DIR / f"{gen:010d}.json"
    path.write_text(json.dumps(record))
    os.utime(path, (now - age, now - age))


def _gens(workdir: pathlib.Path) -> list[int]:
    return sorted(int(n[:-5]) for n in os.listdir(workdir / lock.CLAIMS_DIR) if n.endswith(".json"))


def test_a_stalled_taker_that_recreates_a_removed_claim_does_not_hold(tmp_path, monkeypatch):
    """Heartbeats alone. A taker judges claim 1 stale and stalls before creating claim 2;
    meanwhile a second taker takes claim 2 and releases, a third takes claim 3 (removing claim
    2) and is saving. The stalled taker then creates claim 2 anew: it is refused, its claim
    removed again, and the third's lock and in-flight save are untouched."""
    run = tmp_path / "run"
    monkeypatch.setenv(lock.ENV_FLOCK, "0")
    monkeypatch.setenv(lock.ENV_STALE, "30")
    _claim(run, 1, age=60, machine="another machine")
    others, stalled = [], []

    def stall(taker) -> None:
        if stalled:  # the other takers' own claims
            return
        stalled.append(taker)
        others.append(lock._take(str(run), use_flock=False))
        others[0].release()
        others.append(lock._take(str(run), use_flock=False))
        assert _gens(run) == [3]
        saving = run / "checkpoints" / f"10{TMP}.3"
        saving.mkdir(parents=True)
        (saving / "state").write_text("in flight")

    monkeypatch.setattr(lock, "_before_claim", stall)
    with pytest.raises(lock.Busy) as err:
        lock.acquire(str(run))
    third = others[1]
    assert f"pid {os.getpid()} since " in str(err.value)
    assert _gens(run) == [3] and lock.read_holder(str(run)).token == third.token
    assert third.owns()
    assert (run / "checkpoints" / f"10{TMP}.3" / "state").read_text() == "in flight"
    third.release()


def test_the_first_fence_after_acquiring_checks(tmp_path, monkeypatch):
    monkeypatch.setenv(lock.ENV_FLOCK, "0")
    with lock.hold(str(tmp_path)):
        _claim(tmp_path, 2)  # taken over at once
        with pytest.raises(lock.Lost):  # the first fence after acquiring re-reads the claims
            lock.fence(tmp_path / "metrics.jsonl")
    with lock.hold(str(tmp_path / "later")):
        lock.fence(tmp_path / "later" / "metrics.jsonl")
        _claim(tmp_path / "later", 2)
        lock.fence(tmp_path / "later" / "metrics.jsonl")  # then: at most every FENCE_S
        with pytest.raises(lock.Lost):
            lock.fence(tmp_path / "later" / "metrics.jsonl", now=True)


def test_a_dead_pid_under_this_hostname_is_dead_only_on_this_machine(tmp_path, monkeypatch):
    """Two containers with one hostname: a claim of this hostname whose pid is gone here is a
    dead holder's only when its machine (boot or machine id, pid namespace) is this one's; a
    claim without one (an earlier version's) is judged by its heartbeat alone."""
    monkeypatch.setenv(lock.ENV_FLOCK, "0")
    monkeypatch.setenv(lock.ENV_STALE, "30")
    assert lock._machine()  # this Linux has a boot id
    _claim(tmp_path / "other", 1, age=1, machine="another-boot-id/pid:[1]")
    with pytest.raises(lock.Busy):
        lock.acquire(str(tmp_path / "other"))
    _claim(tmp_path / "old", 1, age=1)  # written by an earlier version: no machine
    with pytest.raises(lock.Busy) as err:
        lock.acquire(str(tmp_path / "old"))
    assert "claim names no machine" in str(err.value) and lock.ENV_STALE in str(err.value)
    _claim(tmp_path / "old", 1, age=31)
    with lock.hold(str(tmp_path / "old")):  # its heartbeat went stale
        assert lock.read_holder(str(tmp_path / "old")).machine == lock._machine()
    _claim(tmp_path / "here", 1, age=1, machine=lock._machine())
    with lock.hold(str(tmp_path / "here")):  # this machine's, its pid gone: dead at once
        assert _gens(tmp_path / "here") == [2]
        assert lock.inherited(tmp_path / "here" / "checkpoints").gen == 1


def test_a_released_claim_of_an_earlier_version_is_taken_at_once(tmp_path, monkeypatch):
    monkeypatch.setenv(lock.ENV_FLOCK, "0")
    record = {"host": "n1", "pid": 7, "since": 1.0, "beat": 2.0, "job": None, "restart": 0,
              "token": "ab", "released": True}  # fmt: skip
    (tmp_path / lock.CLAIMS_DIR).mkdir()
    (tmp_path / lock.CLAIMS_DIR / f"{4:010d}.json").write_text(json.dumps(record))
    with lock.hold(str(tmp_path)):
        assert _gens(tmp_path) == [5] and lock.inherited(tmp_path) is None


def _save(ckpt, step: int) -> None:
    ckpt.save(step, {"state": {"w": np.arange(4.0) + step}}, {"step": step})


def test_a_holder_that_lost_the_run_commits_no_save_in_flight(tmp_path, monkeypatch):
    """A save started under a lock that is then taken over, or released (as a sweep worker
    releases a run on `Lost`), before Orbax commits it: nothing becomes a checkpoint, its
    temporary directory is gone, the next wait raises Lost."""
    from aepg_jax.runs import checkpointing

    monkeypatch.setenv(lock.ENV_FLOCK, "0")
    monkeypatch.setattr(lock, "FENCE_S", 1e9)  # only the commit's own check reads the claims
    gate = threading.Event()
    finalize = checkpointing._FencedTemporaryPath.finalize

    async def gated(self):  # the commit waits until the test has taken the lock away
        gate.wait(timeout=60)
        await finalize(self)

    monkeypatch.setattr(checkpointing._FencedTemporaryPath, "finalize", gated)
    for case in ("taken_over", "released"):
        run = tmp_path / case
        lock.acquire(str(run))
        ckpt = checkpointing.Checkpointer(str(run / "checkpoints"))
        gate.set()
        _save(ckpt, 1)
        ckpt.wait()
        gate.clear()
        _save(ckpt, 2)
        if case == "taken_over":
            _claim(run, 2, machine="another machine")
        else:
            lock.release(str(run))
        gate.set()
        with pytest.raises(lock.Lost) as err:
            ckpt.wait()
        assert sorted(os.listdir(run / "checkpoints")) == ["1"], case
        if case == "taken_over":
            assert "was taken over by " in str(err.value)
            lock.release(str(run))
        else:
            assert "was released by this process" in str(err.value)


def test_a_taker_removes_the_unfinished_saves_it_inherited_and_saves_under_its_claim(
    tmp_path, monkeypatch
):
    from aepg_jax.runs import checkpointing

    monkeypatch.setenv(lock.ENV_FLOCK, "0")
    left = tmp_path / "checkpoints" / f"7{TMP}.1"
    left.mkdir(parents=True)
    (left / "state").write_text("a dead holder's unfinished save")
    _claim(tmp_path, 1, machine=lock._machine())  # its pid gone on this machine
    with lock.hold(str(tmp_path)):
        ckpt = checkpointing.Checkpointer(str(tmp_path / "checkpoints"))
        seen = []
        finalize = checkpointing._FencedTemporaryPath.finalize

        async def spy(self):
            seen.append(self._tmp_path.name)
            await finalize(self)

        monkeypatch.setattr(checkpointing._FencedTemporaryPath, "finalize", spy)
        _save(ckpt, 8)
        ckpt.wait()
        assert f"8{TMP}.2" in seen
        assert sorted(os.listdir(tmp_path / "checkpoints")) == ["8"]
        restored, meta = ckpt.restore_latest(lambda m: {"state": {"w": np.zeros(4)}})
        assert meta["step"] == 8 and restored["state"]["w"].tolist() == [8.0, 9.0, 10.0, 11.0]
        ckpt.close()
    unlocked = tmp_path / "unlocked" / "checkpoints" / f"3{TMP}"
    unlocked.mkdir(parents=True)
    checkpointing.Checkpointer(str(unlocked.parent)).close()  # no lock, nothing inherited
    assert unlocked.exists()


def test_a_follower_is_fenced_by_its_leaders_claim(tmp_path, monkeypatch):
    """Another process of a multi-process run follows process 0's claim: it may write while no
    newer claim exists (also where its host does not see the claims), and not after."""
    monkeypatch.setenv(lock.ENV_FLOCK, "0")
    lock.follow(str(tmp_path), 3)
    try:
        lock.fence(tmp_path / "checkpoints", now=True)  # no claims visible: owned
        _claim(tmp_path, 3)
        lock.fence(tmp_path / "checkpoints", now=True)
        _claim(tmp_path, 4)
        with pytest.raises(lock.Lost):
            lock.fence(tmp_path / "checkpoints", now=True)
        assert _gens(tmp_path) == [3, 4]  # a follower writes no claim
    finally:
        lock.release(str(tmp_path))


TWO_PROCESSES = """
import json, os, sys
from aepg_jax.system import hosts
hosts.initialize(False)
import jax
from aepg_jax.runs import lock
workdir, path = sys.argv[1], os.path.join(sys.argv[1], "checkpoints")
with lock.hold_run(workdir):
    lock.fence(path, now=True)
    hosts.everywhere(True)
    if hosts.is_main():  # a taker's claim, newer than process 0's
        gen = lock.claim_number(workdir) + 1
        with open(os.path.join(workdir, lock.CLAIMS_DIR, f"{gen:010d}.json"), "w") as f:
            json.dump({"host": "other-node", "pid": 1, "since": 0.0, "beat": 0.0}, f)
    hosts.everywhere(True)
    try:
        lock.fence(path, now=True)
        print(jax.process_index(), "writes", flush=True)
    except lock.Lost:
        print(jax.process_index(), "lost", flush=True)
    hosts.everywhere(True)
"""


def test_every_process_of_a_multi_process_run_is_fenced(tmp_path):
    """Two processes (~5 s): process 0 takes the lock, process 1 follows its claim; once a
    newer claim exists both are fenced."""
    from aepg_jax.launch import launch

    port, env = launch.free_port(), {**os.environ, lock.ENV_FLOCK: "0"}
    cmd = [sys.executable, "-c", TWO_PROCESSES, str(tmp_path)]
    kwargs = dict(cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    procs = [subprocess.Popen(cmd, env=launch.process_env(env, 2, i, port, 1), **kwargs)
             for i in range(2)]  # fmt: skip
    outs = [p.communicate(timeout=180) for p in procs]
    assert [p.returncode for p in procs] == [0, 0], outs
    assert [o.strip() for o, _ in outs] == ["0 lost", "1 lost"], outs
    assert _gens(tmp_path) == [1, 2]  # process 1 wrote no claim of its own


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
    start = child_cpu_seconds()
    second = _main(config, tmp_path / "run")
    took = child_cpu_seconds() - start
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
    assert _files(tmp_path / "run") == expected  # each step recorded once, the same results


@pytest.mark.slow
def test_a_paused_run_taken_over_writes_nothing_after_it_resumes(undisturbed, tmp_path):
    """Heartbeats alone (AEPG_LOCK_FLOCK=0): a run stopped (SIGSTOP) past AEPG_LOCK_STALE_S is
    taken over by a second run of the same command, which finishes it; continued (SIGCONT)
    after that, the first ends in one line without writing, and the run's files equal an
    undisturbed run's."""
    config, expected = undisturbed
    env = {lock.ENV_FLOCK: "0", lock.ENV_STALE: "3", lock.ENV_BEAT: "0.5"}
    cmd = [sys.executable, "-m", "aepg_jax.main", f"--config={config}", f"--workdir={tmp_path}"]
    kwargs = dict(cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                  env={**os.environ, **env})  # fmt: skip
    first = subprocess.Popen(cmd, **kwargs)
    ckpts = tmp_path / "checkpoints"
    _wait_for(
        lambda: ckpts.exists() and any(s.isdigit() and int(s) >= 4 for s in os.listdir(ckpts)),
        first,
    )
    os.kill(first.pid, signal.SIGSTOP)
    try:
        time.sleep(4)
        second = subprocess.run(cmd, timeout=900, **kwargs)
        assert second.returncode == 0, second.stderr
        before = _snapshot(tmp_path)
        os.kill(first.pid, signal.SIGCONT)
        _, err = first.communicate(timeout=300)
    finally:
        if first.poll() is None:
            os.kill(first.pid, signal.SIGKILL)
    last = err.strip().splitlines()[-1]  # after its progress bars
    assert first.returncode == 2 and "Traceback" not in err, err
    assert last.startswith("error: ") and "was taken over by " in last, err
    assert _snapshot(tmp_path) == before  # the resumed first wrote nothing
    assert _files(tmp_path) == expected  # each step recorded once, the same results


def _snapshot(workdir: pathlib.Path) -> dict:
    """Every file under `workdir` but the claims (path -> bytes), and Orbax's unfinished
    checkpoint writes: a save in flight when the holder was stopped goes on in Orbax's thread
    into its own temporary directory until its commit, which the lock refuses
    (docs/running.md); that it never becomes a checkpoint is checked by the committed steps
    being the same."""
    return {
        str(p.relative_to(workdir)): p.read_bytes()
        for p in sorted(workdir.rglob("*"))
        if p.is_file()
        and lock.CLAIMS_DIR not in p.parts
        and not any(TMP in part for part in p.parts)
    }
