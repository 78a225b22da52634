"""Several processes on one machine, as a multi-host run (`aepg_jax.launch`,
`aepg_jax.system.hosts`).

Each process has its own CPU device(s); JAX joins them over gloo. 2 processes x 1 device must
train exactly like 1 process x 2 devices (same global batch, same mesh size), each process must
read only its slice of every global batch, a run killed mid-task must resume from its Orbax
checkpoint with either process count, and a process that dies alone must stop the others.
"""

import json
import os
import resource
import signal
import subprocess
import sys
import textwrap
import time

import numpy as np
import pytest
import tiny

from aepg_jax import methods
from aepg_jax.data import loader
from aepg_jax.launch import launch
from aepg_jax.runs import records

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

LOADER_SCRIPT = textwrap.dedent("""
    import json, os, sys
    from aepg_jax.system import hosts
    hosts.initialize(False)
    import jax, numpy as np
    from jax.experimental import multihost_utils
    from aepg_jax.data import loader

    class CountingImages:
        '''The image array, recording every row this process reads from it.'''
        def __init__(self, array):
            self.array, self.rows = array, []
            self.shape, self.dtype = array.shape, array.dtype
        def __getitem__(self, rows):
            self.rows.extend(np.asarray(rows).ravel().tolist())
            return self.array[rows]

    n = int(sys.argv[2])
    images = np.zeros((n, 4, 4, 3), np.uint8)
    images[:, 0, 0, 0] = np.arange(n)  # the row id, readable in the global batch
    labels = np.arange(n) % 10
    mesh = loader.data_mesh()
    out = {"process": jax.process_index(), "count": jax.process_count()}
    for name, kwargs in (("train", dict(train=True, seed=3, epoch=1)), ("eval", dict(train=False))):
        counting = CountingImages(images)
        batches = []
        for b in loader.iterate(counting, labels, np.arange(n), 8, mesh, **kwargs):
            rows = multihost_utils.process_allgather(b["image"][:, 0, 0, 0], tiled=True)
            batches.append(np.asarray(rows).tolist())
        out[name] = {"read": counting.rows, "batches": batches}
    with open(os.path.join(sys.argv[1], f"p{jax.process_index()}.json"), "w") as f:
        json.dump(out, f)
""")


def test_each_process_reads_only_its_slice_of_every_global_batch(tmp_path):
    n = 37  # 4 training batches of 8 (5 left over), 5 eval batches (the last padded)
    cmd = [sys.executable, "-c", LOADER_SCRIPT, str(tmp_path), str(n)]
    procs = launch.start(2, 1, cmd, cwd=REPO)
    assert launch.supervise(procs, grace_s=5.0) == 0
    out = [json.load(open(tmp_path / f"p{i}.json")) for i in range(2)]
    assert [o["count"] for o in out] == [2, 2]
    for name in ("train", "eval"):
        batches = out[0][name]["batches"]
        assert out[1][name]["batches"] == batches  # the same global batches on both processes
        for i, o in enumerate(out):
            # Process i read exactly rows [4 i, 4 i + 4) of each global batch of 8, nothing else.
            expected = sorted(r for b in batches for r in b[4 * i : 4 * i + 4])
            assert sorted(o[name]["read"]) == expected
        reads = [set(o[name]["read"]) for o in out]
        assert len(out[0][name]["read"]) == len(out[1][name]["read"]) == 4 * len(batches)
        if name == "train":
            assert not reads[0] & reads[1]
    # The global batches are those of one process over the same mesh size.
    images = np.zeros((n, 4, 4, 3), np.uint8)
    images[:, 0, 0, 0] = np.arange(n)
    one = loader.iterate(
        images, np.arange(n) % 10, np.arange(n), 8, loader.data_mesh(), train=True, seed=3, epoch=1
    )
    assert [np.asarray(b["image"][:, 0, 0, 0]).tolist() for b in one] == out[0]["train"]["batches"]


