"""The cluster path (docs/paper.md, "On a SLURM cluster"). Fast: `aepg_jax.sweep --slurm`
scripts ask for what the runs use (no --gres on a CPU-only run), a `--sbatch` option replaces the
default of its name, the requeue and signal lines are there, the script is valid bash, and its
shell passes SIGUSR1 / SIGTERM to the worker and requeues the array task after SIGUSR1 (a fake
worker and a fake scontrol). Slow, on a one-node SLURM on this machine (`local_slurm`,
scripts/slurm_local.sh): a shortened demo sweep submitted as an array of 3 workers finishes
every run with the one-process table; `srun -n 2 ... --config.distributed=True` equals one
process of two devices; a self-requeue on SIGUSR1 through the real scheduler."""

from __future__ import annotations

import json
import os
import pathlib
import shlex
import signal
import subprocess
import sys
import time

import pytest

from aepg_jax.experiments import registry
from aepg_jax.sweep import sweep
from aepg_jax.tables import tables

REPO = pathlib.Path(__file__).resolve().parents[1]


def _script(tmp_path, capsys, *extra) -> str:
    argv = ["--experiment=demo", f"--workdir={tmp_path}/w", "--slurm", "--array_size=3", *extra]
    assert sweep.main(argv) == 0
    return capsys.readouterr().out


def _options(script: str) -> list[str]:
    return [line.removeprefix("#SBATCH ") for line in script.splitlines() if line[:8] == "#SBATCH "]


def _names(script: str) -> list[str]:
    return [o.split("=")[0] for o in _options(script)]


@pytest.fixture
def cpu_only(monkeypatch):
    monkeypatch.setenv("JAX_PLATFORMS", "cpu")


def test_a_cpu_run_asks_for_no_gpu_and_the_script_is_valid_bash(tmp_path, capsys, cpu_only):
    script = _script(tmp_path, capsys)
    path = tmp_path / "job.sh"
    path.write_text(script)
    subprocess.run(["bash", "-n", str(path)], check=True)
    options = _options(script)
    assert not any(o.startswith(("--gres", "--gpus")) for o in options), options
    assert "--cpus-per-task=2" in options and "--array=0-2" in options
    assert "--requeue" in options and "--open-mode=append" in options
    assert "--signal=B:USR1@120" in options
    assert sorted(set(_names(script))) == sorted(_names(script))  # each option once
    lines = script.splitlines()
    first_command = next(i for i, line in enumerate(lines[1:], 1) if not line.startswith("#"))
    assert all(i < first_command for i, line in enumerate(lines) if line.startswith("#SBATCH"))
    assert 'scontrol requeue "${SLURM_ARRAY_JOB_ID' in script and "-eq 138" in script


def test_gpus_follow_what_the_submitting_process_sees_and_the_flags(tmp_path, capsys, monkeypatch):
    monkeypatch.delenv("JAX_PLATFORMS", raising=False)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0,1")
    assert sweep.visible_gpus() == 2
    assert "--gres=gpu:1" in _options(_script(tmp_path, capsys))  # one GPU per worker
    options = _options(_script(tmp_path, capsys, "--gpus_per_worker=2", "--cpus_per_worker=8"))
    assert "--gres=gpu:2" in options and "--cpus-per-task=8" in options
    assert not any(
        o.startswith("--gres") for o in _options(_script(tmp_path, capsys, "--gpus_per_worker=0"))
    )
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    assert sweep.visible_gpus() == 0
    monkeypatch.setenv("JAX_PLATFORMS", "cpu")
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0")
    assert sweep.visible_gpus() == 0


