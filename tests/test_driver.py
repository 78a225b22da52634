"""End-to-end tests of the continual driver on a tiny ViT and scikit-learn's digits.

Runs are tiny (depth 2, width 32, 16 px, a few steps per task) so the whole file stays within
CI's budget; a run killed with SIGKILL and resumed must end with the same results as an
uninterrupted one, and a run sharded over 8 CPU devices must match the 1-device run.
"""

import json
import logging
import math
import os
import signal
import subprocess
import sys
import textwrap
import time

import numpy as np
import pytest
from tiny import tiny_config

from aepg_jax import main
from aepg_jax.config import schema
from aepg_jax.continual import trainer
from aepg_jax.data import loader
from aepg_jax.evaluate import evaluate
from aepg_jax.pretraining import pretrain
from aepg_jax.runs import checkpointing, predictions

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _read_jsonl(path):
    return [json.loads(line) for line in open(path)]


@pytest.mark.parametrize(
    "method,loss,peft",
    [
        # LoRA + aEPG + LAE runs end to end in CI as test_default_config_runs_offline.
        pytest.param("lae", "aepg", "lora", marks=pytest.mark.slow),
        # CI runs these PEFT kinds and methods in test_paper_config_runs_at_tiny_shape.
        pytest.param("lwf", "focal", "adapter", marks=pytest.mark.slow),
        pytest.param("plain", "ce", "prefix", marks=pytest.mark.slow),
    ],
)
def test_runs_end_to_end(tmp_path, method, loss, peft):
    cfg = tiny_config(
        tmp_path / "cache", **{"method.name": method, "loss.name": loss, "model.peft.kind": peft}
    )
    workdir = tmp_path / "run"
    results = trainer.run(cfg, str(workdir))

    saved = json.load(open(workdir / "results.json"))
    assert saved["A_T"] == pytest.approx(results["A_T"])
    for key in (
        "config",
        "accuracy_matrix",
        "A_T",
        "avg_inc_acc",
        "forgetting",
        "acc_pooled",
        "wall_time_s",
        "methods",
        "entropy",
    ):
        assert key in saved, key
    matrix = np.array(saved["accuracy_matrix"], dtype=float)
    assert matrix.shape == (3, 3)
    assert np.all(np.isnan(matrix[np.tril_indices(3, -1)]))  # not evaluated before learned
    assert np.all(np.isfinite(matrix[np.triu_indices(3)]))
    assert matrix[0, 0] > 100 / 4 + 5  # above chance on task 0's 4 classes after 8 steps
    expected = ["ensemble", "online", "offline"] if method == "lae" else ["model"]
    assert saved["predictors"] == expected
    pngs = ("accuracy_matrix.png", "training_curves.png", "incremental_accuracy.png")
    for png in (*pngs, "reliability.png"):
        assert (workdir / png).read_bytes()[:4] == b"\x89PNG"
    # Every evaluation's predictions are kept: the metrics recomputed from them alone equal
    # results.json's; calibration is recorded per predictor after each task.
    assert saved["predictions"]["sha256"] == predictions.sha256(workdir / predictions.FILE)
    assert evaluate.main([str(workdir)]) == 0
    recomputed = json.load(open(workdir / evaluate.OUT_FILE))
    assert recomputed["differs_from_results"] == []
    for p in expected:
        assert recomputed["methods"][p]["A_T"] == saved["methods"][p]["A_T"]
        scores = saved["methods"][p]
        if "calibration_note" in scores:  # LAE's ensemble: scores, not probabilities
            assert set(scores["ece"]) == set(scores["nll"]) == {None}
        else:
            assert all(0 <= e <= 100 for e in scores["ece"])
            assert all(n > 0 for n in scores["nll"])

    records = _read_jsonl(workdir / "metrics.jsonl")
    train = [r for r in records if r["type"] == "train"]
    evals = [r for r in records if r["type"] == "eval"]
    assert [e["task"] for e in evals] == [0, 1, 2]
    assert {r["task"] for r in train} == {0, 1, 2}
    assert all(np.isfinite(r["loss"]) and r["images_per_s"] > 0 for r in train)
    # Tasks >= 1 start head-only (peft frozen for the first half of their steps).
    assert next(r["train_peft"] for r in train if r["task"] == 1) is False
    assert next(r["train_peft"] for r in train if r["task"] == 0) is True
    if loss == "aepg":
        alphas = [r["alpha"] for r in train if r["task"] == 1]
        assert alphas == sorted(alphas, reverse=True) and alphas[0] > 0.9


