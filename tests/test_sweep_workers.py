"""Sweep workers (`claims.py`): concurrent `aepg_jax.sweep` processes on one directory
share its runs. Fast: workers (threads of this process stand in for processes: the claim is
the run's lock, reentrant only within one thread's run) run each run once; the cost estimate
orders runs as the methods' extra passes say. Slow: 3 real workers on the demo experiment
(shortened by overrides) run each run exactly once and their table equals a one-process sweep's;
with one worker SIGKILLed mid-run, the others retry its run, which resumes, and the table still
equals it."""

from __future__ import annotations

import json
import os
import pathlib
import signal
import subprocess
import sys
import time

import pytest

from aepg_jax.config import schema
from aepg_jax.experiments import layout, registry
from aepg_jax.plan import estimate
from aepg_jax.runs import lock
from aepg_jax.sweep import claims
from aepg_jax.system import xla_cache
from aepg_jax.tables import tables

REPO = pathlib.Path(__file__).resolve().parents[1]


def test_the_cost_estimate_counts_images_and_the_methods_extra_passes():
    cfg = schema.from_file(str(REPO / "configs/imagenet_r.py"), "tasks=10,method=plain")
    plain = estimate.run_flops(cfg)
    n = (224 // 16) ** 2 + 1
    assert estimate.forward_flops(cfg.model) > 12 * 2 * n * 12 * 768**2  # ViT-B/16: ~17.6 GF
    assert estimate.forward_flops(cfg.model) == pytest.approx(35.1e9, rel=0.02)
    config = str(REPO / "configs/imagenet_r.py")
    for method in ("lae", "l2p", "inflora"):  # second eval pass, query pass, covariance
        other = schema.from_file(config, f"tasks=10,method={method}")
        assert estimate.run_flops(other) > plain, method
    twenty = schema.from_file(config, "tasks=20,method=plain")
    assert estimate.run_flops(twenty) != plain
    cfg.num_seeds = 3
    assert estimate.run_flops(cfg) == pytest.approx(3 * plain)


HOLD_UNTIL_STDIN_CLOSES = """
import sys
from aepg_jax.runs import lock
with lock.hold(sys.argv[1]):
    print("held", flush=True)
    sys.stdin.read()
"""


def test_a_worker_skips_done_held_and_just_failed_runs_and_waits_for_held_ones(
    tmp_path, monkeypatch, capsys
):
    runs = registry.get("demo").runs()[:4]
    units = list(enumerate(layout.units(runs)))
    root = str(tmp_path)
    done, failed, _, held = (tmp_path / u.name for _, u in units)
    for d in (done, failed, held):
        d.mkdir(parents=True)
    (done / "results.json").write_text("{}")
    (failed / layout.ERROR_FILE).write_text("boom\n")  # an earlier sweep's
    later = time.time() + 3600  # written by a file server whose clock is an hour ahead
    os.utime(failed / layout.ERROR_FILE, (later, later))
    started = claims.Started(root, units)
    assert claims.pending(root, units, started) == units[1:]
    holder = subprocess.Popen(
        [sys.executable, "-c", HOLD_UNTIL_STDIN_CLOSES, str(held)],
        cwd=REPO,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert holder.stdout.readline().strip() == "held"

    def release_when_the_worker_waits() -> float:
        """The worker waits for the held run: its holder releases the lock and exits."""
        if not holder.stdin.closed:
            holder.stdin.close()
            holder.wait(timeout=60)
        return 0.0

    monkeypatch.setattr(claims, "poll_seconds", release_when_the_worker_waits)
    ran = []

    def run_one(k, unit, left):  # returncode: None until the holder has exited
        ran.append((k, holder.returncode is None))
        if k == 1:
            (failed / layout.ERROR_FILE).write_text("boom again\n")  # fails now: not retried
        else:
            (tmp_path / unit.name / "results.json").write_text("{}")

    claims.work(root, units, run_one, started)
    assert ran == [(1, True), (2, True), (3, False)]  # run 3 once its holder had ended
    assert holder.returncode == 0
    assert "waiting: the 1 runs left are held by other workers." in capsys.readouterr().out
    assert claims.pending(root, units, started) == []


def test_a_run_whose_lock_cannot_be_used_is_recorded_failed_and_the_worker_goes_on(tmp_path):
    """A `.lock` that cannot be opened (here a directory: EISDIR, even for root) is no traceback
    that ends the worker: the run fails in one line (as `main.execute` would, under its own
    lock), that line is its error file, the other runs run, and the worker does not retry it."""
    runs = registry.get("demo").runs()[:3]
    units = list(enumerate(layout.units(runs)))
    root = str(tmp_path)
    broken = tmp_path / units[0][1].name
    (broken / lock.LOCK_FILE).mkdir(parents=True)
    started = claims.Started(root, units)
    ran = []

    def run_one(k, unit, left):  # what sweep.run_one does around main.execute
        workdir = tmp_path / unit.name
        try:
            with lock.hold(str(workdir)):
                (workdir / "results.json").write_text("{}")
        except lock.LockError as err:
            (workdir / layout.ERROR_FILE).write_text(f"{err}\n")
        ran.append(k)

    claims.work(root, units, run_one, started)
    assert ran == [0, 1, 2]
    line = (broken / layout.ERROR_FILE).read_text().strip()
    assert "\n" not in line and line.startswith(f"cannot take the lock of {broken} (")
    assert str(broken / lock.LOCK_FILE) in line
    assert claims.pending(root, units, started) == []


def test_a_signal_stops_the_worker_between_runs_unless_none_is_left(tmp_path):
    """A signal during a run that finishes: with runs left the worker stops before the next
    (the sweep exits 128 + signal, SLURM requeues it); after the last one it ends normally
    (exit 0: nothing to requeue)."""
    from aepg_jax.system import preemption

    units = list(enumerate(layout.units(registry.get("demo").runs()[:2])))
    root = str(tmp_path)
    ran = []

    def run_one(k, unit, left):  # a run that finishes although a signal came during it
        os.kill(os.getpid(), signal.SIGTERM)
        (tmp_path / unit.name).mkdir(parents=True, exist_ok=True)
        (tmp_path / unit.name / "results.json").write_text("{}")
        ran.append(k)

    with preemption.catch():
        with pytest.raises(preemption.Preempted, match="between runs"):
            claims.work(root, units, run_one, claims.Started(root, units))
    assert ran == [0]
    with preemption.catch():  # the rerun: its one run left gets a signal, and finishes
        claims.work(root, units, run_one, claims.Started(root, units))  # returns: none left
        assert ran == [0, 1] and preemption.requested() == signal.SIGTERM


# ---------------------------------------------------------------- slow: real workers
# The fixture and both tests: 18 min on the project's 2-core CPU shared with other jobs (load
# average ~10), 2026-11-25.

SHORT = [
    "--where=seed=0",
    "--config.data.num_tasks=2",
    "--config.max_steps_per_task=4",
    "--config.checkpoint_every_steps=2",
    "--compile_cache=",
]


def _sweep(root, *extra, wait=True, cache=None):
    """The demo sweep on `root`; `cache`: a persistent compilation cache directory (else none)."""
    cmd = [sys.executable, "-m", "aepg_jax.sweep", "--experiment=demo", f"--workdir={root}"]
    env = {**os.environ, claims.ENV_POLL: "0.5", xla_cache.ENV: str(cache) if cache else "0"}
    kwargs = dict(cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)
    if not wait:
        return subprocess.Popen([*cmd, *SHORT, *extra], **kwargs)
    return subprocess.run([*cmd, *SHORT, *extra], timeout=1800, **kwargs)


def _table(root) -> str:
    return tables.render(str(root), registry.get("demo"), "markdown")


def _matrices(root):
    return {
        str(p.relative_to(root)): json.loads(p.read_text())["accuracy_matrix"]
        for p in sorted(pathlib.Path(root).glob("demo/*/results.json"))
    }


@pytest.fixture(scope="module")
def one_process(tmp_path_factory):
    root = tmp_path_factory.mktemp("one") / "runs"
    proc = _sweep(root)
    assert proc.returncode == 0, proc.stdout
    assert len(_matrices(root)) == 6
    return root


def _done_lines(outs):
    return sorted(line.split()[1] for out in outs for line in out.splitlines() if "  done" in line)


@pytest.mark.slow
def test_three_workers_run_each_run_once_and_give_the_one_process_table(one_process, tmp_path):
    root = tmp_path / "runs"
    # The workers share one persistent compilation cache; the one-process sweep had none.
    cache = tmp_path / "xla"
    procs = [_sweep(root, wait=False, cache=cache) for _ in range(3)]
    outs = [p.communicate(timeout=1800)[0] for p in procs]
    assert [p.returncode for p in procs] == [0, 0, 0], outs
    assert any(cache.iterdir())
    # Run folders carry the overrides that change results (checkpoint_every_steps does not).
    changed = (("data.num_tasks", "2"), ("max_steps_per_task", "4"))
    names = sorted(r.folder(changed) for r in registry.get("demo").runs() if r.seed == 0)
    assert _done_lines(outs) == names  # each run once
    for log in root.glob("demo/*/sweep.log"):
        assert log.read_text().count("--- ") == 1, log  # one worker wrote it
    assert _matrices(root) == _matrices(one_process)
    assert _table(root) == _table(one_process)


@pytest.mark.slow
def test_a_sigkilled_worker_s_run_is_retried_resumes_and_the_table_holds(one_process, tmp_path):
    from aepg_jax.runs import lock

    root = tmp_path / "runs"
    procs = [_sweep(root, wait=False) for _ in range(3)]
    by_pid = {p.pid: p for p in procs}
    victim, workdir, deadline = None, None, time.time() + 900
    while victim is None and time.time() < deadline:
        for ckpts in root.glob("demo/*/checkpoints"):
            holder = lock.running(str(ckpts.parent))
            if holder and holder.pid in by_pid and any(s.isdigit() for s in os.listdir(ckpts)):
                if not (ckpts.parent / "results.json").exists():
                    victim, workdir = by_pid[holder.pid], ckpts.parent
                    break
        time.sleep(0.05)
    assert victim is not None, "no run was caught mid-way"
    os.kill(victim.pid, signal.SIGKILL)
    victim.wait()
    others = [p for p in procs if p is not victim]
    outs = [p.communicate(timeout=1800)[0] for p in others]
    assert [p.returncode for p in others] == [0, 0], outs
    assert (workdir / "results.json").exists()
    log = (workdir / "sweep.log").read_text()
    assert log.count("--- ") == 2 and "resum" in log.lower(), log  # claimed again, resumed
    assert _matrices(root) == _matrices(one_process)
    assert _table(root) == _table(one_process)
