"""End-to-end tests of the from-scratch trainer (aepg_jax/scratch) on a tiny ResNet.

Runs use scikit-learn's digits at 8 px (or a tiny CIFAR written as array_record by the test),
a bottleneck ResNet of width 4 and a few steps per epoch. A run killed with SIGKILL and resumed
ends exactly like an uninterrupted one; 8 forced CPU devices match one device; seed i of a
vmapped multi-seed run matches the single run of that seed.
"""

import io
import json
import os
import shutil
import signal
import subprocess
import sys
import textwrap
import time
import types

import numpy as np
import pytest
import tensorflow_datasets as tfds
from PIL import Image
from test_tensorboard import _events
from tiny import apply_overrides

from aepg_jax import main
from aepg_jax.config import schema
from aepg_jax.scratch import config as scratch_config
from aepg_jax.scratch import data as scratch_data
from aepg_jax.scratch import trainer

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CURVES = ("train_loss", "train_acc", "train_entropy", "test_acc", "test_entropy")


def tiny_config(cache_dir, **overrides):
    c = scratch_config.base_config("resnet_small")
    c.model.update(dict(block="basic", stage_sizes=(1,), width=4))
    c.data.update(dict(source="digits", name="digits", image_size=8, pad=1))
    c.data.cache_dir = str(cache_dir)
    c.optim.update(dict(batch_size=64, epochs=3, milestones=(2,), learning_rate=0.05))
    c.max_steps_per_epoch = 3
    c.log_every_steps = 2
    c.eval.batch_size = 128
    c.checkpoint_every_epochs = 1
    return apply_overrides(c, overrides)


def _records(path, kind):
    return [r for r in map(json.loads, open(path)) if r["type"] == kind]


def test_runs_end_to_end_and_writes_its_reports(tmp_path):
    cfg = tiny_config(tmp_path / "cache", **{"loss.alpha": 0.2})
    results = trainer.run(cfg, str(tmp_path / "run"))
    saved = json.load(open(tmp_path / "run" / "results.json"))
    assert saved["final_test_acc"] == pytest.approx(results["final_test_acc"])
    assert saved["epochs"] == [1, 2, 3] and saved["steps_per_epoch"] == 3
    for key in CURVES:
        assert len(saved[key]) == 3 and all(np.isfinite(saved[key])), key
    assert saved["train_loss"][-1] < saved["train_loss"][0]  # it learns (9 steps: no more)
    assert 0 < saved["final_test_entropy"] < np.log(10)
    assert saved["config"]["loss"]["alpha"] == 0.2 and saved["train_examples"] == 1437
    assert saved["environment"]["jaxlib"] and saved["environment"]["cpu_model"]
    assert (tmp_path / "run" / "curves.png").read_bytes()[:4] == b"\x89PNG"
    train = _records(tmp_path / "run" / "metrics.jsonl", "train")
    epochs = _records(tmp_path / "run" / "metrics.jsonl", "epoch")
    assert [r["step"] for r in train] == [2, 3, 4, 6, 8, 9]  # every 2 steps and epoch ends
    assert [r["alpha"] for r in train] == [0.2] * 6  # mix logs its constant, not a schedule
    assert [r["lr"] for r in train] == pytest.approx([0.05] * 4 + [0.005] * 2)  # milestone 2
    assert [r["epoch"] for r in epochs] == [0, 1, 2] and [r["step"] for r in epochs] == [3, 6, 9]
    assert sorted(os.listdir(tmp_path / "run" / "checkpoints")) == ["3", "6", "9"]
    # The TensorBoard event file holds the same train losses (float32).
    events = _events(str(tmp_path / "run"))
    assert [e.step for e in events.Scalars("train/loss")] == [r["step"] for r in train]
    assert [e.value for e in events.Scalars("train/loss")] == pytest.approx(
        [r["loss"] for r in train], rel=1e-6
    )
    # Lose the last checkpoint and the results (a crash in epoch 3): the re-run resumes from
    # epoch 2's checkpoint (BN statistics, momentum, step, RNG) and ends bit-identically.
    shutil.rmtree(tmp_path / "run" / "checkpoints" / "9")
    os.remove(tmp_path / "run" / "results.json")
    resumed = trainer.run(cfg, str(tmp_path / "run"))
    for key in CURVES:
        assert resumed[key] == results[key], key
    # A re-run of the finished run trains nothing, reports the same and keeps its results.json
    # byte for byte (its wall time included).
    written = (tmp_path / "run" / "results.json").read_bytes()
    again = trainer.run(cfg, str(tmp_path / "run"))
    assert (tmp_path / "run" / "results.json").read_bytes() == written
    assert again["test_acc"] == results["test_acc"]
    # Epoch 3 trained twice, recorded once: the resume dropped what followed checkpoint 6.
    again_train = _records(tmp_path / "run" / "metrics.jsonl", "train")
    assert [r["step"] for r in again_train] == [r["step"] for r in train]
    assert [r["loss"] for r in again_train] == [r["loss"] for r in train]
    assert [r["step"] for r in _records(tmp_path / "run" / "metrics.jsonl", "epoch")] == [3, 6, 9]


