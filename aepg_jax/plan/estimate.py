"""An analytic cost of a run from its config alone (no data, no compile): the sweep's order.

    cost = sum over images the run processes x backbone FLOPs per image

FLOPs of one forward pass of the ViT (multiply-add = 2 FLOPs), with N = (image / patch)^2 + 1
tokens, width D, MLP width M, depth L, C channels:
    F = 2 N p^2 C D + L (2 N (4 D^2 + 2 D M) + 4 N^2 D)
Images, as the plan counts calls (`plan/project.py`): per task, `optim.epochs` x the task's
full batches (capped by `max_steps_per_task`) x `optim.batch_size`; a head-only step costs one
forward pass, a PEFT step three (forward + backward), plus the method's
`extra_train_forwards`; after task t the test images of tasks 0..t, `eval_forwards` passes
each; `task_data_passes` forward passes over each task's training images; all x `num_seeds`.
Tasks are taken as equal shares of the dataset's training and test examples.
"""

from __future__ import annotations

import math

import ml_collections

from aepg_jax import methods
from aepg_jax.data import datasets


def forward_flops(model: ml_collections.ConfigDict) -> float:
    """FLOPs of one image's forward pass through the ViT of `model` (formula above)."""
    n = (model.image_size // model.patch_size) ** 2 + 1
    d, m, depth = model.hidden_size, model.mlp_dim, model.depth
    embed = 2 * n * model.patch_size**2 * model.num_channels * d
    return float(embed + depth * (2 * n * (4 * d * d + 2 * d * m) + 4 * n * n * d))


def dataset_sizes(cfg: ml_collections.ConfigDict) -> tuple[int, int] | None:
    """(train, test) examples of the config's dataset; None where unknown."""
    from aepg_jax.plan import shapes

    d = cfg.data
    shipped = datasets.shipped_labels(d)
    if shipped is not None:
        return len(shipped[0]), len(shipped[1])
    found = shapes.SIZES.get(datasets.size_key(d))
    return None if found is None else found[:2]


def run_flops(cfg: ml_collections.ConfigDict) -> float | None:
    """The run's estimated FLOPs (module docstring); None for a config it cannot size (a
    trainer other than the continual one, an unknown dataset)."""
    if cfg.trainer != "continual":
        return None
    sizes = dataset_sizes(cfg)
    if sizes is None:
        return None
    n_train, n_test = sizes
    o, tasks = cfg.optim, cfg.data.num_tasks
    method = methods.get(cfg.method.name)
    per_task = n_train // tasks
    steps = o.epochs * (per_task // o.batch_size)
    if cfg.max_steps_per_task:
        steps = min(steps, cfg.max_steps_per_task)
    freeze = int(steps * o.peft_freeze_epochs / o.epochs)
    extra = method.extra_train_forwards
    # Task 0 trains its PEFT from the first step; tasks 1.. begin head-only.
    train = tasks * steps * (3 + extra) - (tasks - 1) * freeze * 2
    images = train * o.batch_size
    images += method.eval_forwards * n_test / tasks * tasks * (tasks + 1) / 2
    images += method.task_data_passes * n_train
    return images * forward_flops(cfg.model) * cfg.num_seeds


def describe(flops: float | None) -> str:
    if flops is None or not math.isfinite(flops):
        return "cost unknown"
    return f"{flops / 1e15:.3g} PFLOP"