@pytest.mark.parametrize(
    "sbatch,absent,present",
    [
        (["--gres=gpu:a100:2"], [], ["--gres=gpu:a100:2"]),
        (["--gpus=2"], ["--gres=gpu:1"], ["--gpus=2"]),
        (["-G 2"], ["--gres=gpu:1"], ["-G 2"]),
        (["-c 6"], ["--cpus-per-task=2"], ["-c 6"]),
        (["--cpus-per-task=16"], ["--cpus-per-task=2"], ["--cpus-per-task=16"]),
        (["--signal=B:USR1@600"], ["--signal=B:USR1@120"], ["--signal=B:USR1@600"]),
        (["--no-requeue"], ["--requeue"], ["--no-requeue"]),
        (["--output=/x/%j.out", "--job-name=mine"], [], ["--output=/x/%j.out", "--job-name=mine"]),
        (["--partition=gpu", "--time=4:00:00"], [], ["--partition=gpu", "--time=4:00:00"]),
    ],
)
def test_an_sbatch_option_replaces_the_default_of_its_name(
    tmp_path, capsys, monkeypatch, sbatch, absent, present
):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0")
    monkeypatch.delenv("JAX_PLATFORMS", raising=False)
    options = _options(_script(tmp_path, capsys, *(f"--sbatch={o}" for o in sbatch)))
    assert all(o in options for o in present), options
    assert not any(o in options for o in absent), options
    for name in ("--gres", "--cpus-per-task", "--signal", "--output", "--job-name", "--array"):
        assert [o.split("=")[0] for o in options].count(name) <= 1, options
    if any(o.startswith(("--gres", "--gpus", "-G")) for o in sbatch):
        assert sum(o.startswith(("--gres", "--gpus", "-G")) for o in options) == 1, options


def test_signal_s_sets_or_drops_the_signal_line(tmp_path, capsys, cpu_only):
    assert "--signal=B:USR1@300" in _options(_script(tmp_path, capsys, "--signal_s=300"))
    assert not any(
        o.startswith("--signal") for o in _options(_script(tmp_path, capsys, "--signal_s=0"))
    )


@pytest.mark.parametrize(
    "flag", ["--cpus_per_worker=0", "--gpus_per_worker=-1", "--signal_s=x", "--cpus_per_worker=a"]
)
def test_bad_resource_flags_are_one_line(flag, capsys):
    with pytest.raises(SystemExit) as exit_:
        sweep.parse(["--experiment=demo", "--slurm", flag])
    assert exit_.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: argument ") and flag.split("=")[0] in err[0]


def test_every_slurm_flag_is_documented():
    for flag in (
        "--gpus_per_worker",
        "--cpus_per_worker",
        "--signal_s",
        "--sbatch",
        "--array_size",
    ):
        assert flag in sweep.__doc__, flag
    paper = (REPO / "docs/paper.md").read_text()
    for text in (
        "--gpus_per_worker",
        "--cpus_per_worker",
        "--signal_s",
        "scripts/slurm_local.sh",
        "scontrol requeue",
        "143",
        "138",
        "srun -n 2",
    ):
        assert text in paper, text


# A worker that stands in for the sweep: on SIGUSR1/SIGTERM it exits 128 + the signal number,
# as the sweep does after its checkpoint; else it exits with argv[2] after argv[3] seconds (at
# once when SLURM runs it again: SLURM_RESTART_COUNT set).
FAKE_WORKER = """
import os, pathlib, signal, sys, time
def stop(sig, frame):
    print(f"worker: signal {sig}", flush=True)
    sys.exit(128 + sig)
signal.signal(signal.SIGUSR1, stop)
signal.signal(signal.SIGTERM, stop)
pathlib.Path(sys.argv[1]).write_text("ready")
time.sleep(0 if os.environ.get("SLURM_RESTART_COUNT") else float(sys.argv[3]))
sys.exit(int(sys.argv[2]))
"""

FAKE_SCONTROL = """#!/bin/sh
echo "$@" >> "$(dirname "$0")/scontrol.calls"
"""


def _with_worker(script: str, worker: list[str]) -> str:
    """The script with its sweep command replaced by `worker`."""
    lines = script.splitlines()
    (k,) = [i for i, line in enumerate(lines) if " -m aepg_jax.sweep " in line]
    assert lines[k].endswith(" &")
    lines[k] = shlex.join(worker) + " &"
    return "\n".join(lines) + "\n"


