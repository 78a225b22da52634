"""Preemption loses at most one step: SIGTERM / SIGUSR1 / Ctrl-C make `aepg_jax.main` finish the
current step, checkpoint it and exit with one line (status 128 + signal); the same command
resumes to the results of an uninterrupted run, no training step recorded twice. A second Ctrl-C
stops at once and says what the rerun resumes from. A signal at a task's last step checkpoints
it before the task's evaluation. A wall-clock interval adds checkpoints inside a task. The runs
train under `cosine_epochs`: their records' `lr` is the schedule's."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time

import pytest
from test_user_facing import _message_lines
from tiny import tiny_config, write_spec

from aepg_jax.config import schema
from aepg_jax.continual import trainer
from aepg_jax.runs import checkpointing, predictions
from aepg_jax.system import preemption, progress

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
OVERRIDES = {
    "optim.epochs": 8,  # 8 epochs of 22 steps, capped at 150; PEFT frozen for the first 37
    "optim.lr_schedule": "cosine_epochs",
    "data.num_tasks": 2,
    "max_steps_per_task": 150,
    "log_every_steps": 1,
    "checkpoint_every_minutes": 0.0,
}


# `aepg_jax.main` whose stop on a signal creates the file argv[1] then waits a minute before its
# checkpoint: a second Ctrl-C sent once the file is there surely finds it unwritten.
SLOW_STOP = """
import runpy, sys, time
from aepg_jax.system import preemption
save_and_stop = preemption.save_and_stop
stopping = sys.argv.pop(1)
def slowly(*args, **kwargs):
    open(stopping, "w").close()
    time.sleep(60)
    return save_and_stop(*args, **kwargs)
preemption.save_and_stop = slowly
runpy.run_module("aepg_jax.main", run_name="__main__")
"""


def _main(config: str, workdir, entry=("-m", "aepg_jax.main"), **kwargs) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, *entry, f"--config={config}", f"--workdir={workdir}"],
        cwd=ROOT,
        env={**os.environ, "JAX_PLATFORMS": "cpu"},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        **kwargs,
    )


def _train_records(workdir) -> list[dict]:
    lines = (workdir / "metrics.jsonl").read_text().splitlines()
    return [r for r in map(json.loads, lines) if r["type"] == "train"]


def _records(path) -> list[dict]:
    """The whole records of a metrics.jsonl being written (a line cut short is left out)."""
    out = []
    for line in path.read_text().splitlines():
        try:
            out.append(json.loads(line))
        except ValueError:
            pass
    return out


def _wait_for_training(proc: subprocess.Popen, workdir, task: int = 0) -> None:
    """Returns once the run has logged a training step of task `task` (0-based) or a later one;
    fails if it ended first."""
    metrics = workdir / "metrics.jsonl"
    deadline = time.time() + 240
    while time.time() < deadline and proc.poll() is None:
        if metrics.is_file() and any(
            r.get("type") == "train" and r.get("task", 0) >= task for r in _records(metrics)
        ):
            break
        time.sleep(0.05)
    assert proc.poll() is None, "the run ended before it could be stopped"


def _stop_once_training(proc: subprocess.Popen, workdir, signum: int, task: int = 0):
    """Sends `signum` once the run has logged a training step of task `task` or later; returns
    its end."""
    _wait_for_training(proc, workdir, task)
    sent = time.time()
    proc.send_signal(signum)
    _, stderr = proc.communicate(timeout=120)
    return proc.returncode, stderr, time.time() - sent


def _stopped(proc: subprocess.Popen, workdir, signum: int, pattern: str, task: int = 0):
    """Stops the run with `signum` once it trains task `task` or later; checks that it ended
    within 30 s with status 128 + signum and one line, no traceback; returns that line's match
    of `pattern`."""
    status, stderr, seconds = _stop_once_training(proc, workdir, signum, task)
    lines = _message_lines(stderr)
    assert status == 128 + signum and "Traceback" not in stderr, stderr[-3000:]
    assert len(lines) == 1 and seconds < 30, (lines, seconds)
    stopped = re.fullmatch(pattern, lines[0])
    assert stopped, lines[0]
    return stopped


@pytest.mark.parametrize(
    "signum", [signal.SIGTERM, pytest.param(signal.SIGUSR1, marks=pytest.mark.slow)]
)
def test_a_stop_signal_checkpoints_the_step_and_the_rerun_resumes_exactly(
    tmp_path, monkeypatch, signum
):
    """Mid-task through `aepg_jax.main`, then at a task's last step in this process."""
    cache = tmp_path / "cache"
    reference = trainer.run(tiny_config(cache, **OVERRIDES), str(tmp_path / "straight"))
    config = write_spec(tmp_path / "spec.json", cache, OVERRIDES)
    workdir = tmp_path / "run"
    name = signal.Signals(signum).name
    stopped = _stopped(
        _main(config, workdir),
        workdir,
        signum,
        rf"stopped by {name} at task (\d)/2, step (\d+)/150 \(checkpoint (\d+) in (.+)\); run "
        "the same command to resume",
    )
    task, step, global_step = (int(stopped.group(i)) for i in (1, 2, 3))
    assert global_step == (task - 1) * 150 + step
    ckpt = checkpointing.Checkpointer(str(workdir / "checkpoints"))
    assert ckpt.steps()[-1] == global_step
    ckpt.close()
    assert _train_records(workdir)[-1]["step"] == global_step  # nothing past the checkpoint

    resumed = _main(config, workdir)
    _, err = resumed.communicate(timeout=600)
    assert resumed.returncode == 0, err[-3000:]
    results = json.loads((workdir / "results.json").read_text())
    assert results["accuracy_matrix"] == reference["accuracy_matrix"]
    assert results["A_T"] == reference["A_T"]
    # The kept predictions too: the same file, byte for byte.
    straight = tmp_path / "straight" / predictions.FILE
    assert (workdir / predictions.FILE).read_bytes() == straight.read_bytes()
    assert results["predictions"] == reference["predictions"]
    steps = [r["step"] for r in _train_records(workdir)]
    assert steps == sorted(set(steps)) == list(range(1, 2 * 150 + 1))  # each step once

    _stop_at_the_last_step_and_resume(tmp_path / "last", cache, reference, signum, monkeypatch)


