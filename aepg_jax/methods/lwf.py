"""LwF (docs/algorithm.md §1, §7): distillation from a frozen copy taken before each task.

For tasks t >= 1 the loss gains `w * mean_b T^2 KL(softmax(z_old/T) || softmax(z_new/T))` over
the old classes' logits (those learned before task t, `TaskSpec.learned_before`), `z_old` from
the copy (heads of tasks 0..t-1) on the current batch; T = `method.lwf_temperature`,
w = `method.lwf_weight`. Method state: the copy's trainable leaves (PEFT + every head, those of
tasks >= t unchanged since their initialisation, so its logits of the old classes are the
previous model's), unused during task 0.

Domain-incremental (`data.scenario=domain`, docs/algorithm.md §17): runs. The old classes are
every class from task 1 on (each domain has them all), so the term distils the copy's whole
head, the previous domains' model, on the current domain's images.

Two choices to know when comparing with other LwF code:
- The old tasks' heads keep training (under the classification loss's softmax and the
  distillation term), as every trainable leaf does in LAE's optimizer, whose scope this
  follows; FACIL's LwF freezes them.
- The logged term is `T^2 KL = T^2 (H(p_old, p_new) - H(p_old))`. At T = 1 it has the gradient
  of Li & Hoiem's cross-entropy form `H(p_old, p_new)` but a value lower by the teacher's
  entropy `H(p_old)` (so it reaches 0 when the model matches its copy).
"""

from __future__ import annotations

from typing import Any, ClassVar

import jax
import jax.numpy as jnp
import ml_collections

from aepg_jax import losses
from aepg_jax.methods.base import Method, Network, Params, TaskContext, TaskSpec, copied
from aepg_jax.models import partition


class LwF(Method):
    """Learning without forgetting with the configured classification loss."""

    name = "lwf"
    extra_train_forwards = 1  # the frozen copy's logits on the batch
    defaults: ClassVar[dict[str, Any]] = {"lwf_temperature": 1.0, "lwf_weight": 1.0}

    @classmethod
    def check(cls, cfg: ml_collections.ConfigDict) -> list[str]:
        m, problems = cfg.method, []
        if not m.lwf_temperature > 0:
            problems.append(f"method.lwf_temperature={m.lwf_temperature} must be > 0.")
        if not m.lwf_weight >= 0:
            problems.append(f"method.lwf_weight={m.lwf_weight} must be >= 0.")
        return problems

    def init_state(self, trainable: Params) -> Params:
        # A copy from the start (run-static shapes); unused during task 0.
        return copied(trainable)

    def begin_task(
        self, task: TaskSpec, trainable: Params, state: Params, ctx: TaskContext
    ) -> tuple[Params, Params]:
        if task.index == 0:
            return trainable, state
        return trainable, copied(trainable)

    def forward(
        self,
        net: Network,
        trainable: Params,
        frozen: Params,
        state: Params,
        images: jax.Array,
        task: TaskSpec,
    ) -> tuple[jax.Array, jax.Array | None]:
        logits, _ = net.apply(partition.merge(trainable, frozen), images, task.head_sizes)
        m = self.cfg.method

        def distill(_):
            old, _ = net.apply(partition.merge(state, frozen), images, task.head_sizes)
            old_classes = jnp.arange(logits.shape[-1]) < task.learned_before
            d = losses.lwf_distillation(
                logits, old, m.lwf_temperature, where=jnp.broadcast_to(old_classes, logits.shape)
            )
            return m.lwf_weight * jnp.mean(d)

        # Task 0 (no old classes) skips the copy's forward pass: a branch, not a select.
        extra = jax.lax.cond(
            jnp.asarray(task.learned_before) > 0,
            distill,
            lambda _: jnp.zeros([], logits.dtype),
            None,
        )
        return logits, extra