@pytest.mark.parametrize(
    "sig,status,requeued",
    [(signal.SIGUSR1, 138, True), (signal.SIGTERM, 143, False), (None, 1, False)],
)
def test_the_batch_shell_forwards_the_signal_and_requeues_after_usr1(
    tmp_path, capsys, cpu_only, sig, status, requeued
):
    ready, bin_ = tmp_path / "ready", tmp_path / "bin"
    bin_.mkdir()
    (bin_ / "scontrol").write_text(FAKE_SCONTROL)
    (bin_ / "scontrol").chmod(0o755)
    (tmp_path / "worker.py").write_text(FAKE_WORKER)
    worker = [sys.executable, str(tmp_path / "worker.py"), str(ready), "1", "60" if sig else "0"]
    (tmp_path / "job.sh").write_text(_with_worker(_script(tmp_path, capsys), worker))
    env = {**os.environ, "PATH": f"{bin_}:{os.environ['PATH']}"}
    env.update(SLURM_ARRAY_JOB_ID="123", SLURM_ARRAY_TASK_ID="4", SLURM_JOB_ID="127")
    proc = subprocess.Popen(
        ["bash", str(tmp_path / "job.sh")], env=env, stdout=subprocess.PIPE, text=True
    )
    deadline = time.monotonic() + 60
    while not ready.exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    if sig:
        os.kill(proc.pid, sig)  # SLURM's --signal=B:... signals the batch shell only
    out = proc.communicate(timeout=60)[0]
    assert proc.returncode == status, out
    calls = (bin_ / "scontrol.calls").read_text() if (bin_ / "scontrol.calls").exists() else ""
    assert calls == ("requeue 123_4\n" if requeued else ""), out
    if sig:
        assert f"worker: signal {int(sig)}" in out


def test_the_batch_shell_says_a_killed_worker_most_likely_ran_out_of_memory(
    tmp_path, capsys, cpu_only
):
    killed = [sys.executable, "-c", "import os, signal; os.kill(os.getpid(), signal.SIGKILL)"]
    (tmp_path / "job.sh").write_text(_with_worker(_script(tmp_path, capsys), killed))
    env = {**os.environ, "SLURM_JOB_ID": "127"}
    proc = subprocess.run(
        ["bash", str(tmp_path / "job.sh")], env=env, capture_output=True, text=True, timeout=60
    )
    assert proc.returncode == 137
    assert proc.stderr.strip().splitlines()[-1] == (  # after bash's own "Killed" notice
        "error: the worker was killed by SIGKILL: most likely out of memory (the kernel's OOM "
        "killer; sacct -j 127 -o MaxRSS shows its peak); resubmit to resume from the last "
        "checkpoint"
    )


# ---------------------------------------------------------------- slow: a real SLURM

SHORT = [
    "--where=seed=0,loss=ce",
    "--config.data.num_tasks=2",
    "--config.max_steps_per_task=3",
    "--compile_cache=",
]


def _status(root) -> str:
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "aepg_jax.sweep",
            "--experiment=demo",
            f"--workdir={root}",
            "--status",
            *SHORT,
        ],
        cwd=REPO,
        capture_output=True,
        text=True,
        check=True,
    )
    return out.stdout


