"""LAE (SPEC §7): an online PEFT (trained) and an offline PEFT (its EMA), one shared head.

- The offline PEFT is a copy of the online one made at the end of task 0.
- For tasks t >= 1 it follows every optimizer step, head-only steps included, scalars too:
  `e <- d e + (1 - d) m`, d = `method.ema_decay` (0.999, the paper's; LAE's code used 0.9999).
- Inference: `argmax_c max(softmax(f_on(x))_c, softmax(f_off(x))_c)` over the seen classes
  (`ensemble`, the primary predictor), with `online` and `offline` alone also reported. At task
  0 the offline copy equals the online PEFT, so all three agree.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, ClassVar

import jax
import jax.numpy as jnp
import ml_collections

from aepg_jax import partition
from aepg_jax.continual.methods.base import (
    Method,
    Network,
    Params,
    TaskContext,
    TaskSpec,
    heads_of,
    peft_of,
    softmax_probs,
)


class LAE(Method):
    """Learning-accumulation-ensemble: method state = the offline PEFT (`{}` until task 0 ends)."""

    name = "lae"
    predictors = ("ensemble", "online", "offline")
    eval_forwards = 2  # online and offline PEFT
    defaults: ClassVar[dict[str, Any]] = {"ema_decay": 0.999}

    @classmethod
    def check(cls, cfg: ml_collections.ConfigDict) -> list[str]:
        d = cfg.method.ema_decay
        return [] if 0.0 <= d < 1.0 else [f"method.ema_decay={d} must be in [0, 1)."]

    def state_like(self, task: int, phase: str, trainable_at: Callable[[int], Params]) -> Params:
        if task == 0 and phase == "in_task":
            return {}
        return peft_of(trainable_at(task))

    def end_task(
        self, task: TaskSpec, trainable: Params, state: Params, ctx: TaskContext
    ) -> Params:
        if task.index == 0:
            return jax.tree.map(jnp.copy, peft_of(trainable))
        return state

    def after_step(self, trainable: Params, state: Params, task: TaskSpec) -> Params:
        if task.index == 0:
            return state
        d = self.cfg.method.ema_decay
        return jax.tree.map(lambda e, m: d * e + (1.0 - d) * m, state, peft_of(trainable))

    def predict(
        self,
        net: Network,
        trainable: Params,
        frozen: Params,
        state: Params,
        images: jax.Array,
        head_sizes: tuple[int, ...],
        num_seen: int,
    ) -> tuple[dict[str, jax.Array], jax.Array]:
        online = net.apply(partition.merge(trainable, frozen), images, head_sizes)[0]
        offline_params = partition.merge(state, heads_of(trainable), frozen)
        offline = net.apply(offline_params, images, head_sizes)[0]
        online, offline = online[:, :num_seen], offline[:, :num_seen]
        p_on, p_off = softmax_probs(online), softmax_probs(offline)
        return {"ensemble": jnp.maximum(p_on, p_off), "online": p_on, "offline": p_off}, online
