"""SLCA against its official code (GengDavid/SLCA), end to end over 3 tasks.

tests/fixtures/official_slca.npz holds the official code's run (tests/official/slca/make_fixture.py:
the tiny timm ViT, 6 classes in 3 tasks of tiny images, no augmentation, each task's training
set one batch): every step's loss and learning rates, the class means and covariances, the
backbone after tasks 1 and 3, the classifier before and after alignment, the alignment's
samples (shuffled) and losses, the test logits and the accuracy matrix. Our trainer runs the
same images (an image folder), weights and settings, with the official initial heads and the
official alignment samples put in (the samplers' random streams differ), and must give the same
numbers (docs/algorithm.md §24 has the table of tolerances).
"""

import json
import os
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from PIL import Image
from safetensors.numpy import save_file
from test_input_files import _tiny_augreg_config

from aepg_jax.continual import trainer
from aepg_jax.data import augment
from aepg_jax.methods import base, class_gaussians, slca
from aepg_jax.models import partition, vit

FIXTURES = Path(__file__).parent / "fixtures"
TASKS, PER_TASK, WIDTH, SAMPLES, CA_EPOCHS = 3, 2, 32, 256, 2
# docs/algorithm.md §24 has the measured max differences (all <= 3e-6 relative).
TOL = {"loss": 1e-5, "params": 2e-5, "stats": 2e-5, "head": 2e-5, "aligned": 2e-5, "logits": 2e-5}


@pytest.fixture(scope="module")
def official():
    with np.load(FIXTURES / "official_slca.npz") as data:
        return {k: data[k] for k in data.files}


@pytest.fixture(scope="module")
def folder(official, tmp_path_factory):
    root = tmp_path_factory.mktemp("official_slca")
    for split in ("train", "test"):
        for i, (image, label) in enumerate(
            zip(official[f"images_{split}"], official[f"labels_{split}"], strict=True)
        ):
            where = root / split / f"c{label}"
            where.mkdir(parents=True, exist_ok=True)
            Image.fromarray(image).save(where / f"{i:04d}.png")
    return root


def _config(folder, workdir):
    c = _tiny_augreg_config(FIXTURES / "timm_tiny_vit.npz")
    c.method.name = "slca"
    c.model.peft.kind = "none"
    c.data.update(
        dict(source="folder", name="official_slca", data_dir=str(folder), num_tasks=TASKS,
             cache_dir=str(workdir / "cache"), crop_scale=(1.0, 1.0), crop_ratio=(1.0, 1.0),
             flip_prob=0.0)
    )  # fmt: skip
    c.input.normalize = "none"  # the official code's ToTensor
    c.loss.name = "ce"
    c.optim.update(
        dict(optimizer="sgd", learning_rate=0.05, momentum=0.9, weight_decay=5e-4,
             lr_schedule="multistep", lr_milestones=(2,), lr_decay=0.1, epochs=3,
             batch_size=12, peft_freeze_epochs=0)
    )  # fmt: skip
    c.method.update(
        dict(slca_backbone_lr_scale=0.1, slca_ca_epochs=CA_EPOCHS, slca_ca_samples=SAMPLES,
             slca_ca_logit_norm=0.1)
    )  # fmt: skip
    c.eval.batch_size = 48
    c.tensorboard = False
    c.log_every_steps = 1
    return c


def _official_samples(official):
    """(T, E, C, n, D) features and (T, E, C, n) labels: the official shuffled alignment inputs
    of each task, cut into batches of n, batches past the seen classes zero (skipped)."""
    c = TASKS * PER_TASK
    feats = np.zeros((TASKS, CA_EPOCHS, c, SAMPLES, WIDTH), np.float32)
    labels = np.zeros((TASKS, CA_EPOCHS, c, SAMPLES), np.int32)
    for t in range(1, TASKS):
        seen = (t + 1) * PER_TASK
        x, y = official[f"t{t}/ca_inputs"], official[f"t{t}/ca_targets"]
        feats[t, :, :seen] = x.reshape(CA_EPOCHS, seen, SAMPLES, WIDTH)
        labels[t, :, :seen] = y.reshape(CA_EPOCHS, seen, SAMPLES)
    return jnp.asarray(feats), jnp.asarray(labels)


def _run(folder, tmp_path, monkeypatch, official):
    recorded = []
    end_task, init_state = slca.SLCA.end_task, slca.SLCA.init_state

    def record(self, task, trainable, state, ctx):
        state = end_task(self, task, trainable, state, ctx)
        recorded.append((trainable, state))
        return state

    def official_heads(self, trainable):
        state = init_state(self, trainable)
        w = np.concatenate([official[f"t{t}/head_init_weight"] for t in range(TASKS)])
        b = np.concatenate([official[f"t{t}/head_init_bias"] for t in range(TASKS)])
        return {**state, "initial": {"kernel": jnp.asarray(w.T), "bias": jnp.asarray(b)}}

    feats, labels = _official_samples(official)
    monkeypatch.setattr(slca.SLCA, "end_task", record)
    monkeypatch.setattr(slca.SLCA, "init_state", official_heads)
    monkeypatch.setattr(slca.SLCA, "draw", lambda self, s, k, t, h: (feats[t], labels[t]))
    workdir = tmp_path / "run"
    results = trainer.run(_config(folder, tmp_path), str(workdir))
    with open(workdir / "metrics.jsonl") as f:
        records = [r for r in map(json.loads, f) if r["type"] == "train"]
    return results, recorded, records


