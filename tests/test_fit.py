"""A run whose train step cannot fit the device stops before training, in one line."""

from __future__ import annotations

import os
import pathlib
import subprocess
import sys
import time

from tiny import write_spec


def test_a_step_that_cannot_fit_exits_2_in_one_line_before_training(tmp_path):
    # 256 px through patch 4: 4096 tokens; batch 512: attention scores of ~70 GB per block.
    big = {"model.image_size": 256, "data.store_size": 256, "optim.batch_size": 512}
    config = write_spec(tmp_path / "spec.json", tmp_path / "cache", {**big, "data.num_tasks": 2})
    workdir = tmp_path / "w"
    env = {**os.environ, "AEPG_FIT_CHECK": "1", "JAX_PLATFORMS": "cpu"}
    start = time.time()
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "aepg_jax.main",
            f"--config={config}",
            f"--workdir={workdir}",
        ],
        capture_output=True,
        text=True,
        env=env,
        cwd=pathlib.Path(__file__).resolve().parents[1],
        timeout=300,
    )
    assert proc.returncode == 2, proc.stderr[-2000:]
    # 21 s on the idle 2-core machine (2026-11-25); the bound leaves room for a loaded one.
    assert time.time() - start < 240
    lines = [ln for ln in proc.stderr.splitlines() if ln.startswith("error:")]
    assert len(lines) == 1 and "Traceback" not in proc.stderr, proc.stderr[-2000:]
    assert "need" in lines[0] and "GiB" in lines[0] and "--max_batch" in lines[0]
    assert "optim.batch_size" in lines[0]
    assert (
        not (workdir / "metrics.jsonl").exists()
        or "train" not in (workdir / "metrics.jsonl").read_text()
    )


def test_a_mistyped_image_size_stops_in_seconds_before_any_cache(tmp_path):
    """`model.image_size=2044` (for 224): refused from the config, nothing cached."""
    cache = tmp_path / "cache"
    start = time.time()
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "aepg_jax.main",
            "--config=configs/default.py",
            f"--workdir={tmp_path / 'w'}",
            "--config.model.image_size=2044",
            "--config.data.store_size=2044",
            f"--config.data.cache_dir={cache}",
        ],
        capture_output=True,
        text=True,
        env={**os.environ, "AEPG_FIT_CHECK": "1", "JAX_PLATFORMS": "cpu"},
        cwd=pathlib.Path(__file__).resolve().parents[1],
        timeout=300,
    )
    assert proc.returncode == 2, proc.stderr[-2000:]
    # 6.5 s on the idle 2-core machine (2026-11-26); the bound leaves room for a loaded one.
    assert time.time() - start < 240
    lines = [ln for ln in proc.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: model.image_size=2044 "), lines
    assert "optim.batch_size" in lines[0] and "GiB" in lines[0]
    assert not cache.exists() or not any(cache.iterdir())


def test_a_cache_the_disk_cannot_hold_is_refused_before_a_byte(tmp_path, monkeypatch):
    import numpy as np
    import pytest

    from aepg_jax.data import cache

    class Source:
        labels = np.zeros(1000, np.int32)

        def __len__(self):
            return 1000

        def image(self, i):
            raise AssertionError("nothing is decoded")

    monkeypatch.setattr(cache, "_free_bytes", lambda path: 10 * 2**20)  # 10 MiB free
    with pytest.raises(cache.CacheTooLarge, match=r"needs 0\.2 GiB in .*, 0\.0 GiB are free"):
        cache.load_or_build(Source(), str(tmp_path / "c"), "toy", "train", 256)
    assert not (tmp_path / "c").exists()


def test_the_memory_left_sees_a_real_cgroup_limit(tmp_path):
    """A child process in a memory cgroup of 1 GiB that this test creates (v1 or v2, as root)
    sees at most 1 GiB left; skipped with the reason where no cgroup can be made."""
    import pytest

    name = f"aepg-fit-test-{os.getpid()}"
    for base, limit_file in (
        ("/sys/fs/cgroup/memory", "memory.limit_in_bytes"),
        ("/sys/fs/cgroup", "memory.max"),
    ):
        group = pathlib.Path(base) / name
        try:
            group.mkdir()
            (group / limit_file).write_text(str(2**30))
        except OSError:
            if group.exists():
                group.rmdir()
            continue
        break
    else:
        pytest.skip("no memory cgroup can be created here (needs root and a cgroup fs)")
    code = "from aepg_jax.system import host_memory; print(host_memory.available())"
    try:
        proc = subprocess.run(
            [
                "sh",
                "-c",
                f'echo $$ > {group / "cgroup.procs"} && exec "$0" -c "$1"',
                sys.executable,
                code,
            ],
            capture_output=True,
            text=True,
            timeout=120,
            cwd=pathlib.Path(__file__).resolve().parents[1],
        )
    finally:
        group.rmdir()
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert 0 < int(proc.stdout.strip()) <= 2**30