def test_rerun_of_a_finished_run_resumes_without_training(tmp_path, capsys):
    cfg = tiny_config(tmp_path / "cache", **{"data.num_tasks": 2, "max_steps_per_task": 2})
    first = trainer.run(cfg, str(tmp_path / "run"))
    lines = len(_read_jsonl(tmp_path / "run" / "metrics.jsonl"))
    written = (tmp_path / "run" / "results.json").read_bytes()
    (tmp_path / "run" / "accuracy_matrix.png").unlink()
    capsys.readouterr()
    again = trainer.run(cfg, str(tmp_path / "run"))
    out = capsys.readouterr()
    assert "is finished (2 tasks)" in out.out + out.err and "resuming" not in out.out + out.err
    assert again["accuracy_matrix"] == first["accuracy_matrix"]
    assert len(_read_jsonl(tmp_path / "run" / "metrics.jsonl")) == lines  # nothing retrained
    # The finished run's results.json (its compile figures, wall time) stays byte for byte;
    # the reports beside it are made again.
    assert (tmp_path / "run" / "results.json").read_bytes() == written
    assert again["compilations"] == json.loads(written)["compilations"]
    assert (tmp_path / "run" / "accuracy_matrix.png").read_bytes()[:4] == b"\x89PNG"


def test_other_config_in_existing_workdir_is_refused(tmp_path):
    cfg = tiny_config(tmp_path / "cache")
    main.check_or_save_config(cfg, str(tmp_path / "run"))
    main.check_or_save_config(cfg, str(tmp_path / "run"))  # same config: fine (resume)
    os.makedirs(tmp_path / "run" / "checkpoints" / "8")  # the run has a checkpoint
    other = tiny_config(tmp_path / "cache", **{"loss.name": "ce"})
    with pytest.raises(ValueError, match=r"another config \(differs in: loss.name\)"):
        main.check_or_save_config(other, str(tmp_path / "run"))


def test_a_workdir_saved_before_the_trainer_field_is_refused(tmp_path):
    """A config.json without `trainer` / `tensorboard` (aepg_jax <= commit 67ddf42 read it as
    continual / True): a run with a checkpoint is refused naming that commit; a failed start
    (no checkpoint) gets the current config."""
    cfg = tiny_config(tmp_path / "cache")
    run = tmp_path / "run"
    main.check_or_save_config(cfg, str(run))
    saved = json.loads((run / "config.json").read_text())
    del saved["trainer"], saved["tensorboard"]
    (run / "config.json").write_text(json.dumps(saved))
    os.makedirs(run / "checkpoints" / "8")
    with pytest.raises(ValueError) as err:
        main.check_or_save_config(cfg, str(run))
    assert str(err.value) == (
        f"{run} holds a run of aepg_jax <= commit 67ddf42 (its config.json has no trainer or "
        "tensorboard); resume it with that version (git checkout 67ddf42) or use a new --workdir."
    )
    os.rmdir(run / "checkpoints" / "8")
    main.check_or_save_config(cfg, str(run))
    assert json.loads((run / "config.json").read_text())["trainer"] == "continual"


