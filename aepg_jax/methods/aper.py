"""APER (docs/algorithm.md §20): first-session adaptation, then SimpleCIL on merged features.

Task 0 trains the model's PEFT modules (`model.peft`; APER's default variant is the
AdaptFormer adapter, `model.peft.kind=adapter`, `adapter_style=ffn`, `adapter_dim=64` on every
block) together with a cosine head over the run's classes, with the configured loss:
    logits_c = sigma cos(f_adapted(x), w_c)      w_c ~ U(+-1/sqrt(D)), sigma learned (init 1)
(`models/head.py`'s `cosine_head`: w_c the task heads' kernel columns, drawn at task 0 from
the task's key as `CosineLinear` (C, D) over every class; the loss reads task 0's columns, the
classes the official code's head has at task 0). After
task 0 nothing trains (`trains_task(t)` is False for t >= 1); the adaptation head is discarded.
After every task t, for its classes c, over its training images under the test transform:
    p_c = mean_{i: y_i = c} [f_pretrained(x_i), f_adapted(x_i)]       (2D,), in that order
and an image is classified by `argmax_c cos([f_pretrained(x), f_adapted(x)], p_c)` over the
classes seen so far. f is the final-norm cls token; each feature enters unnormalised (the
cosine normalises the concatenation as a whole), as the official code's
`MultiBranchCosineIncrementalNet` does.

Domain-incremental (`data.scenario=domain`): runs; the first domain adapts the model, every
domain's images add to the class means (the paper is class-incremental only).

Trainable: the task heads (their kernels the adaptation head's weights, their biases unused),
`model.peft`'s leaves and the head's scale `cosine_scale`; all train at task 0 only. Method
state: the prototype sums and counts of `simplecil.Prototypes`, over 2D features.

The predictions are scores, not probabilities (`Method.scores`): the trained scale sigma belongs
to the adaptation head, discarded after task 0; the prototype classifier that predicts is a
cosine with no trained scale (the reference's `MultiBranchCosineIncrementalNet` builds a fresh
`CosineLinear`, sigma 1, and fills its weights with the prototypes). No calibration is reported
(docs/algorithm.md §4).
"""

from __future__ import annotations

from typing import ClassVar

import chex
import jax
import jax.numpy as jnp
import ml_collections

from aepg_jax.methods.base import Network, Params, TaskSpec
from aepg_jax.methods.simplecil import Prototypes, backbone_features
from aepg_jax.models import head as head_lib
from aepg_jax.models import partition


def adaptation_head(key: jax.Array, trainable: Params, width: int) -> Params:
    """`trainable` with the cosine head of torch's `CosineLinear.reset_parameters`: a weight
    ~ U(+-1/sqrt(D)) (C, D) as the task heads' kernels (D, n_t), sigma = 1."""
    bound = 1.0 / width**0.5
    sizes = head_lib.head_sizes(trainable)
    weight = jax.random.uniform(key, (sum(sizes), width), jnp.float32, -bound, bound)
    kernels = head_lib.unstack(weight.T, jnp.zeros(sum(sizes)), sizes)
    heads = {
        name: {**h, "kernel": kernels[name]["kernel"]} for name, h in trainable["head"].items()
    }
    return head_lib.with_cosine_scale({**trainable, "head": heads})


class Aper(Prototypes):
    """APER: the PEFT modules adapted on task 0, prototypes of [pretrained, adapted] features."""

    name = "aper"
    layout = head_lib.COSINE_LAYOUT
    eval_forwards: ClassVar[int] = 2  # the pretrained and the adapted backbone
    scores: ClassVar[dict[str, str]] = {
        "model": "cosine similarities to the class means, in [-1, 1]; the trained scale sigma "
        "left with the adaptation head after task 0"
    }

    def __init__(self, cfg: ml_collections.ConfigDict):
        super().__init__(cfg)
        self.adapted = Network(cfg.model)

    @classmethod
    def check(cls, cfg: ml_collections.ConfigDict) -> list[str]:
        if cfg.method.name == cls.name and cfg.model.peft.kind == "none":
            return [
                "method.name=aper adapts a PEFT module on the first task but "
                "model.peft.kind=none; set model.peft.kind (adapter: APER's default, with "
                "model.peft.adapter_style=ffn)."
            ]
        return []

    def trains_task(self, task: int) -> bool:
        return task == 0

    @property
    def feature_dim(self) -> int:
        return 2 * int(self.cfg.model.hidden_size)

    def grow(self, task: int, trainable: Params, key: jax.Array) -> Params:
        """Task 0 draws the adaptation head (from `key`); later tasks add nothing."""
        width = int(self.cfg.model.hidden_size)
        return adaptation_head(key, trainable, width) if task == 0 else trainable

    def adapted_features(self, trainable: Params, frozen: Params, images: jax.Array) -> jax.Array:
        """The cls token (B, D) of the backbone with the PEFT modules."""
        return backbone_features(self.adapted, partition.merge(trainable, frozen), images)

    def features(self, trainable: Params, frozen: Params, images: jax.Array) -> jax.Array:
        """`[f_pretrained, f_adapted]` (B, 2D), the official code's branch order."""
        plain = backbone_features(self.plain, frozen, images)
        out = jnp.concatenate([plain, self.adapted_features(trainable, frozen, images)], -1)
        chex.assert_shape(out, (images.shape[0], self.feature_dim))
        return out

    def forward(
        self,
        net: Network,
        trainable: Params,
        frozen: Params,
        state: Params,
        images: jax.Array,
        task: TaskSpec,
    ) -> tuple[jax.Array, jax.Array | None]:
        """Task 0's training logits: `sigma cos(f_adapted, w_c)` over every class (C)."""
        return head_lib.cosine_head(
            trainable, self.adapted_features(trainable, frozen, images)
        ), None