def _stop_at_the_last_step_and_resume(workdir, cache, reference: dict, signum: int, monkeypatch):
    """The signal arrives during task 1's last step: checkpoint 150 (in_task, task step 150 of
    150) is written before end_task and the evaluation, and no eval is recorded; the rerun
    starts with them and ends as the uninterrupted run did, each step recorded once, each train
    record's lr the rate the schedule gives Adam at that step."""
    from aepg_jax.continual import steps as step_lib

    cfg = tiny_config(cache, **OVERRIDES)
    work = str(workdir)
    log = trainer._Logger.__call__

    def signal_at_the_last_step(self, state, step, k, chunk, bar):
        if self.t == 0 and step == self.plan.total_steps:
            os.kill(os.getpid(), signum)  # recorded by preemption.catch
        return log(self, state, step, k, chunk, bar)

    monkeypatch.setattr(trainer._Logger, "__call__", signal_at_the_last_step)
    with preemption.catch():
        stopped = rf"by {signal.Signals(signum).name} at task 1/2, step 150/150 \(checkpoint 150 "
        with pytest.raises(preemption.Preempted, match=stopped):
            trainer.run(cfg, work)
    monkeypatch.undo()
    ckpt = checkpointing.Checkpointer(os.path.join(work, "checkpoints"))
    assert ckpt.steps() == [150]
    ckpt.close()
    assert [r["type"] for r in map(json.loads, open(os.path.join(work, "metrics.jsonl")))] == [
        "train"
    ] * 150

    resumed = trainer.run(cfg, work)
    assert resumed["accuracy_matrix"] == reference["accuracy_matrix"]
    assert resumed["A_T"] == reference["A_T"]
    assert resumed["predictions"] == reference["predictions"]  # the kept predictions' digest
    assert resumed["methods"]["model"]["ece"] == reference["methods"]["model"]["ece"]
    lines = [json.loads(x) for x in open(os.path.join(work, "metrics.jsonl"))]
    assert [(r["type"], r["step"]) for r in lines if r["type"] == "eval"] == [
        ("eval", 150), ("eval", 300)
    ]  # fmt: skip
    assert [r["step"] for r in lines if r["type"] == "train"] == list(range(1, 301))

    task_2 = [r for r in lines if r["type"] == "train" and r["task"] == 1]
    per_epoch = sum(r["epoch"] == 0 for r in task_2)  # 22
    freeze = sum(not r["train_peft"] for r in task_2)  # 37
    schedule = step_lib.learning_rate(cfg, per_epoch)
    for r in task_2:  # PEFT trains after the head-only steps, its schedule lagging the head's
        head = float(schedule(r["task_step"] - 1))
        assert r["lr"] == pytest.approx(head, rel=1e-6), r
        peft = float(schedule(max(r["task_step"] - 1 - freeze, 0)))
        if r["train_peft"] and abs(peft - head) > 1e-6 * head:
            assert r["lr_peft"] == pytest.approx(peft, rel=1e-6), r
        else:
            assert "lr_peft" not in r, r
    assert min(r["lr"] for r in lines if "lr" in r) < cfg.optim.learning_rate
    assert any("lr_peft" in r for r in lines)