def test_validation_errors_are_actionable(tmp_path):
    cfg = tiny_config(tmp_path / "cache", **{"data.num_tasks": 11})
    with pytest.raises(ValueError, match=r"data.num_tasks=11 exceeds the dataset's 10 classes"):
        trainer.run(cfg, str(tmp_path / "run"))
    cfg = tiny_config(tmp_path / "cache", **{"optim.batch_size": 1000})
    with pytest.raises(ValueError, match=r"fewer than optim\.batch_size=1000"):
        trainer.run(cfg, str(tmp_path / "run2"))
    cfg = tiny_config(tmp_path / "cache", **{"method.name": "ewc", "loss.name": "xent"})
    with pytest.raises(ValueError, match=r"(?s)Unknown loss 'xent'.*method.name='ewc'"):
        schema.validate(cfg)


def test_non_finite_loss_stops_the_run_with_its_step(tmp_path):
    cfg = tiny_config(
        tmp_path / "cache",
        **{
            "optim.learning_rate": 1e30,
            "data.num_tasks": 2,
            "loss.name": "ce",
            "log_every_steps": 1,
        },
    )
    with pytest.raises(
        FloatingPointError,
        match=r"Non-finite loss in task \d at global step "
        r"\d+\. Last good checkpoint",
    ):
        trainer.run(cfg, str(tmp_path / "run"))


def _corrupt_arrays(step_dir):
    """Overwrites the array data files of a saved checkpoint (metadata left intact)."""
    damaged = 0
    for root, _, files in os.walk(step_dir / "state"):
        for f in files:
            if not f.endswith(".json") and "metadata" not in f:
                with open(os.path.join(root, f), "wb") as fh:
                    fh.write(b"garbage")
                damaged += 1
    assert damaged


def test_corrupt_latest_checkpoint_falls_back_to_the_previous(tmp_path, caplog):
    ckpt = checkpointing.Checkpointer(str(tmp_path / "ckpt"))
    for step in (1, 2):
        meta = {"task": 0, "phase": "in_task", "step": step}
        ckpt.save(step, {"state": {"w": np.arange(3.0) * step}}, meta)
    ckpt.close()
    _corrupt_arrays(tmp_path / "ckpt" / "2")
    ckpt = checkpointing.Checkpointer(str(tmp_path / "ckpt"))
    with caplog.at_level(logging.WARNING):
        items, meta = ckpt.restore_latest(lambda meta: {"state": {"w": np.zeros(3)}})
    assert meta["step"] == 1
    np.testing.assert_array_equal(items["state"]["w"], np.arange(3.0))
    assert "cannot be restored" in caplog.text
    ckpt.close()


def test_no_restorable_checkpoint_is_an_error_not_a_fresh_start(tmp_path):
    ckpt = checkpointing.Checkpointer(str(tmp_path / "ckpt"))
    ckpt.save(1, {"state": {"w": np.arange(3.0)}}, {"task": 0, "phase": "in_task"})
    ckpt.close()
    _corrupt_arrays(tmp_path / "ckpt" / "1")
    ckpt = checkpointing.Checkpointer(str(tmp_path / "ckpt"))
    expected = r"none of the checkpoints in .* can be restored \(1 \("
    with pytest.raises(checkpointing.NoRestorableCheckpoint, match=expected):
        ckpt.restore_latest(lambda meta: {"state": {"w": np.zeros(3)}})
    ckpt.close()


