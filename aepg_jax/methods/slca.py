"""SLCA (docs/algorithm.md §24; GengDavid/SLCA `models/slca.py`): slow learner with classifier
alignment.

Slow learner: the whole backbone trains (full fine-tuning: its copy under `finetuned/`,
`Method.finetunes_backbone`) at `method.slca_backbone_lr_scale` times the head's learning rate
(the reference's two SGD parameter groups, `bcb_lrscale` 0.01), with the configured loss on the
task's own head (the reference's cross-entropy over `logits[:, known:]`). As the reference's
`vit_base_patch16_224_in21k` (`convs/vits.py`), the final LayerNorm starts fresh (scale 1, bias
0: it deletes the pretrained one) when `method.slca_fresh_final_norm`.

After each task t (`end_task`), with f the fine-tuned backbone's final-norm cls token over the
task's training images (test transform):
  1. the classifier as trained (the task's head; earlier heads as they were before their own
     alignment, the reference's `fc.backup()` / `fc.recall()`) is kept as `heads`;
  2. each class of the task gets its Gaussian statistics (`class_gaussians`; covariance
     unbiased + 1e-4 I); earlier classes keep theirs, from the backbone of their own task;
  3. for t >= 1, classifier alignment: for each of `slca_ca_epochs` epochs, `slca_ca_samples`
     features per seen class c drawn from N(mu_c (0.9 + 0.1 (t_c + 1) / (t + 1)), Sigma_c)
     (t_c: c's task), shuffled, in batches of `slca_ca_samples`, train `heads` (all seen
     classes) by SGD (momentum, weight decay and lr of `optim.*`, cosine to 0 over the
     epochs) on cross-entropy of the per-task-normalised logits / `slca_ca_logit_norm`;
  4. predictions use the aligned classifier (`aligned`; at t = 0, `heads`).
Non-finite statistics of a task's class, or a NaN alignment (a covariance that float32's Cholesky
cannot factor), end the run in one line naming the class and its task
(`class_gaussians.check_statistics`, `check_alignment`).
Each task's new head starts from its initial draw (the reference creates it at the task's start:
weight decay of earlier tasks must not have shrunk it).

Class-incremental only (the reference's scenario). Method state (fixed shapes, every class of the
run): the statistics (C, D), (C,), (C, D, D); `heads`, `aligned` and the initial heads, each a
kernel (D, C) and bias (C,).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, ClassVar

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np

from aepg_jax.methods import base, class_gaussians, prototypes
from aepg_jax.methods.base import Method, Network, Params, TaskContext, TaskSpec
from aepg_jax.methods.simplecil import plain_model_cfg
from aepg_jax.models import head, partition

RIDGE = 1e-4  # models/base.py `_compute_class_mean`: torch.cov(...) + eye * 1e-4
MEAN_SHRINK = 0.9  # models/slca.py `_stage2_compact_classifier`: mean * (0.9 + decay)

# exps/slca/slca_*.json with models/slca.py's globals: SGD (momentum 0.9, weight decay 5e-4)
# at lr 0.01 for the head and 0.01 x 0.01 for the backbone, batch 128, MultiStepLR (gamma 0.1)
# at the config's milestone, no head-only epochs, no clipping. Epochs and milestones are per
# dataset (cifar 20 / [18], imagenet-r 50 / [40]): set by the experiment.
SLCA_SETTINGS: dict[str, Any] = {
    "optim.optimizer": "sgd",
    "optim.momentum": 0.9,
    "optim.learning_rate": 0.01,
    "optim.weight_decay": 5e-4,
    "optim.lr_schedule": "multistep",
    "optim.lr_decay": 0.1,
    "optim.batch_size": 128,
    "optim.peft_freeze_epochs": 0,
    "optim.clip_norm": 0.0,
}


def _columns(classifier: Params, lo: jax.Array, width: int) -> Params:
    """Columns `[lo, lo + width)` of a classifier `{"kernel" (D, C), "bias" (C,)}`."""
    return {
        "kernel": jax.lax.dynamic_slice_in_dim(classifier["kernel"], lo, width, axis=1),
        "bias": jax.lax.dynamic_slice_in_dim(classifier["bias"], lo, width),
    }


class SLCA(Method):
    """Full fine-tuning at a slow backbone rate, classifier alignment from class Gaussians."""

    name = "slca"
    # `SimpleContinualLinear`: `trunc_normal_(std=.02)`, bias 0 (convs/linears.py);
    # N(0, 0.001^2) before `method.head_init`.
    official_head_init = "trunc_normal"
    head_init_before_field = "normal"
    uses_model_peft: ClassVar[bool] = False
    finetunes_backbone: ClassVar[bool] = True
    grows_on_host: ClassVar[bool] = True  # `grow` only drops leaves: no program to compile
    task_data_passes: ClassVar[int] = 1  # the statistics pass, at end_task
    reference_settings: ClassVar[dict[str, Any]] = SLCA_SETTINGS
    defaults: ClassVar[dict[str, Any]] = {
        "slca_backbone_lr_scale": 0.01,  # `bcb_lrscale`: backbone lr / head lr
        "slca_ca_epochs": 5,  # `ca_epochs`; 0: no alignment
        "slca_ca_samples": 256,  # `num_sampled_pcls`: features per class per epoch (= batch)
        "slca_ca_logit_norm": 0.1,  # `ca_with_logit_norm`: temperature; 0: plain logits
        "slca_fresh_final_norm": True,  # the reference replaces the final LayerNorm
    }

    def __init__(self, cfg: ml_collections.ConfigDict):
        super().__init__(cfg)
        self.plain = Network(plain_model_cfg(cfg.model))

    @property
    def lr_scales(self) -> dict[str, float]:
        return {partition.FINETUNED: float(self.cfg.method.slca_backbone_lr_scale)}

    @classmethod
    def check(cls, cfg: ml_collections.ConfigDict) -> list[str]:
        m, p = cfg.method, []
        if not m.slca_backbone_lr_scale > 0:
            p.append(
                f"method.slca_backbone_lr_scale={m.slca_backbone_lr_scale} must be > 0 "
                "(SLCA fine-tunes the backbone; a frozen one is method.name=plain)."
            )
        if m.slca_ca_epochs < 0 or m.slca_ca_samples < 1:
            p.append("method.slca_ca_epochs must be >= 0 and method.slca_ca_samples >= 1.")
        if m.slca_ca_logit_norm < 0:
            p.append(f"method.slca_ca_logit_norm={m.slca_ca_logit_norm} must be >= 0 (0: off).")
        if cfg.method.name == cls.name and cfg.data.get("scenario", "class") != "class":
            p.append("method.name=slca is class-incremental only; set data.scenario=class.")
        return p

    # -- state -------------------------------------------------------------------------------

    def init_state(self, trainable: Params) -> Params:
        kernel, bias = head.stack(trainable["head"], head.head_sizes(trainable))
        num_classes, dim = bias.shape[0], kernel.shape[0]
        stats = class_gaussians.ClassGaussians.zeros(num_classes, dim)
        return {
            "stats": {"sums": stats.sums, "counts": stats.counts, "m2": stats.m2},
            "initial": {"kernel": kernel, "bias": bias},
            "heads": {"kernel": kernel, "bias": bias},
            "aligned": {"kernel": kernel, "bias": bias},
        }

    @staticmethod
    def stats(state: Params) -> class_gaussians.ClassGaussians:
        return class_gaussians.ClassGaussians(**state["stats"])

    # -- host side -------------------------------------------------------------------------

    def begin_task(
        self, task: TaskSpec, trainable: Params, state: Params, ctx: TaskContext
    ) -> tuple[Params, Params]:
        """Task t's head back to its initial draw; at task 0 the fresh final LayerNorm."""
        t = int(task.index)
        sizes = task.head_sizes
        heads = dict(trainable["head"])
        lo = jnp.asarray(sum(sizes[:t]), jnp.int32)  # traced: one program per head width
        columns = self.compiled("_columns", _columns, static_argnums=2)
        heads[head.task_name(t)] = columns(state["initial"], lo, sizes[t])
        trainable = {**trainable, "head": heads}
        if t == 0 and self.cfg.method.slca_fresh_final_norm:
            backbone = trainable[partition.FINETUNED]
            norm = backbone["Transformer"]["encoder_norm"]
            fresh = {"scale": jnp.ones_like(norm["scale"]), "bias": jnp.zeros_like(norm["bias"])}
            transformer = {**backbone["Transformer"], "encoder_norm": fresh}
            trainable = {**trainable, partition.FINETUNED: {**backbone, "Transformer": transformer}}
        return trainable, state

    def grow(self, task: int, trainable: Params, key: jax.Array) -> Params:
        """The heads and the backbone copy alone: the model's PEFT leaves are dropped."""
        return {**base.heads_of(trainable), partition.FINETUNED: trainable[partition.FINETUNED]}

    def features(self, trainable: Params, images: jax.Array) -> jax.Array:
        """The fine-tuned backbone's final-norm cls token (B, D), float32."""
        out = self.plain.apply(trainable[partition.FINETUNED], images, ())[1]["features"]
        return out.astype(jnp.float32)

    def _features_of(self, trainable: Params, images: jax.Array) -> jax.Array:
        return self.features(trainable, images)

    def end_task(
        self, task: TaskSpec, trainable: Params, state: Params, ctx: TaskContext
    ) -> Params:
        """Keeps the trained heads, adds the task's class statistics, aligns (module doc)."""
        t, sizes = int(task.index), task.head_sizes
        stats = prototypes.accumulate(
            self.stats_step(),
            {partition.FINETUNED: trainable[partition.FINETUNED]},
            ctx,
            self.stats(state),
            desc=f"task {t + 1} slca statistics",
        )
        state = {**state, "stats": {"sums": stats.sums, "counts": stats.counts, "m2": stats.m2}}
        kernel, bias = head.stack(trainable["head"], sizes)
        lo, hi = sum(sizes[:t]), sum(sizes[: t + 1])
        current = (np.arange(bias.shape[0]) >= lo) & (np.arange(bias.shape[0]) < hi)
        class_gaussians.check_statistics("SLCA", state["stats"], current, sizes, t)
        heads = {
            "kernel": jnp.where(current, kernel, state["heads"]["kernel"]),
            "bias": jnp.where(current, bias, state["heads"]["bias"]),
        }
        state = {**state, "heads": heads, "aligned": heads}
        if t == 0 or self.cfg.method.slca_ca_epochs == 0:
            return state
        aligned = self.align_program(sizes)(state, ctx.key, jnp.asarray(t, jnp.int32))
        class_gaussians.check_alignment(
            "SLCA",
            aligned,
            self.stats(state).covariances(RIDGE),
            np.arange(bias.shape[0]) < hi,
            sizes,
            t,
            "method.slca_ca_epochs=0 skips the alignment",
        )
        return {**state, "aligned": aligned}

    def stats_step(self) -> class_gaussians.StatsStep:
        """The statistics pass, jitted once for the run."""
        step = class_gaussians.stats_step(self._features_of, self.cfg)
        return self.compiled("class_statistics", step)

    def align_program(self, head_sizes: tuple[int, ...]) -> Callable:
        """`align(state, key, t) -> {"kernel", "bias"}` after task t (traced), jitted once
        for the run (module doc, step 3)."""

        def slca_alignment(state: Params, key: jax.Array, t: jax.Array) -> Params:
            return self._align_fn(state, key, t, head_sizes=head_sizes)

        return self.compiled("slca_alignment", slca_alignment)

    def draw(
        self, state: Params, key: jax.Array, t: jax.Array, head_sizes: tuple[int, ...]
    ) -> tuple[jax.Array, jax.Array]:
        """The alignment's inputs after task `t`: per epoch, `slca_ca_samples` draws per class
        from N(mu_c (0.9 + 0.1 (t_c + 1) / (t + 1)), Sigma_c + 1e-4 I), the seen classes'
        draws shuffled into batches: features (E, C, n, D), labels (E, C, n) (batches of
        unseen classes last, skipped)."""
        m = self.cfg.method
        stats = self.stats(state)
        tasks = jnp.asarray(head.class_tasks(head_sizes))
        scale = MEAN_SHRINK + (tasks + 1) / (t + 1) * (1.0 - MEAN_SHRINK)
        means = stats.means() * scale[:, None]
        factors = class_gaussians.cholesky_factors(stats.covariances(RIDGE))
        seen = jnp.sum(tasks <= t)
        feats, labels = [], []
        for e in range(int(m.slca_ca_epochs)):
            k_draw, k_perm = jax.random.split(jax.random.fold_in(key, e))
            draws = class_gaussians.sample_factored(means, factors, int(m.slca_ca_samples), k_draw)
            f, y = class_gaussians.shuffled_batches(draws, seen, k_perm)
            feats.append(f)
            labels.append(y)
        return jnp.stack(feats), jnp.stack(labels)

    def _align_fn(
        self, state: Params, key: jax.Array, t: jax.Array, *, head_sizes: tuple[int, ...]
    ) -> Params:
        m, o = self.cfg.method, self.cfg.optim
        feats, labels = self.draw(state, key, t, head_sizes)
        seen = jnp.sum(jnp.asarray(head.class_tasks(head_sizes)) <= t)
        kernel, bias, _ = class_gaussians.align_classifier(
            state["heads"]["kernel"],
            state["heads"]["bias"],
            feats,
            labels,
            seen,
            seen,
            t + 1,
            head_sizes=head_sizes,
            learning_rate=float(o.learning_rate),
            momentum=float(o.momentum),
            weight_decay=float(o.weight_decay),
            temperature=float(m.slca_ca_logit_norm),
        )
        return {"kernel": kernel, "bias": bias}

    def host_programs(
        self, trainable: Params, state: Params, frozen: Params, batch, task: int
    ) -> dict[str, tuple[Callable, tuple, int]]:
        """The statistics pass (once per task) and the alignment (once per task >= 1; as
        RanPAC's per-task programs, `passes` counts per batch, an over-count)."""
        features = {partition.FINETUNED: trainable[partition.FINETUNED]}
        align = self.align_program(head.head_sizes(trainable))
        t = jnp.asarray(max(task, 1), jnp.int32)
        return {
            "statistics": (self.stats_step(), (self.stats(state), features, batch), 1),
            "alignment": (align, (state, jax.random.PRNGKey(0), t), 1),
        }

    # -- inside the jitted programs --------------------------------------------------------

    def forward(
        self,
        net: Network,
        trainable: Params,
        frozen: Params,
        state: Params,
        images: jax.Array,
        task: TaskSpec,
    ) -> tuple[jax.Array, jax.Array | None]:
        params = {**trainable[partition.FINETUNED], "head": trainable["head"]}
        logits, _ = self.plain.apply(params, images, task.head_sizes)
        return logits, None

    def predict(
        self,
        net: Network,
        trainable: Params,
        frozen: Params,
        state: Params,
        images: jax.Array,
        task: TaskSpec,
    ) -> tuple[dict[str, jax.Array], jax.Array]:
        feats = self.features(trainable, images)
        w, b = state["aligned"]["kernel"], state["aligned"]["bias"]
        logits = jnp.matmul(feats, w.astype(jnp.float32), precision=jax.lax.Precision.HIGHEST)
        return base.predictions(logits + b, task)