@pytest.mark.slow
def test_ctrl_c_in_the_default_run_resumes_at_its_step_and_a_second_one_stops_at_once(tmp_path):
    """configs/default.py as shipped: Ctrl-C during task 2 checkpoints the step in progress and
    ends with one line (exit 130); the same command resumes at that step. Ctrl-C twice during
    task 3 of the resumed run (its stop's checkpoint slowed: `SLOW_STOP`): the second stops it
    at once, saying that task 3 starts over; the same command starts it over and ends with the
    uninterrupted run's accuracy matrix and kept predictions, each training step recorded
    once."""
    config = os.path.join(ROOT, "configs", "default.py")
    straight = tmp_path / "straight"
    reference = trainer.run(schema.from_file(config), str(straight))
    workdir, checkpoints = tmp_path / "run", tmp_path / "run" / "checkpoints"

    stopped = _stopped(
        _main(config, workdir),
        workdir,
        signal.SIGINT,
        rf"interrupted at task 2/5, step (\d+)/(\d+) \(checkpoint (\d+) in {checkpoints}\); "
        "run the same command to resume",
        task=1,
    )
    step, total, global_step = (int(stopped.group(i)) for i in (1, 2, 3))
    assert 0 < step <= total and global_step == total + step
    every = schema.from_file(config).log_every_steps  # a train record every 10th step
    assert global_step - every < _train_records(workdir)[-1]["step"] <= global_step

    stopping = tmp_path / "stopping"
    resumed = _main(config, workdir, entry=("-c", SLOW_STOP, str(stopping)))
    _wait_for_training(resumed, workdir, task=2)
    resumed.send_signal(signal.SIGINT)
    while not stopping.exists() and resumed.poll() is None:
        time.sleep(0.05)  # the first is handled after its step: its checkpoint waits in `slowly`
    resumed.send_signal(signal.SIGINT)
    out, stderr = resumed.communicate(timeout=120)
    assert f"resuming from {checkpoints}: task 2, step {step}\n" in out
    lines = _message_lines(stderr)
    assert resumed.returncode == 130 and "Traceback" not in stderr, stderr[-3000:]
    assert len(lines) == 1, lines
    assert re.fullmatch(
        rf"interrupted at once at task 3/5, step \d+/{total}, without a checkpoint of it; run "
        "the same command: task 3/5 starts over",
        lines[0],
    ), lines[0]

    final = _main(config, workdir)
    out, stderr = final.communicate(timeout=600)
    assert final.returncode == 0, stderr[-3000:]
    assert f"resuming from {checkpoints}: task 3, step 0\n" in out
    results = json.loads((workdir / "results.json").read_text())
    assert results["accuracy_matrix"] == reference["accuracy_matrix"]
    assert results["A_T"] == reference["A_T"]
    assert (workdir / predictions.FILE).read_bytes() == (straight / predictions.FILE).read_bytes()
    steps = [r["step"] for r in _train_records(workdir)]
    assert steps == [r["step"] for r in _train_records(straight)]  # each logged step once


@pytest.mark.slow
def test_a_second_ctrl_c_stops_at_once_and_names_the_checkpoint_the_rerun_resumes_from(
    tmp_path, monkeypatch
):
    """In this process: two SIGINTs at a step of task 2 (the first recorded, the second raising
    `KeyboardInterrupt` before any checkpoint of that step); `aepg_jax.main`'s line says that
    task 2 starts over, and so the rerun does, to the uninterrupted run's results."""
    cache = tmp_path / "cache"
    overrides = {"data.num_tasks": 2, "checkpoint_every_minutes": 0.0}
    reference = trainer.run(tiny_config(cache, **overrides), str(tmp_path / "straight"))
    log = trainer._Logger.__call__

    def ctrl_c_twice(self, state, step, k, chunk, bar):
        if self.t == 1 and step == 3:
            os.kill(os.getpid(), signal.SIGINT)  # recorded by preemption.catch
            os.kill(os.getpid(), signal.SIGINT)  # raises KeyboardInterrupt
        return log(self, state, step, k, chunk, bar)

    monkeypatch.setattr(trainer._Logger, "__call__", ctrl_c_twice)
    work = str(tmp_path / "run")
    with preemption.catch(), pytest.raises(KeyboardInterrupt):
        trainer.run(tiny_config(cache, **overrides), work)
    monkeypatch.undo()
    assert progress.interrupted_message() == (
        "interrupted at once at task 2/2, step 3/8, without a checkpoint of it; run the same "
        "command: task 2/2 starts over"
    )
    ckpt = checkpointing.Checkpointer(os.path.join(work, "checkpoints"))
    assert ckpt.steps() == [8]  # task 1's own
    ckpt.close()
    resumed = trainer.run(tiny_config(cache, **overrides), work)
    assert resumed["accuracy_matrix"] == reference["accuracy_matrix"]


