"""Adding a method as docs/methods.md "How to add a method" says: one `Method` subclass built
from the shared pieces of `methods/base.py` and `models/head.py`, and one registry entry. The
tiny method below is SimpleCIL written again from those pieces (class means of the frozen
backbone's features after every task, cosine scores); its run equals SimpleCIL's."""

from __future__ import annotations

from typing import ClassVar

import jax.numpy as jnp
import numpy as np
from tiny import tiny_config

from aepg_jax import methods
from aepg_jax.continual import trainer
from aepg_jax.data import augment
from aepg_jax.methods import base
from aepg_jax.models import head


class ClassMeans(base.Method):
    """Nothing trains; after each task every class's mean feature, predicted by cosine."""

    name = "class_means"
    uses_model_peft: ClassVar[bool] = False  # the base logs that model.peft is not used

    def trains_task(self, task):
        return False

    def init_state(self, trainable):
        c, d = head.num_classes(trainable), int(self.cfg.model.hidden_size)
        return {"sums": jnp.zeros((c, d)), "counts": jnp.zeros((c,))}

    def features(self, net, frozen, images):
        return net.apply(frozen, images, ())[1]["features"].astype(jnp.float32)

    def end_task(self, task, trainable, state, ctx):
        cfg = self.cfg

        def batch_features(frozen, images):
            images = augment.test_transform(images, cfg.model.image_size, cfg.input.normalize)
            return self.features(ctx.net, frozen, images)

        step = self.compiled("class_means_features", batch_features)  # one program per run
        feats, labels = base.task_rows(ctx, lambda b: step(ctx.frozen, b["image"]), "means")
        sums, counts = np.array(state["sums"]), np.array(state["counts"])
        np.add.at(sums, labels, feats)
        np.add.at(counts, labels, 1.0)
        return base.on_mesh({"sums": sums, "counts": counts}, trainable)  # host-made leaves

    def predict(self, net, trainable, frozen, state, images, task):
        means = state["sums"] / jnp.maximum(state["counts"], 1.0)[:, None]
        return base.predictions(head.cosine_logits(self.features(net, frozen, images), means), task)


def test_a_method_of_the_shared_pieces_runs_and_equals_simplecil(tmp_path, monkeypatch):
    monkeypatch.setitem(methods.REGISTRY, ClassMeans.name, ClassMeans)
    overrides = {"data.num_tasks": 2, "model.peft.kind": "none"}
    cfg = tiny_config(tmp_path / "cache", **overrides)
    cfg.method.name = ClassMeans.name  # the config is unlocked: a test-only name
    ours = trainer.run(cfg, str(tmp_path / "ours"))
    theirs = trainer.run(
        tiny_config(tmp_path / "cache", **overrides, **{"method.name": "simplecil"}),
        str(tmp_path / "simplecil"),
    )
    assert len(ours["accuracy_matrix"]) == 2 and ours["predictors"] == ["model"]
    assert ours["accuracy_matrix"] == theirs["accuracy_matrix"]
    assert ours["compilations"]["programs"]["jit(class_means_features)"]["count"] == 1