RUN_SCRIPT = textwrap.dedent("""
    import json, sys, pathlib
    sys.path.insert(0, {tests!r})
    from test_driver import tiny_config
    from aepg_jax.continual import trainer
    overrides = json.loads(sys.argv[3])
    cfg = tiny_config(pathlib.Path(sys.argv[1]), **overrides)
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


@pytest.mark.slow  # CI: resume in tests/test_multiseed.py, fallback in test_integrity
@pytest.mark.parametrize(
    "method", ["lae", "l2p", "dualprompt", "coda_prompt", "inflora", "ease", "sd_lora"]
)
def test_sigkill_mid_task_then_resume_matches_an_uninterrupted_run(tmp_path, method):
    overrides = {
        # The tiny ViT has 2 blocks: DualPrompt's e-prompts (blocks 2-4 by default) go on block 1.
        **({"method.dualprompt_e_blocks": (1,)} if method == "dualprompt" else {}),
        "method.name": method,
        "loss.name": "aepg",
        "checkpoint_every_steps": 2,
        "max_steps_per_task": 10,
    }
    cache = tmp_path / "cache"
    _run_subprocess(cache, tmp_path / "straight", overrides)
    reference = json.load(open(tmp_path / "straight" / "results.json"))

    killed = tmp_path / "killed"
    proc = _run_subprocess(cache, killed, overrides, wait=False)
    deadline = time.time() + 300
    # Kill once a mid-task checkpoint of task 1 exists (global steps 10..19 are task 1).
    while time.time() < deadline and proc.poll() is None:
        steps = (
            [int(s) for s in os.listdir(killed / "checkpoints") if s.isdigit()]
            if (killed / "checkpoints").exists()
            else []
        )
        if any(12 <= s < 20 for s in steps):
            break
        time.sleep(0.05)
    assert proc.poll() is None, "the run finished before it could be killed"
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    assert not (killed / "results.json").exists()

    _run_subprocess(cache, killed, overrides)  # resume
    resumed = json.load(open(killed / "results.json"))
    assert resumed["accuracy_matrix"] == reference["accuracy_matrix"]
    for p in reference["predictors"]:
        assert resumed["methods"][p]["A_T"] == reference["methods"][p]["A_T"]
    if "entropy_note" in reference:  # EASE, RanPAC, SimpleCIL: scores, no entropy logged
        assert resumed["entropy"] == reference["entropy"]
    else:
        np.testing.assert_allclose(resumed["entropy"], reference["entropy"], rtol=1e-6)
    steps = {
        r["step"]: r["loss"] for r in _read_jsonl(killed / "metrics.jsonl") if r["type"] == "train"
    }
    ref_steps = {
        r["step"]: r["loss"]
        for r in _read_jsonl(tmp_path / "straight" / "metrics.jsonl")
        if r["type"] == "train"
    }
    assert steps.keys() == ref_steps.keys()
    np.testing.assert_allclose(
        [steps[k] for k in sorted(steps)], [ref_steps[k] for k in sorted(ref_steps)], rtol=1e-5
    )


@pytest.mark.slow  # two subprocess runs (~90 s on 2 cores); CI: loader and scratch 8-device tests
def test_sharded_over_8_devices_matches_one_device(tmp_path):
    overrides = {
        "method.name": "lae",
        "loss.name": "aepg",
        "data.num_tasks": 2,
        "max_steps_per_task": 6,
    }
    cache = tmp_path / "cache"
    results = {}
    for devices in (1, 8):
        env = {
            "XLA_FLAGS": f"--xla_force_host_platform_device_count={devices}",
            "JAX_PLATFORMS": "cpu",
        }
        _run_subprocess(cache, tmp_path / f"d{devices}", overrides, env=env)
        results[devices] = json.load(open(tmp_path / f"d{devices}" / "results.json"))
    assert results[8]["accuracy_matrix"] == results[1]["accuracy_matrix"]
    losses = {
        d: [
            r["loss"]
            for r in _read_jsonl(tmp_path / f"d{d}" / "metrics.jsonl")
            if r["type"] == "train"
        ]
        for d in (1, 8)
    }
    np.testing.assert_allclose(losses[8], losses[1], rtol=1e-4, atol=1e-5)


def _config_file(filename, arg=None):
    return schema.from_file(os.path.join(REPO, "configs", filename), arg)


def test_default_config_runs_offline(tmp_path):
    """configs/default.py as shipped, shortened: pretraining on digits, 2 steps per task."""
    cfg = _config_file("default.py")
    cfg.data.cache_dir = str(tmp_path / "cache")
    cfg.pretrain.cache_dir = str(tmp_path / "cache" / "pretrained")
    cfg.pretrain.dataset = "digits"  # Fashion-MNIST may be absent on a CI machine
    cfg.pretrain.epochs = 1
    cfg.data.num_tasks = 2
    cfg.max_steps_per_task = 2
    results = trainer.run(cfg, str(tmp_path / "run"))
    assert len(results["accuracy_matrix"]) == 2 and results["predictors"][0] == "ensemble"
    # Task-incremental accuracy (argmax over the task's own classes) can only be higher.
    ci, ti = results["accuracy_matrix"], results["task_incremental_matrix"]
    assert all(ti[i][j] >= ci[i][j] for i in range(2) for j in range(i, 2))
    assert results["class_order"] == list(range(10)) and results["bwt"] is not None
    # The pretrained backbone is cached and reused, not trained again.
    files = [f for f in os.listdir(cfg.pretrain.cache_dir) if f.endswith(".npz")]
    assert len(files) == 1
    path = os.path.join(cfg.pretrain.cache_dir, files[0])
    stamp = os.path.getmtime(path)
    assert pretrain.pretrain_backbone(cfg, loader.data_mesh()) == path
    assert os.path.getmtime(path) == stamp


@pytest.mark.parametrize(
    "filename,arg",
    [
        ("imagenet_r.py", "tasks=5,peft=adapter,loss=ce,method=lwf"),
        ("clrs25.py", "peft=prefix,loss=aepg,method=lae"),
        pytest.param(  # lora, plain and mix run end to end elsewhere in CI
            "food101.py", "peft=lora,loss=mix,alpha=0.2,method=plain", marks=pytest.mark.slow
        ),
    ],
)
def test_paper_config_runs_at_tiny_shape(tmp_path, filename, arg):
    """A paper config's method/loss/PEFT/schedule settings, on offline digits and a tiny ViT."""
    cfg = _config_file(filename, arg)
    tiny = tiny_config(tmp_path / "cache")
    kept = (cfg.method.to_dict(), cfg.loss.to_dict(), cfg.schedule.to_dict(), cfg.model.peft.kind)
    cfg.data = tiny.data
    cfg.data.num_tasks = 2
    cfg.model = tiny.model
    cfg.model.peft.kind = kept[3]
    cfg.optim = tiny.optim
    cfg.eval = tiny.eval
    cfg.max_steps_per_task = 2
    assert (cfg.method.to_dict(), cfg.loss.to_dict(), cfg.schedule.to_dict()) == kept[:3]
    results = trainer.run(cfg, str(tmp_path / "run"))
    assert np.isfinite(results["A_T"])


@pytest.mark.slow  # two full runs (~40 s on 2 cores): run with -m slow
def test_scanned_steps_match_the_per_step_loop(tmp_path):
    """optim.steps_per_call=3 (device-resident data, lax.scan, chunks that do not divide the
    13-step epochs) trains exactly like the per-step loop over the host loader."""
    results, losses = {}, {}
    for k in (1, 3):
        cfg = tiny_config(
            tmp_path / "cache",
            **{
                "optim.steps_per_call": k,
                "data.num_tasks": 2,
                "max_steps_per_task": 16,
                "log_every_steps": 1,
                "method.name": "lae",
            },
        )
        results[k] = trainer.run(cfg, str(tmp_path / f"k{k}"))
        losses[k] = [
            r["loss"]
            for r in _read_jsonl(tmp_path / f"k{k}" / "metrics.jsonl")
            if r["type"] == "train"
        ]
    assert len(losses[3]) == len(losses[1]) == 32
    np.testing.assert_allclose(losses[3], losses[1], rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(
        np.array(results[3]["accuracy_matrix"], float),
        np.array(results[1]["accuracy_matrix"], float),
        atol=1.0,
    )  # at most ~1 test image


@pytest.mark.slow  # CI: bfloat16 compute is unit-tested in tests/test_models.py
def test_bfloat16_compute_runs_end_to_end(tmp_path):
    cfg = tiny_config(
        tmp_path / "cache",
        **{"model.dtype": "bfloat16", "data.num_tasks": 2, "max_steps_per_task": 4},
    )
    results = trainer.run(cfg, str(tmp_path / "run"))
    assert np.isfinite(results["A_T"])
    losses = [
        r["loss"] for r in _read_jsonl(tmp_path / "run" / "metrics.jsonl") if r["type"] == "train"
    ]
    assert losses and all(np.isfinite(losses))


def _coda_prompt_epoch_lrs(base_lr: float, epochs: int) -> list[float]:
    """The lr of each epoch under CODA-Prompt's `utils/schedulers.py` `CosineSchedule` and its
    `learners/default.py` loop, re-enacted: the constructor calls `step(0)` (sets lr(0)) and
    then resets `last_epoch` to -1; epoch e > 0 begins with `step()`, which sets
    lr(last_epoch + 1)."""
    lr = lambda k: base_lr * math.cos(99 * math.pi * k / (200 * (epochs - 1)))
    current, last_epoch = lr(0), -1  # the constructor's step(0), then last_epoch = -1
    out = []
    for epoch in range(epochs):
        if epoch > 0:
            last_epoch += 1
            current = lr(last_epoch)
        out.append(current)
    return out


def test_cosine_epoch_schedule_and_clipping():
    """`optim.lr_schedule=cosine_epochs` gives each epoch the lr that CODA-Prompt's (and
    InfLoRA's) CosineSchedule gives it, and `optim.clip_norm` rescales a gradient above that
    global norm before Adam."""
    from aepg_jax.continual import steps as step_lib

    cfg = schema.base_config("vit_tiny")
    cfg.optim.update(learning_rate=1e-3, epochs=50, lr_schedule="cosine_epochs")
    lr = step_lib.learning_rate(cfg, steps_per_epoch=4)
    reference = _coda_prompt_epoch_lrs(1e-3, 50)
    ours = [float(lr(4 * e + i)) for e in range(50) for i in (0, 3)]
    np.testing.assert_allclose(ours, np.repeat(reference, 2), rtol=1e-5)
    assert float(lr(400)) == pytest.approx(reference[-1], rel=1e-5)  # past the end: the last
    # Pinned: epochs 0 and 1 at lr, epoch 2 at lr cos(99 pi / 9800), the last at lr(48).
    np.testing.assert_allclose(
        [float(lr(4 * e)) / 1e-3 for e in (0, 1, 2, 49)],
        [1.0, 1.0, 0.999497, 0.0474267],
        rtol=1e-5,
    )
    cfg.optim.epochs = 5
    lr5 = step_lib.learning_rate(cfg, steps_per_epoch=1)
    np.testing.assert_allclose(
        [float(lr5(e)) / 1e-3 for e in range(5)],
        [1.0, 1.0, 0.925375, 0.712639, 0.393541],
        rtol=1e-5,
    )

    cfg.optim.update(lr_schedule="constant", clip_norm=1.0)
    trainable = {"head": {"kernel": np.zeros((2, 3), np.float32)}}
    clipped_tx = step_lib.optimizer(cfg, trainable)
    cfg.optim.clip_norm = 0.0
    plain_tx = step_lib.optimizer(cfg, trainable)
    # Adam's first step is scale-free; a large then a small gradient shows the clipping.
    steps = [np.full((2, 3), 100.0, np.float32), np.full((2, 3), 0.01, np.float32)]
    by_hand = [steps[0] / np.linalg.norm(steps[0]), steps[1]]  # norm 0.0245 < 1: unchanged
    s_clip, s_plain = clipped_tx.init(trainable), plain_tx.init(trainable)
    for g, g_hand in zip(steps, by_hand, strict=True):
        u_clip, s_clip = clipped_tx.update({"head": {"kernel": g}}, s_clip, trainable)
        u_hand, s_plain = plain_tx.update({"head": {"kernel": g_hand}}, s_plain, trainable)
        np.testing.assert_allclose(u_clip["head"]["kernel"], u_hand["head"]["kernel"], 1e-5)
    unclipped, _ = plain_tx.update(
        {"head": {"kernel": steps[1]}},
        plain_tx.update({"head": {"kernel": steps[0]}}, plain_tx.init(trainable), trainable)[1],
        trainable,
    )
    assert not np.allclose(unclipped["head"]["kernel"], u_clip["head"]["kernel"], rtol=1e-3)


def test_the_logged_lr_is_the_rate_adam_applies_per_label():
    """Under `cosine_epochs` each label's Adam runs the schedule at its own update count: the
    head's is the task step, the PEFT's stands still while PEFT is gated off (head-only
    epochs). `applied_rates` (the step's `lr_<label>` metrics) reads those counts; the train
    record's `lr` is the head's and `lr_peft` appears only where PEFT trains at another rate."""
    import jax
    import jax.numpy as jnp

    from aepg_jax.continual import steps as step_lib

    cfg = schema.base_config("vit_tiny")
    cfg.optim.update(learning_rate=1e-3, epochs=4, lr_schedule="cosine_epochs")
    per_epoch, freeze = 2, 3
    schedule = step_lib.learning_rate(cfg, per_epoch)
    params = {"head": {"kernel": jnp.ones((2, 3))}, "block": {"lora": {"a": jnp.ones((3,))}}}
    tx = step_lib.optimizer(cfg, params, per_epoch)
    opt_state = tx.init(params)
    rates_of = jax.jit(lambda state: step_lib.applied_rates(state, schedule))
    update = jax.jit(lambda state, flag: tx.update(params, state, params, train_peft=flag)[1])
    logged = []
    for task_step in range(8):
        rates = rates_of(opt_state)
        train_peft = task_step >= freeze
        head = float(schedule(task_step))
        peft = float(schedule(max(task_step - freeze, 0)))
        np.testing.assert_allclose([rates["head"], rates["peft"]], [head, peft], rtol=1e-6)
        m = {f"lr_{k}": v for k, v in rates.items()} | {"train_peft": jnp.asarray(train_peft)}
        logged.append(trainer._rates(m))
        opt_state = update(opt_state, jnp.asarray(train_peft))
    assert logged[0] == {"lr": 0.001} and min(r["lr"] for r in logged) < 1e-3
    assert [("lr_peft" in r) for r in logged] == [False] * 4 + [True] * 4
    assert logged[-1]["lr_peft"] == pytest.approx(float(schedule(7 - freeze)), rel=1e-6)
    constant = step_lib.applied_rates(tx.init(params), 1e-3)
    assert {k: float(v) for k, v in constant.items()} == {
        "head": np.float32(1e-3),
        "peft": np.float32(1e-3),
    }


def test_backbone_at_chance_is_refused():
    with pytest.raises(ValueError, match=r"reached 10\.0% test accuracy, chance is 10\.0%"):
        pretrain.check_above_chance(0.10, 10, "digits")
    pretrain.check_above_chance(0.16, 10, "digits")  # 1.6x chance: accepted


@pytest.mark.slow  # pretrains for an epoch
def test_backbone_at_chance_is_not_cached(tmp_path, monkeypatch):
    cfg = tiny_config(tmp_path / "cache", **{"model.init": "pretrained", "pretrain.epochs": 1})
    cfg.pretrain.dataset = "digits"
    monkeypatch.setattr(pretrain, "_accuracy", lambda *args: 0.09)  # as a broken training ends
    with pytest.raises(ValueError, match="the backbone is not cached"):
        pretrain.pretrain_backbone(cfg, loader.data_mesh())
    cached = tmp_path / "cache" / "pretrained"
    assert not cached.exists() or not [f for f in os.listdir(cached) if f.endswith(".npz")]
