"""Several processes on one machine, as a multi-host run (`aepg_jax.launch`, `aepg_jax.hosts`).

Each process has its own CPU device(s); JAX joins them over gloo. 2 processes x 1 device must
train exactly like 1 process x 2 devices (same global batch, same mesh size), each process must
read only its slice of every global batch, a run killed mid-task must resume from its Orbax
checkpoint with either process count, and a process that dies alone must stop the others.
"""

import json
import os
import signal
import sys
import textwrap
import time

import numpy as np
import pytest

from aepg_jax import launch
from aepg_jax.data import loader

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

LOADER_SCRIPT = textwrap.dedent("""
    import json, os, sys
    from aepg_jax import hosts
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


def _launch(num_processes, devices, cmd, timeout=300, grace_s=5.0):
    """Runs `cmd` as `num_processes` local processes; the launcher's exit status."""
    procs = launch.start(num_processes, devices, cmd, cwd=REPO)
    deadline = time.monotonic() + timeout
    status = None
    while status is None and time.monotonic() < deadline:
        status = (
            launch.supervise(procs, grace_s) if all(p.poll() is not None for p in procs) else None
        )
        time.sleep(0.1)
    return status


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


def test_launcher_environment_and_statuses():
    env = launch.process_env({"PATH": "/bin"}, 2, 1, 1234, 3)
    assert env["JAX_COORDINATOR_ADDRESS"] == "127.0.0.1:1234"
    assert (env["AEPG_NUM_PROCESSES"], env["AEPG_PROCESS_ID"]) == ("2", "1")
    assert env["JAX_NUM_CPU_DEVICES"] == "3" and env["JAX_PLATFORMS"] == "cpu"
    assert env["JAX_CPU_COLLECTIVES_IMPLEMENTATION"] == "gloo"
    assert "AEPG_PROCESS_ID" not in launch.process_env({}, 1, 0, 1234, 2)  # one process: plain
    assert launch.exit_status(-signal.SIGKILL) == 137 and launch.exit_status(2) == 2
    assert launch.describe(1, 2, -9) == "process 1 of 2 was killed by SIGKILL"
    args, rest = launch.parse(["--num_processes=3", "--", "--config=c.py", "--workdir=w"])
    assert args.num_processes == 3 and rest == ["--config=c.py", "--workdir=w"]
    with pytest.raises(SystemExit, match="after --"):
        launch.parse(["--num_processes=3", "--config=c.py"])


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
