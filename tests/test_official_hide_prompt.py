"""HiDe-Prompt against its official code, end to end over 2 tasks
(tests/fixtures/official_hide_prompt.npz). The fixture is the official code (thu-ml/HiDe-Prompt)
run on the tiny timm ViT, tiny images and a given batch order
(tests/official/hide_prompt/make_fixture.py): its task-identity stage, then its prompt stage
with task-adaptive alignment. Here the same weights, initial prompts, heads and TII model,
images and order go through `methods/hide_prompt.py`: its training forward (the prompt with
momentum, the contrastive term) under cross-entropy and the project's optimizer (Adam, the
heads at 0.1x through `lr_scales`, clipping), its end-of-task programs (momentum, class
statistics, TII training, both alignments, fed the official code's own sampled features) and
its `predict`. Compared, within float32 tolerance (docs/algorithm.md §25): every training and
alignment step's loss and learning rate, the prompts, heads and TII parameters after each task,
both stages' class means and covariances, the TII logits, the inferred tasks, the test logits
and the accuracy matrix.
"""

import functools
import os
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from test_input_files import _tiny_augreg_config

from aepg_jax import losses, schedules
from aepg_jax.checkpoints import weights
from aepg_jax.continual import steps
from aepg_jax.data import augment
from aepg_jax.methods import Network, TaskSpec
from aepg_jax.methods import hide_prompt as hp
from aepg_jax.methods import task_identity as ti
from aepg_jax.models import vit

FIXTURE = Path(__file__).parent / "fixtures" / "official_hide_prompt.npz"
WEIGHTS = Path(__file__).parent / "fixtures" / "timm_tiny_vit.safetensors"
TASKS, PER_TASK, BATCH, EPOCHS, TII_EPOCHS, CA_EPOCHS = 2, 2, 8, 4, 3, 2
LR, TII_LR, TAP_LR, TII_CA_LR = 0.05, 0.01, 0.05, 0.02
# The measured max differences are in docs/algorithm.md §25's table.
TOL = {"loss": 2e-5, "params": 1e-4, "stats": 2e-5, "logits": 5e-5}
pytestmark = pytest.mark.slow  # a dozen programs compiled: ~20 s


def _config():
    cfg = _tiny_augreg_config(WEIGHTS)
    cfg.model.peft.kind = "none"
    cfg.data.num_tasks = TASKS
    cfg.method.name = "hide_prompt"
    cfg.method.update(
        hide_prompt_blocks=(0, 1), hide_prompt_length=4, hide_prompt_pool_size=10,
        hide_prompt_momentum=0.1, hide_prompt_reg=0.5, hide_prompt_tii_lr=TII_LR,
        hide_prompt_tii_epochs=TII_EPOCHS, hide_prompt_ca_epochs=CA_EPOCHS,
        hide_prompt_tap_lr=TAP_LR, hide_prompt_tap_batch=5 * BATCH,
        hide_prompt_tii_ca_lr=TII_CA_LR, hide_prompt_tii_ca_batch=BATCH,
    )  # fmt: skip
    cfg.optim.update(
        learning_rate=LR, batch_size=BATCH, epochs=EPOCHS, peft_freeze_epochs=0, clip_norm=1.0,
        lr_schedule="constant",
    )  # fmt: skip
    return cfg


def _task(t: int) -> TaskSpec:
    return TaskSpec(t, t * PER_TASK, PER_TASK, 0, (PER_TASK,) * TASKS)


def _heads(w, b):
    """torch's Linear(D, C) (C, D), (C,) as the per-task heads."""
    return {
        f"task_{t}": {
            "kernel": jnp.asarray(w[t * PER_TASK : (t + 1) * PER_TASK].T),
            "bias": jnp.asarray(b[t * PER_TASK : (t + 1) * PER_TASK]),
        }
        for t in range(TASKS)
    }


def _tii(fx, prefix: str, t: int | None = None):
    g = lambda k: jnp.asarray(fx[f"{prefix}/{k}"] if t is None else fx[f"{prefix}/{k}"][t])
    d = g("head.weight").shape[-1]
    norm = (
        {"scale": jnp.ones(d), "bias": jnp.zeros(d)}
        if t is None
        else {"scale": g("mlp.norm.weight"), "bias": g("mlp.norm.bias")}
    )
    return {
        "fc1": {"kernel": g("mlp.net.0.0.weight").T, "bias": g("mlp.net.0.0.bias")},
        "fc2": {"kernel": g("mlp.net.1.0.weight").T, "bias": g("mlp.net.1.0.bias")},
        "norm": norm,
        "head": {"kernel": g("head.weight").T, "bias": g("head.bias")},
    }


def _prompt(p):
    """(n, 2, M, L, H, hd) as the method's (n, 2, M, L, D)."""
    return jnp.asarray(p.reshape(*p.shape[:4], -1))