def test_launcher_environment_and_statuses(capsys):
    env = launch.process_env({"PATH": "/bin"}, 2, 1, 1234, 3)
    assert env["JAX_COORDINATOR_ADDRESS"] == "127.0.0.1:1234"
    assert env["JAX_COORDINATOR_BIND_ADDRESS"] == "127.0.0.1:1234"  # not every interface
    assert (env["AEPG_NUM_PROCESSES"], env["AEPG_PROCESS_ID"]) == ("2", "1")
    assert env["JAX_NUM_CPU_DEVICES"] == "3" and env["JAX_PLATFORMS"] == "cpu"
    assert env["JAX_CPU_COLLECTIVES_IMPLEMENTATION"] == "gloo"
    assert "AEPG_PROCESS_ID" not in launch.process_env({}, 1, 0, 1234, 2)  # one process: plain
    assert launch.exit_status(-signal.SIGKILL) == 137 and launch.exit_status(2) == 2
    oom = (
        "process 1 of 2 was killed by SIGKILL: most likely out of memory (the kernel's OOM killer)"
    )
    assert launch.describe(1, 2, -9) == oom
    assert launch.describe(1, 2, -9, 3 * 2**30) == f"{oom}, its peak RSS 3.0 GiB"
    assert launch.describe(0, 2, -15) == "process 0 of 2 was killed by SIGTERM"
    args, rest = launch.parse(["--num_processes=3", "--", "--config=c.py", "--workdir=w"])
    assert args.num_processes == 3 and rest == ["--config=c.py", "--workdir=w"]
    with pytest.raises(SystemExit, match="2"):
        launch.parse(["--num_processes=3", "--config=c.py"])
    assert "after --" in capsys.readouterr().err


def test_a_killed_process_is_reported_with_its_peak_rss():
    """A child that allocates ~200 MiB, then dies by SIGKILL: the launcher's poll reaps it with
    its resource usage."""
    grow = "import os, signal; b = bytearray(200 * 2**20); os.kill(os.getpid(), signal.SIGKILL)"
    p = subprocess.Popen([sys.executable, "-c", grow])
    deadline = time.monotonic() + 60
    code, peak = launch.poll(p)
    while code is None and time.monotonic() < deadline:
        time.sleep(0.05)
        code, peak = launch.poll(p)
    # Linux counts the memory of the process a child was forked from in the child's peak (the
    # mm it replaced at exec), so the bound allows for this test process's own size.
    own = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    assert code == -signal.SIGKILL and peak is not None
    assert 200 * 2**20 < peak < max(2**31, own + 2**30)


def test_first_failure_stops_the_other_processes(capfd):
    sleeper = [
        sys.executable,
        "-c",
        "import os, sys, time\n"
        "if os.environ['AEPG_PROCESS_ID'] == '1': sys.exit(3)\ntime.sleep(600)",
    ]
    start = time.monotonic()
    procs = launch.start(2, 1, sleeper)
    assert launch.supervise(procs, grace_s=5.0) == 3
    assert time.monotonic() - start < 30
    assert all(p.poll() is not None for p in procs)
    assert "error: process 1 of 2 exited with status 3; stopped the other processes." in (
        capfd.readouterr().err
    )


@pytest.mark.parametrize(
    "argv,expected",
    [
        (["--num_processes=0", "--", "x"], "error: --num_processes=0 must be at least 1."),
        (["--num_processes=-1", "--", "x"], "error: --num_processes=-1 must be at least 1."),
        (["--devices_per_process=0", "--", "x"], "error: --devices_per_process=0 must be"),
        (["--num_processes=two", "--", "x"], "error: argument --num_processes: invalid int"),
        (["--lr=0.1", "--", "x"], "error: unrecognized arguments: --lr=0.1; aepg_jax.main's"),
    ],
)
def test_launcher_errors_are_one_line(argv, expected, capsys):
    with pytest.raises(SystemExit) as exit_info:
        launch.parse(argv)
    assert exit_info.value.code == 2
    captured = capsys.readouterr()
    lines = captured.err.splitlines()
    assert len(lines) == 1 and lines[0].startswith(expected) and not captured.out, lines


def test_launcher_help_without_the_separator(capsys):
    with pytest.raises(SystemExit) as exit_info:
        launch.parse(["--help"])
    assert exit_info.value.code == 0
    assert "--num_processes" in capsys.readouterr().out


def test_a_config_error_of_every_process_is_one_line(capfd):
    """Each process exits 2 on the same config error, printed by process 0 only (cli.fail):
    the launcher adds no line of its own, and process 0 is not stopped before it prints."""
    script = (
        "import os, sys, time\n"
        "if os.environ['AEPG_PROCESS_ID'] == '0':\n"
        "    time.sleep(1.0)\n"  # the other one fails first
        "    print('error: Invalid config: x', file=sys.stderr)\n"
        "sys.exit(2)"
    )
    procs = launch.start(2, 1, [sys.executable, "-c", script])
    assert launch.supervise(procs, grace_s=10.0) == 2
    assert capfd.readouterr().err.splitlines() == ["error: Invalid config: x"]


