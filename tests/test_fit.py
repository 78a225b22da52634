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
    assert "needs" in lines[0] and "GiB" in lines[0] and "--max_batch" in lines[0]
    assert "optim.batch_size" in lines[0]
    assert (
        not (workdir / "metrics.jsonl").exists()
        or "train" not in (workdir / "metrics.jsonl").read_text()
    )
