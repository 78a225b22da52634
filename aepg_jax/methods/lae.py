"""LAE (docs/algorithm.md §7): an online PEFT (trained), an offline PEFT (its EMA), one head.

- The offline PEFT is a copy of the online one made at the end of task 0.
- For tasks t >= 1 it follows every optimizer step, head-only steps included, scalars too:
  `e <- d e + (1 - d) m`, d = `method.ema_decay` (0.999, the paper's; LAE's code used 0.9999).
- Inference: `argmax_c max(softmax(f_on(x))_c, softmax(f_off(x))_c)` over the seen classes
  (`ensemble`, the primary predictor), with `online` and `offline` alone also reported. At task
  0 the offline copy equals the online PEFT, so all three agree. The ensemble's values are
  scores, not probabilities (they sum to between 1 and 2): no calibration is reported for it
  (docs/algorithm.md §4); `online` and `offline`, softmaxes of trained logits, have theirs, and
  the logged entropy is the online model's.

Domain-incremental (`data.scenario=domain`, docs/algorithm.md §17): runs unchanged. LAE already
shares one head; in this scenario that head covers every class, and the ensemble's maximum is
taken over all of them.
"""

from __future__ import annotations

from typing import Any, ClassVar

import jax
import jax.numpy as jnp
import ml_collections

from aepg_jax.methods.base import (
    Method,
    Network,
    Params,
    TaskContext,
    TaskSpec,
    copied,
    heads_of,
    mask_unseen,
    peft_of,
    softmax_probs,
)
from aepg_jax.models import partition


class LAE(Method):
    """Learning-accumulation-ensemble: method state = the offline PEFT (the initial PEFT until
    task 0 ends, when it becomes the trained one)."""

    name = "lae"
    predictors = ("ensemble", "online", "offline")
    # The ensemble's "probabilities" are the elementwise max of two softmaxes (gqk/LAE's
    # `torch.max(online.softmax(1), offline.softmax(1))`), read for their argmax only.
    scores: ClassVar[dict[str, str]] = {
        "ensemble": "the elementwise max of the online and offline softmaxes, which sums to "
        "between 1 and 2 over the classes"
    }
    logged_predictor: ClassVar[str | None] = "online"  # `predict` returns the online logits
    eval_forwards = 2  # online and offline PEFT
    defaults: ClassVar[dict[str, Any]] = {"ema_decay": 0.999}

    @classmethod
    def check(cls, cfg: ml_collections.ConfigDict) -> list[str]:
        d = cfg.method.ema_decay
        return [] if 0.0 <= d < 1.0 else [f"method.ema_decay={d} must be in [0, 1)."]

    def init_state(self, trainable: Params) -> Params:
        # A copy of the PEFT from the start (run-static shapes); unused during task 0, which
        # ends by copying the trained PEFT over it.
        return copied(peft_of(trainable))

    def end_task(
        self, task: TaskSpec, trainable: Params, state: Params, ctx: TaskContext
    ) -> Params:
        if task.index == 0:
            return copied(peft_of(trainable))
        return state

    def after_step(self, trainable: Params, state: Params, task: TaskSpec) -> Params:
        d = self.cfg.method.ema_decay
        first = jnp.asarray(task.index) == 0  # task 0: the copy waits for the task's end
        return jax.tree.map(
            lambda e, m: jnp.where(first, e, d * e + (1.0 - d) * m), state, peft_of(trainable)
        )

    def predict(
        self,
        net: Network,
        trainable: Params,
        frozen: Params,
        state: Params,
        images: jax.Array,
        task: TaskSpec,
    ) -> tuple[dict[str, jax.Array], jax.Array]:
        online = net.apply(partition.merge(trainable, frozen), images, task.head_sizes)[0]
        offline_params = partition.merge(state, heads_of(trainable), frozen)
        offline = net.apply(offline_params, images, task.head_sizes)[0]
        online, offline = mask_unseen(online, task), mask_unseen(offline, task)
        p_on, p_off = softmax_probs(online), softmax_probs(offline)
        return {"ensemble": jnp.maximum(p_on, p_off), "online": p_on, "offline": p_off}, online
