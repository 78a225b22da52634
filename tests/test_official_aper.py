"""SimpleCIL and APER against their official code (zhoudw-zdw/RevisitingCIL), end to end.

tests/fixtures/official_aper.npz holds the official code's run (tests/official/aper/make_fixture.py:
the tiny timm ViT, 6 classes in 3 tasks of tiny images, no augmentation, each task's training
set one batch): its initial adapters and cosine head, the adapters and head after APER's
first-session adaptation (3 SGD epochs), the prototypes (the classifier's weight) and the test
predictions after every task, and the accuracy matrix. Our trainer runs the same images (an
image folder), weights and settings with the official initial adapters and head copied in, and
must give the same numbers (docs/algorithm.md §20 has the table of tolerances).
"""

from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from PIL import Image
from test_input_files import _tiny_augreg_config

from aepg_jax import methods
from aepg_jax.continual import trainer
from aepg_jax.data import augment
from aepg_jax.methods import aper, base, simplecil
from aepg_jax.models import head

FIXTURES = Path(__file__).parent / "fixtures"
TASKS, PER_TASK = 3, 2


@pytest.fixture(scope="module")
def official():
    with np.load(FIXTURES / "official_aper.npz") as data:
        return {k: data[k] for k in data.files}


@pytest.fixture(scope="module")
def folder(official, tmp_path_factory):
    """The fixture's images as an image folder `{train,test}/c<label>/<index>.png`."""
    root = tmp_path_factory.mktemp("official_aper")
    for split in ("train", "test"):
        for i, (image, label) in enumerate(
            zip(official[f"{split}_images"], official[f"{split}_labels"], strict=True)
        ):
            where = root / split / f"c{label}"
            where.mkdir(parents=True, exist_ok=True)
            Image.fromarray(image).save(where / f"{i:04d}.png")
    return root


def _config(folder, tmp_path, method):
    c = _tiny_augreg_config(FIXTURES / "timm_tiny_vit.npz")
    c.method.name = method
    c.model.peft.update(dict(kind="adapter", adapter_style="ffn", adapter_dim=8, blocks=(0, 1)))
    c.data.update(
        dict(source="folder", name="official_aper", data_dir=str(folder), num_tasks=TASKS,
             cache_dir=str(tmp_path / "cache"), crop_scale=(1.0, 1.0), crop_ratio=(1.0, 1.0),
             flip_prob=0.0)
    )  # fmt: skip
    c.input.normalize = "none"  # the official code's ToTensor, no normalisation
    c.loss.name = "ce"
    c.optim.update(
        dict(optimizer="sgd", learning_rate=2.0, momentum=0.9, weight_decay=5e-4,
             lr_schedule="cosine_annealing", epochs=3, batch_size=24, peft_freeze_epochs=0)
    )  # fmt: skip
    c.eval.batch_size = 48
    c.tensorboard = False
    return c


def _official_peft(official, prefix):
    """The official adapters `{prefix}convnet.blocks.i.adaptmlp.*` as our PEFT tree."""
    blocks = {}
    for i in range(2):
        k = f"{prefix}convnet.blocks.{i}.adaptmlp."
        blocks[f"encoderblock_{i}"] = {
            "adapter": {
                "down": {"kernel": official[k + "down_proj.weight"].T,
                         "bias": official[k + "down_proj.bias"]},
                "up": {"kernel": official[k + "up_proj.weight"].T,
                       "bias": official[k + "up_proj.bias"]},
            }
        }  # fmt: skip
    return {"Transformer": blocks}