def _official_backbone(official, t, cfg):
    """The official backbone after task t as our parameter tree (the project's timm loader)."""
    params = {k.split("/params/")[1]: v for k, v in official.items() if f"t{t}/params/" in k}
    params["head.weight"] = np.zeros((PER_TASK, WIDTH), np.float32)
    params["head.bias"] = np.zeros((PER_TASK,), np.float32)
    path = os.path.join(os.environ.get("TMPDIR", "/tmp"), f"official_slca_t{t}.safetensors")
    save_file(params, path)
    from aepg_jax.checkpoints import weights

    init = vit.init_params(cfg.model, jax.random.key(0), (PER_TASK,))
    tree = weights.load_backbone(path, init)
    tree.pop("head")
    return tree


@pytest.mark.slow
def test_matches_the_official_code_end_to_end(official, folder, tmp_path, monkeypatch):
    results, recorded, records = _run(folder, tmp_path, monkeypatch, official)
    cfg = _config(folder, tmp_path)
    assert len(recorded) == TASKS
    # Losses and learning rates per step (one step per epoch, 3 epochs per task).
    for t in range(TASKS):
        ours = [r for r in records if r["task"] == t]
        np.testing.assert_allclose(
            [r["loss"] for r in ours], official[f"t{t}/loss"], rtol=TOL["loss"], atol=TOL["loss"]
        )
        lrs = official[f"t{t}/lr"]  # (steps, [backbone, head])
        np.testing.assert_allclose([r["lr"] for r in ours], lrs[:, 1], rtol=1e-6)
        np.testing.assert_allclose([r["lr_finetuned"] for r in ours], lrs[:, 0], rtol=1e-6)
    method = slca.SLCA(cfg)
    test_images = augment.test_transform(jnp.asarray(official["images_test"]), 32, "none")
    for t, (trainable, state) in enumerate(recorded):
        seen = (t + 1) * PER_TASK
        if t in (0, 2):  # the fine-tuned backbone
            theirs = _official_backbone(official, t, cfg)
            ours = trainable[partition.FINETUNED]
            jax.tree.map(
                lambda a, b: np.testing.assert_allclose(
                    a, b, rtol=TOL["params"], atol=TOL["params"]
                ),
                ours,
                theirs,
            )
        stats = slca.SLCA.stats(state)
        np.testing.assert_allclose(
            stats.means()[:seen], official[f"t{t}/means"], rtol=TOL["stats"], atol=TOL["stats"]
        )
        np.testing.assert_allclose(
            stats.covariances(slca.RIDGE)[:seen],
            official[f"t{t}/covs"],
            rtol=TOL["stats"],
            atol=TOL["stats"],
        )
        heads = state["heads"]
        np.testing.assert_allclose(
            heads["kernel"][:, :seen].T, official[f"t{t}/fc_before_weight"], atol=TOL["head"]
        )
        np.testing.assert_allclose(
            heads["bias"][:seen], official[f"t{t}/fc_before_bias"], atol=TOL["head"]
        )
        aligned = state["aligned"]
        scale = np.abs(official[f"t{t}/fc_weight"]).max()
        np.testing.assert_allclose(
            aligned["kernel"][:, :seen].T, official[f"t{t}/fc_weight"], atol=TOL["aligned"] * scale
        )
        np.testing.assert_allclose(
            aligned["bias"][:seen], official[f"t{t}/fc_bias"], atol=TOL["aligned"] * scale
        )
        spec = base.TaskSpec(t, t * PER_TASK, PER_TASK, 0, (PER_TASK,) * TASKS)
        _, logits = method.predict(None, trainable, None, state, test_images, spec)
        theirs = official[f"t{t}/logits"]
        np.testing.assert_allclose(
            np.asarray(logits)[:, :seen], theirs, atol=TOL["logits"] * np.abs(theirs).max()
        )
    matrix = np.asarray(results["accuracy_matrix"], float)
    upper = np.triu(np.ones((TASKS, TASKS), bool))
    np.testing.assert_allclose(matrix[upper], official["accuracy"][upper], atol=1e-6)


def test_alignment_matches_the_official_losses_on_its_samples(official):
    """`class_gaussians.align_classifier` from the official pre-alignment classifier on the
    official samples: the official per-step losses and aligned classifier (task 3)."""
    t, seen = 2, 6
    feats, labels = _official_samples(official)
    w0, b0 = official[f"t{t}/fc_before_weight"], official[f"t{t}/fc_before_bias"]
    kernel, bias, losses = jax.jit(
        class_gaussians.align_classifier,
        static_argnames=("head_sizes", "learning_rate", "temperature"),
    )(
        jnp.asarray(w0.T), jnp.asarray(b0), feats[t], labels[t], seen, seen, t + 1,
        head_sizes=(PER_TASK,) * TASKS, learning_rate=0.05, temperature=0.1,
    )  # fmt: skip
    np.testing.assert_allclose(
        np.asarray(losses)[:, :seen].ravel(), official[f"t{t}/ca_loss"], rtol=1e-4
    )
    scale = np.abs(official[f"t{t}/fc_weight"]).max()
    np.testing.assert_allclose(
        np.asarray(kernel).T, official[f"t{t}/fc_weight"], atol=TOL["aligned"] * scale
    )
    np.testing.assert_allclose(
        np.asarray(bias), official[f"t{t}/fc_bias"], atol=TOL["aligned"] * scale
    )
