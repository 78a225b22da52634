"""RanPAC against its official code (tests/official/ranpac/make_fixture.py wrote the fixture).

Same tiny timm ViT, images, random projection W and split orders on both sides; three tasks of
two classes, M = 128, no first-session adaptation (the official "RanPAC without PETL"); and the
first-session adaptation of the adapter variant (the official AdaptFormer adapters and cosine
head copied in, SGD with its momentum, weight decay and per-epoch cosine annealing, the task's
images as one batch per epoch). Every compared quantity, its tolerance and the measured
difference: docs/algorithm.md §22.
"""

import os
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from PIL import Image
from test_input_files import _tiny_augreg_config

from aepg_jax.checkpoints import weights
from aepg_jax.config import schema
from aepg_jax.continual import trainer
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


# -- the first-session adaptation (the official adapter variant, RanPAC.py L237-243) ------------


def _adapt_config(folder, tmp_path, official):
    c = _tiny_augreg_config(FIXTURES / "timm_tiny_vit.npz")
    c.method.name, c.method.ranpac_m = "ranpac", 16  # W is not compared here: any small M
    c.model.peft.update(
        dict(kind="adapter", adapter_style="ffn", adapter_dim=64, adapter_scale=0.1,
             blocks=(0, 1))
    )  # fmt: skip
    c.data.update(
        dict(source="folder", name="official_ranpac", data_dir=str(folder), num_tasks=TASKS,
             cache_dir=str(tmp_path / "cache"), crop_scale=(1.0, 1.0), crop_ratio=(1.0, 1.0),
             flip_prob=0.0)
    )  # fmt: skip
    c.input.normalize = "minus_one_one"
    c.loss.name = "ce"  # the official `F.cross_entropy`
    c.optim.update(
        dict(optimizer="sgd", learning_rate=float(official["adapt/lr"]), momentum=0.9,
             weight_decay=5e-4, lr_schedule="cosine_annealing",
             epochs=int(official["adapt/epochs"]), batch_size=2 * 24, peft_freeze_epochs=0,
             clip_norm=0.0)
    )  # fmt: skip
    c.eval.batch_size = 48
    c.tensorboard = False
    return c


def _official_adapters(official, stage):
    """The official `convnet.blocks.i.adaptmlp.*` of `adapt/<stage>/` as our PEFT tree."""
    blocks = {}
    for i in range(2):
        k = f"adapt/{stage}/convnet.blocks.{i}.adaptmlp."
        blocks[f"encoderblock_{i}"] = {
            "adapter": {
                part: {"kernel": official[f"{k}{part}_proj.weight"].T,
                       "bias": official[f"{k}{part}_proj.bias"]}
                for part in ("down", "up")
            }
        }  # fmt: skip
    return {"Transformer": blocks}


def _put(tree, values):
    """`tree` with the leaves of `values` (a subtree of the same paths) put in, same dtypes."""
    out = dict(tree)
    for k, v in values.items():
        out[k] = _put(tree[k], v) if isinstance(v, dict) else jnp.asarray(v, tree[k].dtype)
    return out


@pytest.mark.slow
def test_first_session_adaptation_equals_the_official_code(official, tmp_path, monkeypatch):
    folder = tmp_path / "images"
    for split in ("train", "test"):
        for i, (x, y) in enumerate(
            zip(official[f"{split}_x"], official[f"{split}_y"], strict=True)
        ):
            (folder / split / f"c{y}").mkdir(parents=True, exist_ok=True)
            Image.fromarray(x).save(folder / split / f"c{y}" / f"{i:04d}.png")
    grow, end_task, recorded = ranpac.RanPAC.grow, ranpac.RanPAC.end_task, []

    def official_init(self, task, trainable, key):
        trainable = grow(self, task, trainable, key)
        if task == 0:
            assert "Transformer" in trainable  # the adapters exist before task 0 trains
            trainable = _put(trainable, _official_adapters(official, "init"))
            kernel = official["adapt/init/fc.weight"].T
            trainable = _put(trainable, {"head": {head.task_name(0): {"kernel": kernel}}})
            trainable[head.COSINE_SCALE] = jnp.float32(official["adapt/init/fc.sigma"][0])
        return trainable

    def record(self, task, trainable, state, ctx):
        recorded.append(trainable)
        return end_task(self, task, trainable, state, ctx)

    monkeypatch.setattr(ranpac.RanPAC, "grow", official_init)
    monkeypatch.setattr(ranpac.RanPAC, "end_task", record)
    trainer.run(_adapt_config(folder, tmp_path, official), str(tmp_path / "run"))
    assert len(recorded) == TASKS
    ours, init = recorded[0], _official_adapters(official, "init")
    theirs = _official_adapters(official, "adapted")
    for path, leaf in jax.tree_util.tree_flatten_with_path(theirs)[0]:
        mine = np.asarray(_at(ours, path))
        moved = np.abs(leaf - _at(init, path)).max()
        assert moved > 0  # the few steps moved every official leaf
        np.testing.assert_allclose(mine, leaf, rtol=0, atol=1e-6 + 1e-3 * moved)
    kernel = np.asarray(ours["head"][head.task_name(0)]["kernel"]).T
    ref = official["adapt/adapted/fc.weight"]
    np.testing.assert_allclose(kernel, ref, rtol=0, atol=1e-6 * np.abs(ref).max() + 1e-6)
    np.testing.assert_allclose(
        ours[head.COSINE_SCALE], official["adapt/adapted/fc.sigma"][0], rtol=1e-6
    )
    # Frozen after task 0: the adapters of the last task are those after adaptation.
    last = recorded[-1]["Transformer"]
    assert jax.tree.all(jax.tree.map(np.array_equal, last, ours["Transformer"]))


def _at(tree, path):
    for key in path:
        tree = tree[key.key]
    return tree
