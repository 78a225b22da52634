"""SimpleCIL (docs/algorithm.md §19): a frozen backbone, class-mean prototypes, cosine classifier.

After each task t, for every class c of the task, over the task's training images x_i under the
test transform (no augmentation):
    p_c = mean_{i: y_i = c} f(x_i)                f: the backbone's final-norm cls token (D,)
and an image is classified by `argmax_c cos(f(x), p_c)` over the classes seen so far. Nothing
trains (`trains_task` is False for every task), so the results depend neither on the loss nor on
the optimiser; and since each class's prototype is the mean of its own images, they do not
depend on how the classes are cut into tasks either.

The prototypes are kept as per-class sums and counts (`prototypes.ClassSums`, shapes over every
class of the run from the start) in the method state: checkpointed and vmapped like any state,
so a resumed run continues from the same sums. The pass over a task's images is one jitted
program for the run (`prototypes.sums_step`).

`Prototypes` is the shared scaffold of the methods that classify by class means: a subclass
gives its feature function (`features`, `feature_dim`), which tasks train, and what trains
(APER, `aper.py`). Domain-incremental (`data.scenario=domain`): a class's prototype is its mean
over the images of every domain seen so far (the method's papers are class-incremental only).

Trainable: the task heads (unused; the model's `model.peft` modules are not used). Method state:
`proto_sums` (C, F) and `proto_counts` (C,) float32, F = `feature_dim`.

The predictions are scores, not probabilities (`Method.scores`): cosines in [-1, 1] with no
trained scale, whose softmax is near uniform over C classes whatever the accuracy (SimpleCIL's
reference, the PyCIL `SimpleCosineIncrementalNet`, reads only their argmax); the run reports no
calibration for them (docs/algorithm.md §4).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import ClassVar

import chex
import jax
import jax.numpy as jnp
import ml_collections

from aepg_jax.methods import base, prototypes
from aepg_jax.methods.base import Method, Network, Params, TaskContext, TaskSpec
from aepg_jax.models import head


def plain_model_cfg(model_cfg: ml_collections.ConfigDict) -> ml_collections.ConfigDict:
    """The model config without PEFT modules: the pretrained backbone as loaded."""
    cfg = ml_collections.ConfigDict(model_cfg.to_dict())
    cfg.peft.kind = "none"
    return cfg


def backbone_features(net: Network, params: Params, images: jax.Array) -> jax.Array:
    """The final-norm cls token (B, D) of `params` (the heads and the cosine scale dropped),
    float32."""
    backbone = {k: v for k, v in params.items() if k not in ("head", head.COSINE_SCALE)}
    return net.apply(backbone, images, ())[1]["features"].astype(jnp.float32)


class Prototypes(Method):
    """Class-mean prototypes of `features` after every task, predicted by cosine similarity."""

    name = "prototypes"  # abstract: not registered
    scores: ClassVar[dict[str, str]] = {
        "model": "cosine similarities to the class means, in [-1, 1], with no trained scale"
    }
    task_data_passes: ClassVar[int] = 1  # the prototype pass, at end_task

    def __init__(self, cfg: ml_collections.ConfigDict):
        super().__init__(cfg)
        self.plain = Network(plain_model_cfg(cfg.model))

    # -- what a subclass changes -----------------------------------------------------------

    @property
    def feature_dim(self) -> int:
        return int(self.cfg.model.hidden_size)

    def features(self, trainable: Params, frozen: Params, images: jax.Array) -> jax.Array:
        """The features the prototypes average and the classifier compares (B, F)."""
        return backbone_features(self.plain, frozen, images)

    # -- state -------------------------------------------------------------------------------

    def init_state(self, trainable: Params) -> Params:
        sums = prototypes.ClassSums.zeros(head.num_classes(trainable), self.feature_dim)
        return {"proto_sums": sums.sums, "proto_counts": sums.counts}

    @staticmethod
    def class_sums(state: Params) -> prototypes.ClassSums:
        return prototypes.ClassSums(state["proto_sums"], state["proto_counts"])

    # -- host side -------------------------------------------------------------------------

    def end_task(
        self, task: TaskSpec, trainable: Params, state: Params, ctx: TaskContext
    ) -> Params:
        """Adds the task's training images' features to their classes' sums."""
        sums = prototypes.accumulate(
            self._sums_program(),
            (trainable, ctx.frozen),
            ctx,
            self.class_sums(state),
            desc=f"task {task.index + 1} {self.name} prototypes",
        )
        chex.assert_equal_shape((sums.sums, state["proto_sums"]))
        return {**state, "proto_sums": sums.sums, "proto_counts": sums.counts}

    def _sums_program(self) -> prototypes.SumsStep:
        """The prototype pass's program: the fit check compiles the one `end_task` calls."""
        return self.compiled("class_sums_step", prototypes.sums_step(self._features_of, self.cfg))

    def _features_of(self, params: tuple[Params, Params], images: jax.Array) -> jax.Array:
        return self.features(params[0], params[1], images)

    def host_programs(
        self, trainable: Params, state: Params, frozen: Params, batch, task: int
    ) -> dict[str, tuple[Callable, tuple, int]]:
        """The prototype pass, once per task (`end_task`)."""
        sums = base.on_mesh(self.class_sums(state), trainable)
        return {"prototypes": (self._sums_program(), (sums, (trainable, frozen), batch), 1)}

    # -- inside the jitted programs --------------------------------------------------------

    def logits(
        self, trainable: Params, frozen: Params, state: Params, images: jax.Array
    ) -> jax.Array:
        """(B, C) cosines between the images' features and every class's prototype (0 for a
        class not seen yet)."""
        feats = self.features(trainable, frozen, images)
        return head.cosine_logits(feats, self.class_sums(state).means())

    def forward(
        self,
        net: Network,
        trainable: Params,
        frozen: Params,
        state: Params,
        images: jax.Array,
        task: TaskSpec,
    ) -> tuple[jax.Array, jax.Array | None]:
        return self.logits(trainable, frozen, state, images), None

    def predict(
        self,
        net: Network,
        trainable: Params,
        frozen: Params,
        state: Params,
        images: jax.Array,
        task: TaskSpec,
    ) -> tuple[dict[str, jax.Array], jax.Array]:
        return base.predictions(self.logits(trainable, frozen, state, images), task)


class SimpleCIL(Prototypes):
    """SimpleCIL: prototypes of the pretrained backbone's features; no task trains."""

    name = "simplecil"
    uses_model_peft: ClassVar[bool] = False

    def trains_task(self, task: int) -> bool:
        return False

    def grow(self, task: int, trainable: Params, key: jax.Array) -> Params:
        """The heads alone: the model's PEFT leaves are dropped (nothing trains)."""
        return base.heads_of(trainable)
