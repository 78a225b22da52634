"""DualPrompt (docs/algorithm.md §12), as JH-LEE-KR/dualprompt-pytorch runs it (the code the paper
cites; identical settings in google-research/l2p configs/imr_dualprompt.py).

- G-prompt on blocks `dualprompt_g_blocks` (0, 1): G_l (2, L_g, D), L_g = `dualprompt_g_length`
  (5) key and L_g value tokens per block, shared by every task and sample.
- E-prompt on blocks `dualprompt_e_blocks` (2, 3, 4): a pool of M = `dualprompt_pool_size` (10)
  slots, E_l (2, M, L_e, D), L_e = `dualprompt_e_length` (20) key and L_e value tokens per slot,
  and one key per slot K (M, D) shared by the blocks. All ~ U(-1, 1).
- Training task t uses slot t (task identity); evaluation after task t uses slot
  `argmax_{j <= t} cos(q, K_j)` per sample, among the seen tasks' keys only (a decision,
  docs/algorithm.md §12; the reference also scores the untrained future keys).
- Before task t >= 1, slot t's prompts become a copy of slot t-1's (`shared_prompt_pool`; the
  keys are not copied).
- Loss term (pull): `-w sum_b cos(q_b, K_t) / B`, w = `dualprompt_pull_weight` (1).
A block in both lists gets the e-prompt's tokens then the g-prompt's.

Departure from dualprompt-pytorch (measured against its `prompt.py`, kept deliberately): its
E-prompt gathers slots as (layers, 2, B, ...) and reshapes that to (layers, B, 2, ...) without a
permute (reported in its issue tracker), so samples 0..B/2-1 of a batch get key tokens as both
their keys and values and samples B/2..B-1 value tokens as both (each pair taken from two
neighbouring samples' slots). Here each sample's keys are its slot's key half and its values
the value half, as google-research/l2p's JAX code and the DualPrompt paper have it.

Domain-incremental (`data.scenario=domain`, docs/algorithm.md §17): runs. Task t (domain t)
trains slot t and its key, and evaluation picks a slot per sample by its key, as in the class
scenario; the one head covers every class (`prompting.py`).
"""

from __future__ import annotations

from typing import Any, ClassVar

import jax
import jax.numpy as jnp
import ml_collections

from aepg_jax.methods import prompting
from aepg_jax.methods.base import Params, TaskContext, TaskSpec
from aepg_jax.methods.blocks import block_problems
from aepg_jax.models import vit

# DualPrompt's reference run (dualprompt-pytorch main.py, configs/imr_dualprompt.py): Adam at
# 0.005 * batch / 256 (4.6875e-4 at batch 24), constant, gradient norm clipped at 1.0.
DUALPROMPT_SETTINGS: dict[str, Any] = {
    "optim.learning_rate": 0.005 * 24 / 256,
    "optim.batch_size": 24,
    "optim.epochs": 50,
    "optim.peft_freeze_epochs": 0,
    "optim.lr_schedule": "constant",
    "optim.clip_norm": 1.0,
}


def slots(q: jax.Array, keys: jax.Array, seen: jax.Array | int) -> jax.Array:
    """Each query's e-prompt slot (B,) at test time: the nearest of the first `seen` keys
    (`seen` may be traced: the others are masked to -inf)."""
    s = prompting.cosine(q, keys)
    return jnp.argmax(jnp.where(jnp.arange(keys.shape[0]) < seen, s, -jnp.inf), axis=-1)


class DualPrompt(prompting.PromptMethod):
    """DualPrompt: a shared g-prompt and per-task e-prompts, prefix prompts."""

    name = "dualprompt"
    # dualprompt-pytorch's head: `nn.Linear` under timm's `init_weights_vit_timm`, trunc
    # N(0, 0.02^2), bias 0 (vision_transformer.py L471-482, L611-616); N(0, 0.001^2) before
    # `method.head_init`.
    official_head_init = "trunc_normal"
    head_init_before_field = "normal"
    reference_settings: ClassVar[dict[str, Any]] = DUALPROMPT_SETTINGS
    defaults: ClassVar[dict[str, Any]] = {
        "dualprompt_pool_size": 10,
        "dualprompt_g_length": 5,
        "dualprompt_e_length": 20,
        "dualprompt_g_blocks": (0, 1),
        "dualprompt_e_blocks": (2, 3, 4),
        "dualprompt_pull_weight": 1.0,
    }

    @classmethod
    def check(cls, cfg: ml_collections.ConfigDict) -> list[str]:
        m = cfg.method
        sizes = ("dualprompt_pool_size", "dualprompt_g_length", "dualprompt_e_length")
        p = prompting.positive_int_problems(m, sizes)
        if not m.dualprompt_pull_weight >= 0:
            p.append(f"method.dualprompt_pull_weight={m.dualprompt_pull_weight} must be >= 0.")
        if m.name == cls.name:
            for field in ("dualprompt_g_blocks", "dualprompt_e_blocks"):
                p += block_problems(field, m[field], cfg.model.depth, cls.defaults[field])
            if not p and m.dualprompt_pool_size < cfg.data.num_tasks:
                p.append(
                    f"method.dualprompt_pool_size={m.dualprompt_pool_size} must be >= "
                    f"data.num_tasks={cfg.data.num_tasks} (task t trains slot t)."
                )
        return p

    def init_prompts(self, key: jax.Array) -> Params:
        m, width = self.cfg.method, self.width
        n_g, n_e = len(self.blocks("dualprompt_g_blocks")), len(self.blocks("dualprompt_e_blocks"))
        k_g, k_e, k_keys = jax.random.split(key, 3)
        size = m.dualprompt_pool_size
        return {
            "g": prompting.uniform(k_g, (n_g, 2, m.dualprompt_g_length, width), -1.0, 1.0),
            "e": prompting.uniform(k_e, (n_e, 2, size, m.dualprompt_e_length, width), -1.0, 1.0),
            "keys": prompting.uniform(k_keys, (size, width), -1.0, 1.0),
        }

    def begin_task(
        self, task: TaskSpec, trainable: Params, state: Params, ctx: TaskContext
    ) -> tuple[Params, Params]:
        if task.index == 0:
            return trainable, state
        prompts = dict(trainable[prompting.PROMPT])
        e = prompts["e"]
        prompts["e"] = e.at[:, :, task.index].set(e[:, :, task.index - 1])
        return {**trainable, prompting.PROMPT: prompts}, state

    def prefixes(
        self, q: jax.Array, prompts: Params, task: int, train: bool
    ) -> tuple[vit.Prefixes, jax.Array | None]:
        batch = q.shape[0]
        if train:
            idx = jnp.full((batch,), task, jnp.int32)
            key = jax.lax.dynamic_slice_in_dim(prompts["keys"], task, 1)  # (1, D), task traced
            pull = jnp.sum(prompting.cosine(q, key)) / batch
            extra = -self.cfg.method.dualprompt_pull_weight * pull
        else:
            idx, extra = slots(q, prompts["keys"], task + 1), None
        g = prompts["g"]
        g_part = {
            block: tuple(jnp.broadcast_to(g[i, j], (batch, *g.shape[2:])) for j in (0, 1))
            for i, block in enumerate(self.blocks("dualprompt_g_blocks"))
        }
        e = prompts["e"]
        e_part = {
            block: (e[i, 0][idx], e[i, 1][idx])  # (B, L_e, D) each
            for i, block in enumerate(self.blocks("dualprompt_e_blocks"))
        }
        return prompting.concat_prefixes(e_part, g_part), extra
