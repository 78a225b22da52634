"""RanPAC against its official code (tests/official/ranpac/make_fixture.py wrote the fixture).

Same tiny timm ViT, images, random projection W and split orders on both sides; three tasks of
two classes, M = 128, no first-session adaptation (the official "RanPAC without PETL"). Every
compared quantity, its tolerance and the measured difference: docs/algorithm.md §22.
"""

import os
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from aepg_jax.checkpoints import weights
from aepg_jax.config import schema
from aepg_jax.methods import base, ranpac
from aepg_jax.models import head, vit

FIXTURES = Path(__file__).parent / "fixtures"
TASKS, PER_TASK = 3, 2


@pytest.fixture(scope="module")
def official():
    with np.load(FIXTURES / "official_ranpac.npz") as f:
        return {k: f[k] for k in f.files}


def _config(m: int):
    c = schema.base_config("vit_tiny")
    c.model.update(dict(patch_size=8, hidden_size=32, depth=2, num_heads=2, mlp_dim=128))
    c.model.update(dict(image_size=32, init="augreg", family="vit"))
    c.model.checkpoint = os.fspath(FIXTURES / "timm_tiny_vit.safetensors")
    c.model.peft.kind = "none"
    c.input.normalize = "minus_one_one"
    c.method.name, c.method.ranpac_m = "ranpac", m
    c.eval.batch_size = 16
    return c


def _run(official):
    """Our RanPAC over the fixture's stream: per task the state and the test logits."""
    cfg = _config(int(official["m"]))
    frozen = weights.load_backbone(
        cfg.model.checkpoint, vit.init_params(cfg.model, jax.random.key(0))
    )
    trainable = {"head": {}}
    for t in range(TASKS):
        trainable = head.grow(trainable, jax.random.key(t), PER_TASK, 32, "uniform")
    method = ranpac.RanPAC(cfg)
    net = base.Network(cfg.model)
    state = {**method.init_state(trainable), "w_rand": jnp.asarray(official["w_rand"])}
    predict = jax.jit(lambda s, x, task: method.predict(net, trainable, frozen, s, x, task)[1])
    out = []
    for t in range(TASKS):
        classes = np.arange(t * PER_TASK, (t + 1) * PER_TASK)
        keep = np.isin(official["train_y"], classes)
        batch = {
            "image": jnp.asarray(official["train_x"][keep]),
            "label": jnp.asarray(official["train_y"][keep]),
            "mask": jnp.ones(int(keep.sum()), bool),
        }
        ctx = base.TaskContext(
            net, frozen, lambda b=batch: iter([b]), lambda t=t: jax.random.key(t)
        )
        feats, labels = method.task_features(ctx, trainable)
        order = official["orders"][t]
        state = method.update(state, feats[order], labels[order], cfg.eval.batch_size)
        seen = np.isin(official["test_y"], np.arange((t + 1) * PER_TASK))
        spec = base.TaskSpec(t, t * PER_TASK, PER_TASK, 0, (PER_TASK,) * TASKS).traced()
        x = vit_input(official["test_x"][seen])
        out.append((state, np.asarray(predict(state, x, spec))[:, : (t + 1) * PER_TASK]))
    return out


def vit_input(images):
    return (jnp.asarray(images, jnp.float32) / 255.0 - 0.5) / 0.5


def test_projection_gram_ridge_readout_and_predictions_equal_the_official_code(official):
    acc = np.full((TASKS, TASKS), np.nan)
    for t, (state, logits) in enumerate(_run(official)):
        gram, q = np.asarray(state["gram"]), np.asarray(state["sums"].sums).T
        scale = np.abs(official[f"gram_{t}"]).max()
        np.testing.assert_allclose(gram, official[f"gram_{t}"], atol=2e-5 * scale, rtol=0)
        np.testing.assert_allclose(q, official[f"q_{t}"], atol=2e-5 * np.abs(q).max(), rtol=0)
        assert float(state["ridge"]) == official["ridges"][t]
        seen = (t + 1) * PER_TASK
        readout = np.asarray(state["readout"])[:seen]
        ref = official[f"readout_{t}"]
        np.testing.assert_allclose(readout, ref, atol=1e-4 * np.abs(ref).max(), rtol=0)
        ref = official[f"logits_{t}"]
        np.testing.assert_allclose(logits, ref, atol=1e-4 * np.abs(ref).max(), rtol=0)
        pred = logits.argmax(-1)
        np.testing.assert_array_equal(pred, official[f"pred_{t}"])
        y = official["test_y"][official["test_y"] < seen]
        for s in range(t + 1):
            k = (y >= s * PER_TASK) & (y < (s + 1) * PER_TASK)
            acc[t, s] = 100.0 * np.mean(pred[k] == y[k])
    np.testing.assert_array_equal(acc, official["accuracy"])
