"""SD-LoRA against its official code, end to end over 3 tasks (tests/fixtures/official_sd_lora.npz).

The fixture is the official code (WuYichen-97/SD-Lora-CL) run on the tiny timm ViT, tiny images
and a given batch order (tests/official/sd_lora/make_fixture.py). Here the same weights, initial
A matrices and heads, images and order go through `methods/sd_lora.py`: its training forward
under plain cross-entropy with the project's optimizer at the official settings (SGD, momentum
0.9, constant lr), its `end_task` and its `predict`. Compared, within float32 tolerance: the
loss and learning rate of every step, the trained A, B, magnitudes and heads after every task,
the test logits, the predictions and the accuracy matrix (docs/algorithm.md §23).
"""

import os
from pathlib import Path

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import pytest
from test_input_files import _tiny_augreg_config

from aepg_jax import losses
from aepg_jax.checkpoints import weights
from aepg_jax.continual import steps
from aepg_jax.data import augment
from aepg_jax.methods import TaskSpec
from aepg_jax.methods.sd_lora import KEY, SD_LORA_SETTINGS, SDLoRA
from aepg_jax.models import vit

FIXTURE = Path(__file__).parent / "fixtures" / "official_sd_lora.npz"
WEIGHTS = Path(__file__).parent / "fixtures" / "timm_tiny_vit.safetensors"
TASKS, PER_TASK, BATCH, LR, RANK = 3, 2, 8, 0.01, 4
# The measured max differences are in docs/algorithm.md §23's table.
TOL = {"loss": 1e-5, "lora": 1e-5, "alpha": 1e-5, "head": 1e-5, "logits": 1e-4}
pytestmark = pytest.mark.slow  # ~10 s: the step, the evaluation and the store compile


def _config() -> ml_collections.ConfigDict:
    cfg = _tiny_augreg_config(WEIGHTS)
    cfg.model.peft.kind = "none"
    cfg.data.num_tasks = TASKS
    cfg.method.name = "sd_lora"
    cfg.method.sd_lora_rank = RANK
    for key, value in SD_LORA_SETTINGS.items():
        section, field = key.split(".")
        cfg[section][field] = value
    cfg.optim.learning_rate = LR
    return cfg


def _task(t: int) -> TaskSpec:
    return TaskSpec(t, t * PER_TASK, PER_TASK, 0, (PER_TASK,) * TASKS)


@pytest.fixture(scope="module")
def run():
    """Our side: every task trained from the official initial A and head, its `end_task`, and
    the test logits after it."""
    fx = dict(np.load(FIXTURE))
    cfg = _config()
    method = SDLoRA(cfg)
    init = vit.init_params(cfg.model, jax.random.key(0), (PER_TASK,) * TASKS)
    frozen = dict(weights.load_backbone(os.fspath(WEIGHTS), init))
    frozen.pop("head")
    x_train = augment.test_transform(jnp.asarray(fx["images_train"]), 32, "minus_one_one")
    np.testing.assert_allclose(x_train, fx["images_train"] / 127.5 - 1.0, atol=1e-6)
    y_train = jnp.asarray(fx["labels_train"])
    x_test = augment.test_transform(jnp.asarray(fx["images_test"]), 32, "minus_one_one")

    @jax.jit
    def step(trainable, opt_state, state, images, labels, task):
        def loss_fn(tr):
            logits, _ = method.forward(None, tr, frozen, state, images, task)
            local = jax.lax.dynamic_slice_in_dim(logits, task.offset, PER_TASK, axis=1)
            return jnp.mean(losses.cross_entropy(local, labels - task.offset))

        loss, grads = jax.value_and_grad(loss_fn)(trainable)
        rates = steps.applied_rates(opt_state, steps.learning_rate(cfg, 1))
        updates, opt_state = tx.update(grads, opt_state, trainable)
        return jax.tree.map(jnp.add, trainable, updates), opt_state, loss, rates

    predict = jax.jit(method.predict, static_argnums=(0,))
    heads = {
        f"task_{t}": {"kernel": jnp.asarray(fx["init_head_w"][t].T), "bias": jnp.zeros(PER_TASK)}
        for t in range(TASKS)
    }
    state = method.init_state(None)
    tx = steps.optimizer(cfg, {"head": heads, **method.grow(0, {}, jax.random.key(0))})
    out = {k: [] for k in ("loss", "lr", "trainable", "state", "logits")}
    for t in range(TASKS):
        lora = method.grow(t, {}, jax.random.key(t))[KEY]["lora"]
        lora["A_q"], lora["A_v"] = (jnp.asarray(fx["init_A"][t, i]) for i in range(2))
        trainable = {"head": heads, KEY: {"lora": lora}}
        opt_state = tx.init(trainable)  # a new optimizer per task, as the official code
        for order in fx["orders"][t]:
            for s in range(0, len(order), BATCH):
                b = order[s : s + BATCH]
                trainable, opt_state, loss, rates = step(
                    trainable, opt_state, state, x_train[b], y_train[b], _task(t).traced()
                )
                out["loss"].append(float(loss))
                out["lr"].append({k: float(v) for k, v in rates.items()})
        heads = trainable["head"]
        state = method.end_task(_task(t), trainable, state, None)
        _, logits = predict(None, trainable, frozen, state, x_test, _task(t).traced())
        out["trainable"].append(jax.tree.map(np.asarray, trainable))
        out["state"].append(jax.tree.map(np.asarray, state))
        out["logits"].append(np.asarray(logits))
    return fx, out