def _run(folder, tmp_path, monkeypatch, official, method):
    """Our run with the official initial adapters and head; `(results, [(trainable, state,
    frozen) after each task])`."""
    recorded = []
    end_task = simplecil.Prototypes.end_task

    def record(self, task, trainable, state, ctx):
        state = end_task(self, task, trainable, state, ctx)
        recorded.append((trainable, state, ctx.frozen))
        return state

    monkeypatch.setattr(simplecil.Prototypes, "end_task", record)
    grow = aper.Aper.grow

    def official_init(self, task, trainable, key):
        trainable = grow(self, task, trainable, key)
        if task == 0:
            peft = _official_peft(official, "aper/init/")
            flat = jax.tree_util.tree_flatten_with_path(trainable)[0]
            assert any("adapter" in jax.tree_util.keystr(p) for p, _ in flat)
            trainable = _replace(trainable, peft)
            # Task 0's classes: the official head's rows, as task 0's head kernel (D, n).
            task_0 = {
                **trainable["head"]["task_0"],
                "kernel": jnp.asarray(official["aper/init/fc.weight"].T, jnp.float32),
            }
            trainable["head"] = {**trainable["head"], "task_0": task_0}
            trainable[head.COSINE_SCALE] = jnp.asarray(official["aper/init/fc.sigma"][0])
        return trainable

    monkeypatch.setattr(aper.Aper, "grow", official_init)
    results = trainer.run(_config(folder, tmp_path, method), str(tmp_path / method))
    return results, recorded


def _replace(tree, values):
    """`tree` with the leaves of `values` (a subtree of the same paths) put in, same dtypes."""
    out = dict(tree)
    for k, v in values.items():
        out[k] = _replace(tree[k], v) if isinstance(v, dict) else jnp.asarray(v, tree[k].dtype)
    return out


def _predictions(method, trainable, state, frozen, official, task):
    images = augment.test_transform(jnp.asarray(official["test_images"]), 32, "none")
    spec = base.TaskSpec(task, task * PER_TASK, PER_TASK, 0, (PER_TASK,) * TASKS)
    keep = official["test_labels"] < (task + 1) * PER_TASK
    probs, _ = method.predict(None, trainable, frozen, state, images, spec)
    return np.asarray(jnp.argmax(probs["model"], -1))[keep]


@pytest.mark.slow
@pytest.mark.parametrize("name", ["simplecil", "aper"])
def test_matches_the_official_code_end_to_end(name, official, folder, tmp_path, monkeypatch):
    results, recorded = _run(folder, tmp_path, monkeypatch, official, name)
    assert len(recorded) == TASKS
    method = methods.get(name)(_config(folder, tmp_path, name))
    for t, (trainable, state, frozen) in enumerate(recorded):
        seen = (t + 1) * PER_TASK
        # The prototypes: the official classifier's weight rows of the classes seen so far.
        ours = np.asarray(simplecil.Prototypes.class_sums(state).means())
        np.testing.assert_allclose(
            ours[:seen], official[f"{name}/prototypes_{t}"][:seen], rtol=1e-4, atol=2e-5
        )
        assert not np.any(ours[seen:])  # later classes: no statistics yet
        pred = _predictions(method, trainable, state, frozen, official, t)
        np.testing.assert_array_equal(pred, official[f"{name}/pred_{t}"])
    if name == "aper":
        trainable = recorded[0][0]
        adapted = _official_peft(official, "aper/adapted/")
        for i in range(2):
            ours, theirs = (
                tree["Transformer"][f"encoderblock_{i}"]["adapter"] for tree in (trainable, adapted)
            )
            for part in ("down", "up"):
                for leaf in ("kernel", "bias"):
                    np.testing.assert_allclose(
                        ours[part][leaf], theirs[part][leaf], rtol=1e-4, atol=1e-6
                    )
        kernel = trainable["head"]["task_0"]["kernel"]
        np.testing.assert_allclose(
            kernel.T, official["aper/adapted/fc.weight"], rtol=1e-4, atol=1e-6
        )
        sigma = trainable[head.COSINE_SCALE]
        np.testing.assert_allclose(sigma, official["aper/adapted/fc.sigma"][0], rtol=1e-5)
        # Frozen after task 0: the PEFT leaves of the last task are those after adaptation.
        last = recorded[-1][0]["Transformer"]
        assert jax.tree.all(jax.tree.map(np.array_equal, last, trainable["Transformer"]))
    matrix = np.asarray(results["accuracy_matrix"], float)  # NaN below the diagonal
    upper = np.triu(np.ones((TASKS, TASKS), bool))
    np.testing.assert_allclose(matrix[upper], official[f"{name}/accuracy_matrix"][upper], atol=1e-6)