@pytest.mark.slow  # two real processes of aepg_jax.main (~12 s on 2 loaded cores)
def test_launched_config_error_is_printed_once(tmp_path):
    main_args = [
        "--config=configs/default.py",
        f"--workdir={tmp_path / 'w'}",
        "--config.optim.learning_rate=-1",
    ]
    out = subprocess.run(
        [sys.executable, "-m", "aepg_jax.launch", "--num_processes=2", "--", *main_args],
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=300,
    )
    assert out.returncode == 2
    assert out.stderr.splitlines() == [
        "error: Invalid config: optim.learning_rate=-1.0 must be > 0."
    ], out.stderr


# The tiny run of the equality tests: 2 tasks of 6 steps, logged every step.
E2E = {"data.num_tasks": 2, "max_steps_per_task": 6, "log_every_steps": 1, "method.name": "plain"}


def _main_args(tmp_path, name, overrides):
    spec = tiny.write_spec(tmp_path / f"{name}.json", tmp_path / "cache", overrides)
    return [f"--config={spec}", f"--workdir={tmp_path / name}"]


def _launch_main(
    tmp_path, name, overrides, processes, devices, log_dir=None, timeout=600, env=None
):
    """Runs `aepg_jax.main` on the tiny config as `processes` x `devices`; the exit status."""
    cmd = launch.main_command(_main_args(tmp_path, name, overrides))
    log_dir = log_dir or tmp_path / f"{name}-logs"
    procs = launch.start(processes, devices, cmd, env=env, log_dir=str(log_dir), cwd=REPO)
    deadline = time.monotonic() + timeout
    while any(p.poll() is None for p in procs) and time.monotonic() < deadline:
        if any(p.poll() not in (None, 0) for p in procs):
            break
        time.sleep(0.2)
    return launch.supervise(procs, grace_s=5.0)


def _logs(tmp_path, name):
    return [p.read_text() for p in sorted((tmp_path / f"{name}-logs").glob("process_*.log"))]


def _seed_dirs(workdir, num_seeds):
    return [workdir] if num_seeds == 1 else [workdir / f"seed_{s}" for s in range(num_seeds)]


def _train_losses(directory):
    return {
        (r["task"], r["step"]): r["loss"]
        for r in records.read_metrics(directory)
        if r["type"] == "train"
    }


def _assert_same_results(a, b, num_seeds=1):
    """Runs in workdirs `a` and `b` have the same accuracy matrices and losses (to 1e-5)."""
    for da, db in zip(_seed_dirs(a, num_seeds), _seed_dirs(b, num_seeds), strict=True):
        ra, rb = (json.load(open(d / "results.json")) for d in (da, db))
        assert ra["predictors"] == rb["predictors"]
        for p in ra["predictors"]:
            np.testing.assert_allclose(
                np.array(ra["methods"][p]["accuracy_matrix"], float),
                np.array(rb["methods"][p]["accuracy_matrix"], float),
                atol=1e-5,
            )
        la, lb = _train_losses(da), _train_losses(db)
        assert la.keys() == lb.keys() and la
        np.testing.assert_allclose([la[k] for k in la], [lb[k] for k in la], rtol=1e-5, atol=1e-5)


def _files(workdir):
    """The run's files (checkpoint contents aside), relative to `workdir`; TensorBoard's event
    files by their prefix (their names hold the creation time)."""
    out = set()
    for root, dirs, files in os.walk(workdir):
        if os.path.basename(root) == "checkpoints":
            dirs.clear()
        names = [
            f.split(".tfevents.")[0] + ".tfevents.*" if ".tfevents." in f else f for f in files
        ]
        out |= {os.path.relpath(os.path.join(root, f), workdir) for f in names}
    return out