@pytest.fixture(scope="module")
def run():
    fx = dict(np.load(FIXTURE))
    cfg = _config()
    method = hp.HiDePrompt(cfg)
    net = Network(cfg.model)
    init = vit.init_params(cfg.model, jax.random.key(0), (PER_TASK,) * TASKS)
    frozen = dict(weights.load_backbone(os.fspath(WEIGHTS), init))
    frozen.pop("head")
    x_train = augment.test_transform(jnp.asarray(fx["images_train"]), 32, "minus_one_one")
    y_train = jnp.asarray(fx["labels_train"])
    x_test = augment.test_transform(jnp.asarray(fx["images_test"]), 32, "minus_one_one")
    trainable = {
        "head": _heads(fx["wtp_init/head.weight"], fx["wtp_init/head.bias"]),
        "prompt": {"e": _prompt(fx["wtp_init/prompt"])},
    }
    state = method.init_state(trainable)
    opt = steps.optimizer(cfg, trainable, 1, method.lr_scales)

    @jax.jit
    def step(trainable, opt_state, state, images, labels, task):
        def loss_fn(tr):
            logits, extra = method.forward(net, tr, frozen, state, images, task)
            local = jax.lax.dynamic_slice_in_dim(logits, task.offset, PER_TASK, axis=1)
            return jnp.mean(losses.cross_entropy(local, labels - task.offset)) + extra

        loss, grads = jax.value_and_grad(loss_fn)(trainable)
        updates, opt_state = opt.update(grads, opt_state, trainable)
        return jax.tree.map(jnp.add, trainable, updates), opt_state, loss

    predict = jax.jit(lambda tr, st, x, task: method.predict(net, tr, frozen, st, x, task))
    query = jax.jit(lambda fr, x: hp.prompting.query(net, fr, x))
    momentum, stats = jax.jit(method.momentum), jax.jit(method.statistics)
    combined = jax.jit(hp.combined)
    merge = jax.jit(functools.partial(hp.merge_statistics, diagonal=False))
    tii_step = jax.jit(functools.partial(ti.train_step, lr=cfg.method.hide_prompt_tii_lr))
    tii_opt_init = jax.jit(ti.optimizer(cfg.method.hide_prompt_tii_lr).init)
    align_step = jax.jit(ti.align_step)
    align_heads = jax.jit(functools.partial(ti.align_heads, lr=TAP_LR))
    out = {k: [] for k in ("train_loss", "tii_loss", "tii_align_loss", "tap_align_loss")}
    for k in ("prompt", "heads", "tii", "wtp_stats", "tii_stats", "tii_logits", "slots", "logits"):
        out[k] = []
    tii = _tii(fx, "tii_init")
    for t in range(TASKS):
        spec, traced = _task(t), _task(t).traced()
        if t > 0:
            trainable, state = method.begin_task(spec, trainable, state, None)
        opt_state = opt.init(trainable)
        for order in fx["orders"][t][:EPOCHS]:
            for s in range(0, len(order), BATCH):
                b = order[s : s + BATCH]
                trainable, opt_state, loss = step(
                    trainable, opt_state, state, x_train[b], y_train[b], traced
                )
                out["train_loss"].append(float(loss))
        # end_task's steps, with the official order and samples where it draws its own.
        e = momentum(trainable["prompt"]["e"], traced)
        trainable = {**trainable, "prompt": {"e": e}}
        own = np.nonzero((fx["labels_train"] // PER_TASK) == t)[0]
        wtp = tiig = None
        feats = []
        for s in range(0, len(own), BATCH):
            b = own[s : s + BATCH]
            batch = {
                "image": jnp.asarray(fx["images_train"][b]),
                "label": jnp.asarray(fx["labels_train"][b]),
                "mask": jnp.ones(len(b), bool),
            }
            w, g, q = stats(trainable, frozen, batch, traced)
            wtp, tiig = (w, g) if wtp is None else combined((wtp, tiig), (w, g))
            feats.append(np.asarray(q))
        state = {
            **state,
            "wtp_stats": merge(state["wtp_stats"], wtp, traced),
            "tii_stats": merge(state["tii_stats"], tiig, traced),
        }
        orders = fx["orders"][t][:TII_EPOCHS] - own[0]
        tii, tii_losses = ti.train(
            tii_step, tii, tii_opt_init(tii), np.concatenate(feats), fx["labels_train"][own],
            spec, orders, BATCH,
        )  # fmt: skip
        out["tii_loss"] += [float(x) for x in tii_losses]
        heads = trainable["head"]
        if t > 0:
            sgd = ti.SGD.init(tii)
            n_steps = spec.offset  # the classes learned before: batches per epoch
            for j, (f, y) in enumerate(
                zip(fx["tii/align_features"], fx["tii/align_labels"], strict=True)
            ):
                rate = jnp.float32(schedules.epoch_cosine(TII_CA_LR, j // n_steps, CA_EPOCHS))
                tii, sgd, loss = align_step(tii, sgd, f[None], y[None], 0, rate, traced)
                out["tii_align_loss"].append(float(loss))
            x = fx["wtp/align_features"].reshape(
                CA_EPOCHS, n_steps, *fx["wtp/align_features"].shape[1:]
            )
            y = fx["wtp/align_labels"].reshape(CA_EPOCHS, n_steps, -1)
            heads, tap_losses = align_heads(heads, x, y, traced)
            out["tap_align_loss"] += [float(v) for v in np.asarray(tap_losses).ravel()]
        state = {**state, "tii": tii, "head": heads}
        _, logits = predict(trainable, state, x_test, traced)
        q_test = query(frozen, x_test)
        out["tii_logits"].append(np.asarray(ti.logits(tii, q_test)))
        out["slots"].append(np.asarray(hp.HiDePrompt.infer_task(tii, q_test, traced)))
        out["logits"].append(np.asarray(logits))
        out["prompt"].append(np.asarray(trainable["prompt"]["e"]))
        out["heads"].append(jax.tree.map(np.asarray, heads))
        out["tii"].append(jax.tree.map(np.asarray, tii))
        out["wtp_stats"].append(jax.tree.map(np.asarray, state["wtp_stats"]))
        out["tii_stats"].append(jax.tree.map(np.asarray, state["tii_stats"]))
    return fx, out


def test_training_and_alignment_losses_equal_the_official(run):
    fx, out = run
    for ours, theirs in (
        ("train_loss", "wtp/train_loss"),
        ("tii_loss", "tii/train_loss"),
        ("tii_align_loss", "tii/align_loss"),
        ("tap_align_loss", "wtp/align_loss"),
    ):
        assert len(out[ours]) == len(fx[theirs]), ours
        np.testing.assert_allclose(out[ours], fx[theirs], atol=TOL["loss"], rtol=0, err_msg=ours)
    # The official rates: constant training rates, per-epoch cosine alignment rates.
    np.testing.assert_allclose(fx["wtp/train_lr"], LR)
    np.testing.assert_allclose(fx["tii/train_lr"], TII_LR)
    rates = [schedules.epoch_cosine(TII_CA_LR, j // PER_TASK, CA_EPOCHS) for j in range(4)]
    np.testing.assert_allclose(fx["tii/align_lr"], rates, rtol=1e-6)
    rates = [schedules.epoch_cosine(TAP_LR, j // PER_TASK, CA_EPOCHS) for j in range(4)]
    np.testing.assert_allclose(fx["wtp/align_lr"], rates, rtol=1e-6)


def test_parameters_after_each_task_equal_the_official(run):
    fx, out = run
    for t in range(TASKS):
        np.testing.assert_allclose(
            out["prompt"][t], _prompt(fx["wtp/prompt"][t]), atol=TOL["params"], rtol=0
        )
        heads = _heads(fx["wtp/head.weight"][t], fx["wtp/head.bias"][t])
        jax.tree.map(
            lambda a, b: np.testing.assert_allclose(a, b, atol=TOL["params"], rtol=0),
            out["heads"][t],
            heads,
        )
        jax.tree.map(
            lambda a, b: np.testing.assert_allclose(a, b, atol=TOL["params"], rtol=0),
            out["tii"][t],
            _tii(fx, "tii/params", t),
        )
    # Slot 1 trained (and took slot 0's momentum); the other slots are their initial values.
    init = np.asarray(_prompt(fx["wtp_init/prompt"]))
    assert np.abs(out["prompt"][1][:, :, 1] - init[:, :, 1]).max() > 1e-2
    np.testing.assert_array_equal(out["prompt"][1][:, :, 2:], init[:, :, 2:])


def test_class_statistics_equal_the_official(run):
    fx, out = run
    for stage, key in (("wtp", "wtp_stats"), ("tii", "tii_stats")):
        stats = out[key][-1]
        for c in range(TASKS * PER_TASK):
            np.testing.assert_allclose(
                stats["mean"][c], fx[f"{stage}/mean_{c}"], atol=TOL["stats"], rtol=0
            )
            np.testing.assert_allclose(
                stats["cov"][c], fx[f"{stage}/cov_{c}"], atol=TOL["stats"], rtol=0
            )


def test_task_inference_logits_predictions_and_accuracy_equal_the_official(run):
    fx, out = run
    y = fx["labels_test"]
    acc = np.full((TASKS, TASKS), np.nan)
    for t in range(TASKS):
        np.testing.assert_allclose(
            out["tii_logits"][t], fx["tii/logits"][t], atol=TOL["logits"], rtol=0
        )
        np.testing.assert_array_equal(out["slots"][t], fx["wtp/prompt_id"][t])
        seen = (t + 1) * PER_TASK
        np.testing.assert_allclose(
            out["logits"][t][:, :seen], fx["wtp/logits"][t][:, :seen], atol=TOL["logits"], rtol=0
        )
        pred = out["logits"][t].argmax(1)
        for i in range(t + 1):
            sel = (y // PER_TASK) == i
            acc[i, t] = 100.0 * np.mean(pred[sel] == y[sel])
    np.testing.assert_allclose(acc, fx["wtp/accuracy_masked"])