def test_losses_and_learning_rates_per_step_equal_the_official(run):
    fx, out = run
    assert len(out["loss"]) == len(fx["loss"]) == int(fx["steps"].sum())
    np.testing.assert_allclose(out["loss"], fx["loss"], atol=TOL["loss"], rtol=0)
    for ours, theirs in zip(out["lr"], fx["lr"], strict=True):
        assert set(ours) == {"head", "peft"}
        np.testing.assert_allclose(list(ours.values()), theirs, rtol=1e-7)


def test_trained_directions_magnitudes_and_heads_equal_the_official(run):
    fx, out = run
    for t in range(TASKS):
        lora = out["trainable"][t][KEY]["lora"]
        for i, (a, b) in enumerate((("A_q", "B_q"), ("A_v", "B_v"))):
            np.testing.assert_allclose(lora[a], fx["A"][t, i], atol=TOL["lora"], rtol=0)
            np.testing.assert_allclose(lora[b], fx["B"][t, i], atol=TOL["lora"], rtol=0)
            # The state keeps task t's pair; earlier tasks' pairs are not moved.
            np.testing.assert_array_equal(out["state"][t][a][: t + 1], out["state"][-1][a][: t + 1])
        assert np.abs(lora["B_q"]).max() > 1e-3  # training moved B (it starts at zero)
        np.testing.assert_allclose(lora["alpha"], fx["alpha"][t], atol=TOL["alpha"])
        np.testing.assert_allclose(
            lora["alpha_prev"][:t], fx["alpha_prev"][t, :t], atol=TOL["alpha"]
        )
        np.testing.assert_allclose(
            out["state"][t]["magnitudes"][t, : t + 1],
            [*fx["alpha_prev"][t, :t], fx["alpha"][t]],
            atol=TOL["alpha"],
        )
        stop = (t + 1) * PER_TASK
        heads = out["trainable"][t]["head"]
        w = np.concatenate([heads[f"task_{j}"]["kernel"].T for j in range(t + 1)])
        bias = np.concatenate([heads[f"task_{j}"]["bias"] for j in range(t + 1)])
        np.testing.assert_allclose(w, fx["head_w"][t, :stop], atol=TOL["head"], rtol=0)
        np.testing.assert_allclose(bias, fx["head_b"][t, :stop], atol=TOL["head"], rtol=0)


def test_logits_predictions_and_accuracy_equal_the_official(run):
    fx, out = run
    y = fx["labels_test"]
    acc = np.full((TASKS, TASKS), np.nan)
    for t in range(TASKS):
        stop = (t + 1) * PER_TASK
        ours, theirs = out["logits"][t][:, :stop], fx["logits"][t][:, :stop]
        np.testing.assert_allclose(ours, theirs, atol=TOL["logits"], rtol=0)
        pred = ours.argmax(1)
        np.testing.assert_array_equal(pred, theirs.argmax(1))
        for i in range(t + 1):
            sel = (y // PER_TASK) == i
            acc[i, t] = 100.0 * np.mean(pred[sel] == y[sel])
    np.testing.assert_allclose(acc, fx["accuracy"], equal_nan=True)