def test_vmapped_seeds_match_single_runs_and_aepg_anneals_over_the_run(tmp_path):
    over = {"optim.epochs": 2, "loss.name": "aepg", "log_every_steps": 1}
    summary = trainer.run(tiny_config(tmp_path / "c", num_seeds=2, **over), str(tmp_path / "m"))
    assert summary["seeds"] == [0, 1]
    assert (tmp_path / "m" / "results_seeds.json").exists()
    single = trainer.run(tiny_config(tmp_path / "c", seed=1, **over), str(tmp_path / "s1"))
    seed1 = json.load(open(tmp_path / "m" / "seed_1" / "results.json"))
    for key in CURVES:
        np.testing.assert_allclose(seed1[key], single[key], rtol=1e-4, atol=1e-4, err_msg=key)
    assert seed1["config"] == single["config"]
    assert summary["metrics"]["final_test_acc"]["values"][1] == seed1["final_test_acc"]
    # aEPG: alpha_t = sigmoid(6 (T - 2t) / T) over all T = 6 steps of the run, not per epoch.
    alphas = [r["alpha"] for r in _records(tmp_path / "s1" / "metrics.jsonl", "train")]
    expected = [1 / (1 + np.exp(-6 * (6 - 2 * t) / 6)) for t in range(6)]
    np.testing.assert_allclose(alphas, expected, rtol=1e-5)


def test_validation_errors_name_the_field(tmp_path):
    cfg = tiny_config(
        tmp_path,
        **{"optim.milestones": (225, 150), "loss.alpha": 1.5, "model.block": "wide"},
    )
    with pytest.raises(ValueError) as err:
        scratch_config.validate(cfg)
    text = str(err.value)
    assert "optim.milestones=(225, 150) must be increasing" in text
    assert "alpha=1.5 is invalid" in text and "model.block='wide'" in text
    with pytest.raises(ValueError, match=r"optim.batch_size=64 must be a positive multiple"):
        scratch_config.validate(tiny_config(tmp_path), num_devices=3)
    with pytest.raises(ValueError, match=r"fewer than optim.batch_size=5000"):
        trainer.run(tiny_config(tmp_path, **{"optim.batch_size": 5000}), str(tmp_path / "r"))


def test_main_dispatches_on_the_trainer_field(tmp_path):
    assert main.select_trainer(tiny_config(tmp_path)) == (scratch_config.validate, trainer.run)
    continual = schema.base_config("vit_tiny")
    assert main.select_trainer(continual) == (schema.validate, main.continual_trainer.run)
    continual.trainer = "gan"
    with pytest.raises(
        ValueError, match=r"trainer='gan' is unknown; use one of continual, scratch"
    ):
        main.select_trainer(continual)