def test_a_wall_clock_interval_checkpoints_inside_a_task(tmp_path):
    cfg = tiny_config(
        tmp_path / "cache",
        **{**OVERRIDES, "max_steps_per_task": 12, "checkpoint_every_minutes": 1e-9},
    )
    timed = trainer.run(cfg, str(tmp_path / "timed"))
    ckpt = checkpointing.Checkpointer(str(tmp_path / "timed" / "checkpoints"))
    # Every step checkpoints (the newest three are kept): 22 and 23 inside task 2, 24 its end.
    assert ckpt.steps() == [22, 23, 24]
    ckpt.close()
    cfg.checkpoint_every_minutes = 0.0
    plain = trainer.run(cfg, str(tmp_path / "plain"))
    assert timed["accuracy_matrix"] == plain["accuracy_matrix"]


def test_catch_records_the_first_signal_and_restores_the_handlers():
    before = signal.getsignal(signal.SIGTERM)
    with preemption.catch():
        assert preemption.requested() is None
        os.kill(os.getpid(), signal.SIGUSR1)
        os.kill(os.getpid(), signal.SIGTERM)
        assert preemption.requested() == signal.SIGUSR1
        assert preemption.agree(False) == (signal.SIGUSR1, False)
    assert preemption.requested() is None
    assert signal.getsignal(signal.SIGTERM) == before
    stop = preemption.Preempted(signal.SIGTERM, "at task 1/2, step 3/4")
    assert stop.status == 143 and str(stop) == "stopped by SIGTERM at task 1/2, step 3/4"


def test_the_scratch_trainer_stops_inside_an_epoch_and_resumes_exactly(tmp_path, monkeypatch):
    """Stopped after its first step, then (resumed) at epoch 2's last step, before that epoch's
    evaluation: the second rerun ends as an uninterrupted run, each record once."""
    from test_scratch import tiny_config as scratch_config

    from aepg_jax.scratch import trainer as scratch_trainer

    cfg = scratch_config(tmp_path / "cache", checkpoint_every_minutes=0.0, log_every_steps=1)
    reference = scratch_trainer.run(cfg, str(tmp_path / "straight"))
    work = str(tmp_path / "run")
    with preemption.catch():
        os.kill(os.getpid(), signal.SIGTERM)  # recorded: the run stops after its first step
        with pytest.raises(preemption.Preempted, match=r"at epoch 1/3, step 1/3 \(checkpoint 1 "):
            scratch_trainer.run(cfg, work)
    check = scratch_trainer._Run.checkpoint_in_epoch

    def signal_at_epoch_2s_last_step(self, state, epoch, step, sums, bar):
        if epoch == 1 and step == self.steps_per_epoch:
            os.kill(os.getpid(), signal.SIGTERM)
        return check(self, state, epoch, step, sums, bar)

    monkeypatch.setattr(scratch_trainer._Run, "checkpoint_in_epoch", signal_at_epoch_2s_last_step)
    with preemption.catch():
        with pytest.raises(preemption.Preempted, match=r"at epoch 2/3, step 3/3 \(checkpoint 6 "):
            scratch_trainer.run(cfg, work)
    monkeypatch.undo()
    lines = [json.loads(x) for x in open(os.path.join(work, "metrics.jsonl"))]
    assert lines[-1]["step"] == 6 and [r["step"] for r in lines if r["type"] == "epoch"] == [3]
    resumed = scratch_trainer.run(cfg, work)
    for key in ("train_loss", "train_acc", "train_entropy", "test_acc", "test_entropy"):
        assert resumed[key] == reference[key], key
    lines = [json.loads(x) for x in open(os.path.join(work, "metrics.jsonl"))]
    assert [r["step"] for r in lines if r["type"] == "train"] == list(range(1, 10))
    assert [r["step"] for r in lines if r["type"] == "epoch"] == [3, 6, 9]