@pytest.mark.slow  # 2.5-3.2 min on 2 loaded cores (SLURM array, then one-process sweep)
def test_a_slurm_array_of_three_workers_finishes_every_run_with_the_one_process_table(
    local_slurm, tmp_path
):
    root, one = tmp_path / "slurm", tmp_path / "one"
    script = subprocess.run(
        [
            sys.executable,
            "-m",
            "aepg_jax.sweep",
            "--experiment=demo",
            f"--workdir={root}",
            "--slurm",
            "--array_size=3",
            "--cpus_per_worker=1",
            *SHORT,
        ],
        cwd=REPO,
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    assert "--gres" not in script
    (tmp_path / "job.sh").write_text(script)
    submitted = subprocess.run(
        ["sbatch", "--wait", str(tmp_path / "job.sh")],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=1800,
    )
    logs = "".join(p.read_text() for p in sorted(root.glob("slurm-*.out")))
    assert submitted.returncode == 0, submitted.stdout + submitted.stderr + logs
    assert len(list(root.glob("slurm-*_[0-2].out"))) == 3, logs  # three array tasks ran
    status = _status(root)
    assert status.strip().splitlines()[-1] == "3 done", status
    done = sorted(line.split()[1] for line in logs.splitlines() if "  done" in line)
    assert len(done) == 3 and len(set(done)) == 3, logs  # each run once
    proc = subprocess.run(
        [sys.executable, "-m", "aepg_jax.sweep", "--experiment=demo", f"--workdir={one}", *SHORT],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=1800,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    render = [tables.render(str(r), registry.get("demo"), "markdown") for r in (root, one)]
    assert render[0] == render[1]
    printed = [
        subprocess.run(
            [sys.executable, "-m", "aepg_jax.tables", str(r)],
            cwd=REPO,
            capture_output=True,
            text=True,
        ).stdout.replace(str(r), "<workdir>")  # its "Shown:" line names the sweep's folder
        for r in (root, one)
    ]
    assert printed[0] == printed[1]


MAIN_SHORT = ["--config.data.num_tasks=2", "--config.max_steps_per_task=6"]


@pytest.mark.slow  # 70-80 s on 2 loaded cores
def test_srun_two_processes_give_the_a_t_of_one_process(local_slurm, tmp_path):
    main = [sys.executable, "-m", "aepg_jax.main", "--config=configs/default.py", *MAIN_SHORT]
    env = {**os.environ, "XLA_FLAGS": "--xla_force_host_platform_device_count=2"}
    env.pop("JAX_PLATFORMS", None)
    one = subprocess.run(
        [*main, f"--workdir={tmp_path / 'one'}"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=1200,
        env=env,
    )
    assert one.returncode == 0, one.stdout + one.stderr
    env.pop("XLA_FLAGS")
    two = subprocess.run(
        [
            "srun",
            "-n",
            "2",
            "--cpus-per-task=1",
            *main,
            "--config.distributed=True",
            f"--workdir={tmp_path / 'two'}",
        ],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=1200,
        env=env,
    )
    assert two.returncode == 0, two.stdout + two.stderr
    a, b = (json.loads((tmp_path / d / "results.json").read_text()) for d in ("one", "two"))
    assert a["accuracy_matrix"] == b["accuracy_matrix"]
    assert a["A_T"] == b["A_T"]
    assert two.stdout.count("A_T") == one.stdout.count("A_T") > 0  # process 0 prints, alone


REQUEUE_ONCE = """#!/bin/bash
#SBATCH --requeue
#SBATCH --open-mode=append
#SBATCH --output={out}
#SBATCH --array=0-0
#SBATCH --cpus-per-task=1
echo "start restart=${{SLURM_RESTART_COUNT:-0}}"
"""


@pytest.mark.slow  # 2.2-2.8 min: SLURM starts a requeued job about 2 min later
def test_an_array_task_stopped_by_usr1_is_requeued_and_runs_again(
    local_slurm, tmp_path, capsys, cpu_only
):
    """The script's own requeue through the real scheduler: a fake worker exits 138 on
    SIGUSR1 the first time (sent by `scancel --batch --signal=USR1`, as --signal=B:USR1 would)
    and 0 when it runs again."""
    ready = tmp_path / "ready"
    (tmp_path / "worker.py").write_text(FAKE_WORKER)
    worker = [sys.executable, str(tmp_path / "worker.py"), str(ready), "0", "120"]
    script = _with_worker(_script(tmp_path, capsys, "--cpus_per_worker=1"), worker)
    script = script.replace("--array=0-2", "--array=0-0")
    (tmp_path / "job.sh").write_text(script)
    sub = subprocess.run(
        ["sbatch", "--parsable", str(tmp_path / "job.sh")],
        capture_output=True,
        text=True,
        check=True,
    )
    job = sub.stdout.strip().split(";")[0]
    deadline = time.monotonic() + 120
    while not ready.exists() and time.monotonic() < deadline:
        time.sleep(0.2)
    assert ready.exists(), "the job did not start"
    ready.unlink()
    subprocess.run(["scancel", "--batch", "--signal=USR1", f"{job}_0"], check=True)
    deadline = time.monotonic() + 300
    log = tmp_path / "w" / f"slurm-{job}_0.out"
    while time.monotonic() < deadline:
        state = subprocess.run(
            ["squeue", "-h", "-j", job, "-o", "%T"], capture_output=True, text=True
        ).stdout.strip()
        if not state and ready.exists():
            break
        time.sleep(1)
    text = log.read_text()
    assert f"requeueing {job}_0" in text and "worker: signal 10" in text, text
    assert ready.exists(), text  # it ran again
    info = subprocess.run(["scontrol", "show", "job", job], capture_output=True, text=True).stdout
    assert "Restarts=1" in info and "ExitCode=0:0" in info, info


LONG = [
    "--where=seed=0,loss=ce",
    "--config.data.num_tasks=2",
    "--config.optim.epochs=1000",
    "--config.max_steps_per_task=300",
    "--config.log_every_steps=1",
    "--compile_cache=",
]


def _sweep(root, *args, **kwargs) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "aepg_jax.sweep", "--experiment=demo", f"--workdir={root}", *args],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=1800,
        **kwargs,
    )


@pytest.mark.slow  # ~5 min: 3 workers, SLURM restarts the requeued task ~2 min later, then 3 runs
def test_an_array_task_requeued_mid_run_resumes_to_the_one_process_table(local_slurm, tmp_path):
    """`scontrol requeue` of a worker mid-run: its run checkpoints the step it is at (SIGTERM,
    forwarded by the batch shell) and resumes when SLURM restarts the task; the tables equal a
    one-process sweep's and every run's metrics.jsonl holds each training step once."""
    root, one = tmp_path / "slurm", tmp_path / "one"
    script = _sweep(root, "--slurm", "--array_size=3", "--cpus_per_worker=1", *LONG, check=True)
    (tmp_path / "job.sh").write_text(script.stdout)
    job = (
        subprocess.run(
            ["sbatch", "--parsable", str(tmp_path / "job.sh")],
            cwd=tmp_path,
            capture_output=True,
            text=True,
            check=True,
        )
        .stdout.strip()
        .split(";")[0]
    )

    def training_task() -> str | None:
        """The array task of a worker whose run is training (its open metrics.jsonl has train
        records and its run no results yet), from the workers' /proc entries."""
        for proc in pathlib.Path("/proc").glob("[0-9]*"):
            try:
                env = dict(
                    e.split("=", 1) for e in (proc / "environ").read_text().split("\0") if "=" in e
                )
                if (
                    env.get("SLURM_ARRAY_JOB_ID") != job
                    or "aepg_jax.sweep" not in (proc / "cmdline").read_text()
                ):
                    continue
                opened = [os.readlink(f) for f in (proc / "fd").iterdir()]
            except OSError:
                continue
            for path in map(pathlib.Path, opened):
                if path.name == "metrics.jsonl" and '"train"' in path.read_text():
                    if not (path.parent / "results.json").exists():
                        return env["SLURM_ARRAY_TASK_ID"]
        return None

    deadline, task = time.monotonic() + 600, None
    while task is None and time.monotonic() < deadline:
        task = training_task()
        time.sleep(0.2)
    assert task is not None, "no worker was seen training"
    subprocess.run(["scontrol", "requeue", f"{job}_{task}"], check=True)
    deadline = time.monotonic() + 1200
    while time.monotonic() < deadline:
        queued = subprocess.run(
            ["squeue", "-h", "-j", job], capture_output=True, text=True
        ).stdout.strip()
        if not queued:
            break
        time.sleep(2)
    logs = "".join(p.read_text() for p in sorted(root.glob("slurm-*.out")))
    info = subprocess.run(
        ["scontrol", "show", "job", f"{job}_{task}"], capture_output=True, text=True
    )
    assert "Restarts=1" in info.stdout, info.stdout + logs
    assert "stopped by SIGTERM at task " in logs, logs  # the requeued run checkpointed its step
    assert _status_lines(root)[-1] == "3 done", logs
    for metrics in root.glob("**/metrics.jsonl"):
        steps = [
            r["step"]
            for r in map(json.loads, metrics.read_text().splitlines())
            if r["type"] == "train"
        ]
        assert steps == list(range(1, 2 * 300 + 1)), metrics  # each step once, in order
    assert _sweep(one, *LONG).returncode == 0
    render = [tables.render(str(r), registry.get("demo"), "markdown") for r in (root, one)]
    assert render[0] == render[1]


def _status_lines(root) -> list[str]:
    return _sweep(root, "--status", *LONG, check=True).stdout.strip().splitlines()