@pytest.mark.parametrize(
    "overrides,num_seeds",
    [
        # Each case is two short runs (~1-2 min on 2 CPU cores): too long for CI.
        pytest.param(
            {"method.name": "lae", "loss.name": "aepg"}, 1, id="lae", marks=pytest.mark.slow
        ),
        pytest.param({}, 1, id="plain", marks=pytest.mark.slow),
        pytest.param({"num_seeds": 2}, 2, id="two-seeds", marks=pytest.mark.slow),
        pytest.param({"optim.steps_per_call": 4}, 1, id="scanned", marks=pytest.mark.slow),
        # Host-made method state (InfLoRA's memory) checkpointed by both processes.
        pytest.param({"method.name": "inflora"}, 1, id="inflora", marks=pytest.mark.slow),
    ],
)
def test_two_processes_equal_one_process_with_two_devices(tmp_path, overrides, num_seeds):
    overrides = {**E2E, **overrides}
    assert _launch_main(tmp_path, "one", overrides, processes=1, devices=2) == 0
    # The two processes share one persistent compilation cache (the first run, without it).
    cache = tmp_path / "xla"
    env = dict(os.environ, AEPG_COMPILE_CACHE=str(cache))
    assert _launch_main(tmp_path, "two", overrides, processes=2, devices=1, env=env) == 0
    assert any(cache.iterdir())  # process 0 wrote its programs there
    _assert_same_results(tmp_path / "one", tmp_path / "two", num_seeds)
    # Only process 0 writes metrics, results and plots: the same files, no line written twice.
    assert _files(tmp_path / "one") == _files(tmp_path / "two")
    for d in _seed_dirs(tmp_path / "two", num_seeds):
        lines = (d / "metrics.jsonl").read_text().splitlines()
        assert len(lines) == len(set(lines)) == len(records.read_metrics(d))
    log0, log1 = _logs(tmp_path, "two")
    assert "A_T (%)" in log0 or "A_T" in log0
    assert "after task" not in log1 and "A_T" not in log1
    assert "[Gloo]" not in log0 + log1  # gloo's connection lines are dropped (hosts.initialize)


def _checkpoint_steps(workdir):
    where = workdir / "checkpoints"
    return [int(s) for s in os.listdir(where) if s.isdigit()] if where.exists() else []


def _launch_and_kill(tmp_path, name, overrides, kill_at, timeout=300):
    """Starts the 2-process launcher and SIGKILLs it and both processes at once as soon as a
    checkpoint of a step in `kill_at` exists (mid-task)."""
    args = [f"--log_dir={tmp_path / f'{name}-logs'}", "--", *_main_args(tmp_path, name, overrides)]
    proc = subprocess.Popen(
        [sys.executable, "-m", "aepg_jax.launch", "--num_processes=2", *args],
        cwd=REPO,
        start_new_session=True,  # its own process group: the launcher and its 2 children
    )
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and proc.poll() is None:
        if any(s in kill_at for s in _checkpoint_steps(tmp_path / name)):
            break
        time.sleep(0.05)
    assert proc.poll() is None, "the run ended before it could be killed"
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    assert not (tmp_path / name / "results.json").exists()


@pytest.mark.slow  # four launches (~3-5 min on 2 CPU cores)
def test_killed_two_process_run_resumes_with_either_process_count(tmp_path):
    """SIGKILL both processes mid-task 0, restart both; SIGKILL both mid-task 1, finish with
    one process of 2 devices: the results equal an uninterrupted run's."""
    overrides = {
        **E2E,
        "method.name": "lae",
        "loss.name": "aepg",
        "max_steps_per_task": 10,
        "checkpoint_every_steps": 2,
    }
    assert _launch_main(tmp_path, "straight", overrides, processes=1, devices=2) == 0
    _launch_and_kill(tmp_path, "killed", overrides, kill_at=range(2, 10))  # task 0: steps 0-9
    _launch_and_kill(tmp_path, "killed", overrides, kill_at=range(12, 20))  # task 1: 10-19
    assert _launch_main(tmp_path, "killed", overrides, processes=1, devices=2) == 0
    _assert_same_results(tmp_path / "straight", tmp_path / "killed")
    resumed = json.load(open(tmp_path / "killed" / "results.json"))
    reference = json.load(open(tmp_path / "straight" / "results.json"))
    assert resumed["accuracy_matrix"] == reference["accuracy_matrix"]
    np.testing.assert_allclose(resumed["entropy"], reference["entropy"], rtol=1e-5)


@pytest.mark.slow  # ~30-60 s on 2 cores; CI runs the launcher's first-failure stop above
@pytest.mark.parametrize("victim", [1, 0])
def test_a_process_that_dies_alone_stops_the_others(tmp_path, victim):
    """Without the launcher's supervision (as on separate hosts): the survivor of a SIGKILLed
    peer ends by itself, non-zero, with an error naming the cause, within a bounded time."""
    overrides = {**E2E, "max_steps_per_task": 50, "checkpoint_every_steps": 2}
    cmd = launch.main_command(_main_args(tmp_path, "run", overrides))
    env = dict(os.environ, AEPG_HEARTBEAT_TIMEOUT_S="5")
    procs = launch.start(2, 1, cmd, env=env, log_dir=str(tmp_path / "logs"), cwd=REPO)
    try:
        deadline = time.monotonic() + 300
        while not _checkpoint_steps(tmp_path / "run") and time.monotonic() < deadline:
            assert all(p.poll() is None for p in procs)
            time.sleep(0.05)
        procs[victim].kill()
        killed = time.monotonic()
        survivor = procs[1 - victim]
        survivor.wait(timeout=120)
        waited = time.monotonic() - killed
    finally:
        launch.stop(procs, grace_s=1.0)
    log = (tmp_path / "logs" / f"process_{1 - victim}.log").read_text(errors="replace")
    print(f"survivor exited {survivor.returncode} after {waited:.1f} s")
    assert survivor.returncode != 0 and waited < 5 + 30
    # Our line when a collective fails at once; JAX's abort after the heartbeat timeout when
    # the survivor was blocked in a collective or lost the coordinator (process 0).
    assert (
        "error: another process of this run failed or died" in log
        or "This most likely indicates that another task died" in log
    ), log[-2000:]