def _write_cifar(data_dir, dataset, sizes):
    """A tiny real `cifar10` / `cifar100` in array_record format (PNG bytes: no TensorFlow)."""
    rng = np.random.default_rng(0)
    written = {s: rng.integers(0, 256, (n, 32, 32, 3), dtype=np.uint8) for s, n in sizes.items()}
    base = {
        "cifar10": tfds.image_classification.Cifar10,
        "cifar100": tfds.image_classification.Cifar100,
    }[dataset]

    def examples(split):
        for i, image in enumerate(written[split]):
            buffer = io.BytesIO()
            Image.fromarray(image).save(buffer, format="png")
            record = {"id": f"{split}_{i}", "image": buffer.getvalue(), "label": i % 10}
            if dataset == "cifar100":
                record["coarse_label"] = i % 20
            yield i, record

    class TinyCifar(base, skip_registration=True):
        name = dataset

        def _split_generators(self, dl_manager):
            return {split: examples(split) for split in sizes}

    TinyCifar(data_dir=os.fspath(data_dir), file_format="array_record").download_and_prepare()
    return written


@pytest.mark.parametrize("name", ["cifar10", "cifar100"])
def test_tfds_cifar_from_array_record_trains(tmp_path, name):
    written = _write_cifar(tmp_path / "tfds", name, {"train": 40, "test": 12})
    cfg = tiny_config(
        tmp_path / "cache",
        **{
            "data.source": "tfds",
            "data.name": name,
            "data.data_dir": str(tmp_path / "tfds"),
            "data.image_size": 32,
            "data.pad": 4,
            "optim.batch_size": 16,
            "optim.epochs": 1,
            "max_steps_per_epoch": 2,
        },
    )
    data = scratch_data.prepare_data(cfg)
    assert data.num_classes == (10 if name == "cifar10" else 100)
    assert data.train.images.shape == (40, 32, 32, 3) and len(data.test) == 12
    pixels = written["train"].reshape(-1, 3) / 255.0
    np.testing.assert_allclose(data.mean, pixels.mean(0), rtol=1e-9)
    np.testing.assert_allclose(data.std, pixels.std(0), rtol=1e-9)
    if name == "cifar10":  # one run is enough to show the data reach the trainer
        results = trainer.run(cfg, str(tmp_path / "run"))
        assert results["num_classes"] == 10 and len(results["test_acc"]) == 1


def test_compare_scratch_overlays_groups_of_seeds(tmp_path, capsys, monkeypatch):
    monkeypatch.syspath_prepend(os.path.join(REPO, "scripts"))
    import compare_scratch

    def fake(directory, alpha, seed, acc):
        config = {"seed": seed, "loss": {"name": "mix", "alpha": alpha}}
        curves = {k: [1.0, 2.0] for k in CURVES} | {"test_acc": [acc / 2, acc]}
        final = {"final_test_acc": acc, "best_test_acc": acc, "final_test_entropy": 0.5}
        run = {"config": config, "seed": seed, "epochs": [1, 2], **curves, **final}
        os.makedirs(directory)
        json.dump(run, open(os.path.join(directory, "results.json"), "w"))

    fake(tmp_path / "a0-s0", 0.0, 0, 10.0)
    fake(tmp_path / "a0-s1", 0.0, 1, 20.0)
    fake(tmp_path / "a1-s0", 1.0, 0, 50.0)
    out = tmp_path / "fig.png"
    groups = compare_scratch.main([*map(str, sorted(tmp_path.glob("a*"))), "--out", str(out)])
    assert {k: len(v) for k, v in groups.items()} == {
        "name=mix / alpha=0.0": 2,
        "name=mix / alpha=1.0": 1,
    }
    printed = capsys.readouterr().out
    assert "15.000 +- 7.071" in printed and "50.000 (1 seed)" in printed
    assert out.read_bytes()[:4] == b"\x89PNG"


RUN_SCRIPT = textwrap.dedent("""
    import json, sys, pathlib
    sys.path.insert(0, {tests!r})
    from test_scratch import tiny_config
    from aepg_jax.scratch import trainer
    cfg = tiny_config(pathlib.Path(sys.argv[1]), **json.loads(sys.argv[3]))
    trainer.run(cfg, sys.argv[2])
""")


def _run_subprocess(cache, workdir, overrides, env=None, wait=True):
    script = RUN_SCRIPT.format(tests=os.path.join(REPO, "tests"))
    cmd = [sys.executable, "-c", script, str(cache), str(workdir), json.dumps(overrides)]
    env = dict(os.environ, **(env or {}))
    if wait:
        return subprocess.run(
            cmd, env=env, cwd=REPO, capture_output=True, text=True, timeout=600, check=True
        )
    return subprocess.Popen(
        cmd, env=env, cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )


@pytest.mark.slow  # three subprocesses (~70 s on 2 cores); CI resumes in-process above
def test_sigkill_then_resume_matches_an_uninterrupted_run(tmp_path):
    overrides = {"optim.epochs": 5, "loss.name": "mix", "loss.alpha": 0.5}
    cache = tmp_path / "cache"
    _run_subprocess(cache, tmp_path / "straight", overrides)
    reference = json.load(open(tmp_path / "straight" / "results.json"))

    killed = tmp_path / "killed"
    proc = _run_subprocess(cache, killed, overrides, wait=False)
    deadline = time.time() + 300
    while time.time() < deadline and proc.poll() is None:  # kill after epoch 2's checkpoint
        ckpts = killed / "checkpoints"
        if ckpts.exists() and any(s.isdigit() and int(s) >= 6 for s in os.listdir(ckpts)):
            break
        time.sleep(0.05)
    assert proc.poll() is None, "the run finished before it could be killed"
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    assert not (killed / "results.json").exists()

    _run_subprocess(cache, killed, overrides)  # resume
    resumed = json.load(open(killed / "results.json"))
    for key in CURVES:
        assert resumed[key] == reference[key], key  # bit-identical, BN state and momentum too
    steps = {r["step"]: r["loss"] for r in _records(killed / "metrics.jsonl", "train")}
    ref = {r["step"]: r["loss"] for r in _records(tmp_path / "straight" / "metrics.jsonl", "train")}
    assert steps == ref


def test_8_devices_match_one_device(tmp_path):
    """Sharded batch, replicated state, plain jit: BatchNorm over the global batch (sync-BN).

    This process (one CPU device) against a subprocess with 8 forced CPU devices.
    """
    overrides = {"optim.epochs": 2, "num_seeds": 2}
    one = trainer.run(tiny_config(tmp_path / "cache", **overrides), str(tmp_path / "d1"))
    env = {"XLA_FLAGS": "--xla_force_host_platform_device_count=8", "JAX_PLATFORMS": "cpu"}
    _run_subprocess(tmp_path / "cache", tmp_path / "d8", overrides, env=env)
    eight = json.load(open(tmp_path / "d8" / "results_seeds.json"))
    assert eight["per_seed"][0]["num_devices"] == 8
    for a, b in zip(one["per_seed"], eight["per_seed"], strict=True):
        for key in CURVES:
            np.testing.assert_allclose(b[key], a[key], rtol=1e-4, atol=1e-3, err_msg=key)


def test_a_diverged_epoch_is_flagged():
    """At lr 1e30 the loss stays finite (~4e27) at chance accuracy: flagged as divergence, as
    a NaN is (the record of an epoch, on a stand-in for the run's seeds and classes)."""
    loss = np.array([2.0, 231.0, np.nan, np.inf])
    assert trainer.diverged(loss, 10).tolist() == [False, True, True, True]  # 100 ln 10 = 230
    run = types.SimpleNamespace(seeds=(3, 4), data=types.SimpleNamespace(num_classes=10))
    train = {"train_loss": np.array([1.2, 4.2e27])}
    with pytest.raises(FloatingPointError, match=r"diverged in epoch 2 \(seed 4\): loss 4\.2e\+27"):
        trainer._Run.record_epoch(run, 1, train, {})


@pytest.mark.slow  # a real run (~9 s on 2 loaded cores); the flag itself is tested above
def test_a_diverged_run_is_stopped_naming_the_learning_rate(tmp_path):
    cfg = tiny_config(tmp_path / "cache", **{"optim.learning_rate": 1e30, "optim.epochs": 1})
    cfg.optim.milestones = ()
    with pytest.raises(FloatingPointError, match=r"Training diverged in epoch 1 \(seed 0\)"):
        trainer.run(cfg, str(tmp_path / "run"))
    assert not (tmp_path / "run" / "results.json").exists()
