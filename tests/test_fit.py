"""A run whose train step cannot fit the device stops before training, in one line."""

from __future__ import annotations

import os
import pathlib
import subprocess
import sys

import pytest
from tiny import child_cpu_seconds, tiny_config, write_spec


def test_a_step_that_cannot_fit_exits_2_in_one_line_before_training(tmp_path):
    # 256 px through patch 4: 4096 tokens; batch 512: attention scores of ~70 GB per block.
    big = {"model.image_size": 256, "data.store_size": 256, "optim.batch_size": 512}
    config = write_spec(tmp_path / "spec.json", tmp_path / "cache", {**big, "data.num_tasks": 2})
    workdir = tmp_path / "w"
    env = {**os.environ, "AEPG_FIT_CHECK": "1", "JAX_PLATFORMS": "cpu"}
    start = child_cpu_seconds()
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
    # 21 s on the idle 2-core machine (2026-11-25); CPU seconds, which load does not stretch.
    assert child_cpu_seconds() - start < 240
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
    start = child_cpu_seconds()
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
    # 6.5 s on the idle 2-core machine (2026-11-26); CPU seconds, which load does not stretch.
    assert child_cpu_seconds() - start < 240
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


def test_data_held_for_a_program_counts_on_top_of_what_it_needs(monkeypatch):
    """`resident` bytes (the scanned program's task data) add to XLA's need; the batch
    estimate scales only the program's own part."""
    import jax
    import jax.numpy as jnp

    from aepg_jax.continual import fit

    monkeypatch.setenv("AEPG_FIT_CHECK", "1")
    x = jnp.zeros((1024, 256), jnp.float32)  # 1 MiB
    compiled = jax.jit(lambda a: a * 2.0).lower(x).compile()
    need = fit.needs(compiled)
    assert need >= 2**20  # the 1 MiB output
    resident = 64 * 2**20
    program = fit.Program(compiled, "optim.batch_size", 64, resident)
    monkeypatch.setattr(fit, "available", lambda: (need + resident, "memory left"))
    fit.check({"the scan": program})  # fits exactly
    monkeypatch.setattr(fit, "available", lambda: (resident + need // 2, "memory left"))
    with pytest.raises(fit.DoesNotFit) as refused:
        fit.check({"the scan": program})
    line = str(refused.value)
    assert "the scan needs" in line and "of it the task's data" in line
    assert "optim.steps_per_call=1" in line and "about 32 would fit" in line
    # Less than the data alone: no batch can help, the data must stay on the host.
    monkeypatch.setattr(fit, "available", lambda: (resident // 2, "memory left"))
    with pytest.raises(fit.DoesNotFit, match=r"holds the task's data .*steps_per_call=1"):
        fit.check({"the scan": program})


@pytest.mark.slow
def test_the_scanned_program_is_checked_with_the_largest_tasks_data(tmp_path, monkeypatch):
    """With `optim.steps_per_call > 1` the fit check measures the scanned program holding the
    largest task's training data (digits in 4 tasks: 430, 436, 288, 283 examples of 16 x 16 x 3
    bytes and an int32 label; every task's data is padded to it), not the single step, and
    that compiled program is the one training runs. ~35 s on 2 cores."""
    from aepg_jax.continual import fit, setup, trainer
    from aepg_jax.continual.programs import build_programs, largest_task

    monkeypatch.setenv("AEPG_FIT_CHECK", "1")
    cfg = tiny_config(tmp_path / "cache", **{"data.num_tasks": 4, "optim.steps_per_call": 4})
    run = setup.build(cfg, str(tmp_path / "run"))
    programs, state = build_programs(run), trainer.begin_task(run, 0, None)
    sizes = [len(t.train_indices) for t in run.data.tasks.tasks]
    assert largest_task(run) == 1 and sizes[1] == 436
    checked = {}
    monkeypatch.setattr(fit, "check", checked.update)
    for start in (0, 2):
        checked.clear()
        fit.check_programs(run, programs, start, state)
        (name,) = [k for k in checked if "train" in k]
        assert name == "the train program scanning task 2's 436 examples"
        program = checked[name]
        assert program.resident == 436 * (16 * 16 * 3 + 4)
        # The executable measured is the one training calls: compiled once, kept.
        (scanned,) = programs.scanned.values()
        assert scanned.executable is program.compiled
        assert programs.evaluate.executable is checked["the evaluation"].compiled
    monkeypatch.undo()
    monkeypatch.setenv("AEPG_FIT_CHECK", "1")
    # Room for the data and no more: the scanned program is refused, naming it and the data.
    monkeypatch.setattr(fit, "available", lambda: (program.resident + 2**10, "memory left"))
    with pytest.raises(fit.DoesNotFit, match=r"^the train program scanning task 2's 436 "):
        fit.check(checked)


def test_the_method_state_held_counts_every_local_shard_on_the_cpu():
    import jax
    import jax.numpy as jnp
    import numpy as np

    from aepg_jax.continual import fit

    mesh = jax.sharding.Mesh(np.array(jax.local_devices()), ("d",))
    replicated = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec())
    tree = {"gram": jax.device_put(jnp.zeros((16, 16)), replicated), "host": np.zeros(99)}
    assert fit.held_bytes(tree) == 16 * 16 * 4 * len(jax.local_devices())