# Every method of the registry on configs/default.py (2 tasks), run as one process per layout:
# the runs of all methods one after the other in the same launched processes (one start and one
# import each, not 14). The alignment and TII epochs are cut short: the test is about where the
# programs run, not how well they learn.
METHODS_SCRIPT = textwrap.dedent("""
    import importlib.util, json, os, sys
    from aepg_jax.system import hosts
    hosts.initialize(False)
    from aepg_jax import main, methods

    root, overrides = sys.argv[1], json.loads(sys.argv[2])
    spec = importlib.util.spec_from_file_location("default_cfg", "configs/default.py")
    default = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(default)
    for name in methods.NAMES:
        cfg = default.get_config()
        cfg.data.cache_dir = os.path.join(root, "data")
        cfg.update_from_flattened_dict({**overrides, "method.name": name})
        main.execute(cfg, os.path.join(root, name))
""")
METHODS_TINY = {
    "data.num_tasks": 2,
    "max_steps_per_task": 2,
    "log_every_steps": 1,
    "method.slca_ca_epochs": 2,
    "method.slca_ca_samples": 16,
    "method.hide_prompt_ca_epochs": 2,
    "method.hide_prompt_tii_epochs": 2,
    "method.hide_prompt_tap_batch": 16,
    "method.ranpac_m": 256,
}


def _start_methods(root, processes, devices):
    """Every method's run as `processes` x `devices` (`aepg_jax.launch`): the processes."""
    cmd = [sys.executable, "-c", METHODS_SCRIPT, str(root), json.dumps(METHODS_TINY)]
    return launch.start(processes, devices, cmd, log_dir=str(root / "logs"), cwd=REPO)


def _finish(root, procs, layout, deadline):
    """Waits for a launch until `deadline`; fails, never hangs, if it is still running then."""
    while any(p.poll() is None for p in procs) and time.monotonic() < deadline:
        if any(p.poll() not in (None, 0) for p in procs):
            break
        time.sleep(0.2)
    codes = [p.poll() for p in procs]
    hung = None in codes and not any(c not in (None, 0) for c in codes)  # the deadline passed
    if hung:
        launch.stop(procs, grace_s=5.0)
    status = launch.supervise(procs, grace_s=5.0)  # at a failure, stops the others
    logs = "\n".join(p.read_text()[-3000:] for p in sorted((root / "logs").glob("*.log")))
    assert not hung, f"{layout}: still running at the test's time limit\n{logs}"
    assert status == 0, f"{layout}: exit status {status}\n{logs}"


@pytest.mark.slow  # 28 runs of the default config (2 tasks, 2 steps each): compiling dominates
def test_every_method_runs_as_two_processes_like_one_process_with_two_devices(tmp_path):
    """Each method's own host-side programs (class statistics, alignments, solves) run on a
    2-device mesh of one process and across 2 processes, to the same accuracy matrices."""
    # Both layouts at once: 3 processes on the machine's cores, mostly compiling.
    one = _start_methods(tmp_path / "one", processes=1, devices=2)
    two = _start_methods(tmp_path / "two", processes=2, devices=1)
    deadline = time.monotonic() + 2400
    try:
        _finish(tmp_path / "one", one, "1 process x 2 devices", deadline)
        _finish(tmp_path / "two", two, "2 processes x 1 device", deadline)
    finally:
        launch.stop(one + two, grace_s=5.0)  # none left running when a layout failed
    # Equal, not close: both layouts run the same 2-device programs, whose only cross-device
    # step, a 2-way all-reduce, adds a + b the same in either order (measured: equal).
    for name in methods.NAMES:
        a, b = (json.load(open(tmp_path / d / name / "results.json")) for d in ("one", "two"))
        assert a["predictors"] == b["predictors"], name
        for p in a["predictors"]:
            matrices = (a["methods"][p]["accuracy_matrix"], b["methods"][p]["accuracy_matrix"])
            assert matrices[0] == matrices[1], (name, p, matrices)
