"""SD-LoRA (docs/algorithm.md §23): per task a new LoRA on Q and V; earlier tasks' directions
frozen and normalised, their magnitudes learned.

In each block b of `method.sd_lora_blocks` (cut at the depth), at task t, with x the block's
attention input and P in {q, v}:
    P = x W_P + alpha_t (x A_{P,t}^T) B_{P,t}^T
              + sum_{s<t} alpha'_s (x A_{P,s}^T) B_{P,s}^T / (||B_{P,s}||_F ||A_{P,s}||_F)
A_{P,t} (r, D) ~ U(+-1/sqrt(D)) (torch's kaiming_uniform(a=sqrt 5)), B_{P,t} (D, r) = 0, both
trained with the magnitudes alpha_t and alpha'_{0..t-1} (scalars shared by every block and by
Q and V) and the task's head; A_s, B_s of earlier tasks are frozen. The official code
(WuYichen-97/SD-Lora-CL) builds a new network at every task, so every magnitude restarts at
`method.sd_lora_magnitude_init` (0.8) at each task; after task t the state keeps A_t, B_t and
the magnitudes (row t of `magnitudes`). The current task's product is not normalised (it is
only from the next task on). SD-LoRA-RR (`method.sd_lora_rank_steps`): task t's rank is the
last `(first_task, rank)` step with first_task <= t (the official code's commented schedule:
((4, 8), (8, 6)) with rank 10); the unused rows of A and columns of B are zero and get zero
gradients.

The network carries one LoRA of rank T r per block (`peft.LoRA`, targets query and value,
scale 1): rows s r..(s+1) r of its A are task s's A_s (the current task's from `trainable`, the
others from the state, zero for later tasks) and the matching columns of its B are B_s times
its coefficient (alpha'_s / norms, alpha_t, or 0). The step differentiates only the current
task's pair and the magnitudes (no weight gradient of the Q/V kernels).

Trainable: the heads + `sd_lora/lora/{A_q, A_v}` (n_blocks, r, D), `{B_q, B_v}` (n_blocks, D,
r), `alpha` () and `alpha_prev` (T,) (entries s >= t unused). Method state (fixed shapes,
checkpointed, vmapped): `A_q`, `A_v` (T, n_blocks, r, D), `B_q`, `B_v` (T, n_blocks, D, r),
`magnitudes` (T, T). The user's `model.peft` modules are not used.
"""

from __future__ import annotations

from typing import Any, ClassVar

import chex
import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
from flax import traverse_util

from aepg_jax.methods import base
from aepg_jax.methods.base import ComposedParams, Method, Network, Params, TaskContext, TaskSpec
from aepg_jax.methods.blocks import block_problems, cut_blocks
from aepg_jax.models import partition

# The official code (models/sdlora.py `_train`, exps/sdlora_inr.json): SGD with momentum 0.9 on
# every parameter, no weight decay (commented out), lr 1e-2 constant (MultiStepLR with a
# milestone beyond the run), batch 128, 20 epochs; its `optimizer` / `scheduler` json fields are
# not read by `_train`.
SD_LORA_SETTINGS: dict[str, Any] = {
    "optim.optimizer": "sgd",
    "optim.momentum": 0.9,
    "optim.weight_decay": 0.0,
    "optim.learning_rate": 1e-2,
    "optim.batch_size": 128,
    "optim.epochs": 20,
    "optim.peft_freeze_epochs": 0,
    "optim.lr_schedule": "constant",
    "optim.clip_norm": 0.0,
}
KEY = "sd_lora"  # top-level key of the LoRA leaves in the trainable tree (`lora/` -> peft)
_ATTN = "MultiHeadDotProductAttention_0"
_TARGETS = ("query", "value")
_PAIRS = (("A_q", "B_q", "query"), ("A_v", "B_v", "value"))


def task_ranks(rank: int, steps, num_tasks: int) -> tuple[int, ...]:
    """Each task's rank: `rank`, then each `(first_task, r)` step's r from its first task on."""
    out = []
    for t in range(num_tasks):
        r = rank
        for first, step_rank in sorted((int(a), int(b)) for a, b in steps):
            if first <= t:
                r = step_rank
        out.append(r)
    return tuple(out)


def _frobenius(x: jax.Array) -> jax.Array:
    """||x||_F over the last two axes."""
    return jnp.sqrt(jnp.sum(jnp.square(x), axis=(-2, -1)))


class SDLoRA(ComposedParams, Method):
    """Scalable decoupled LoRA: new direction per task, learned magnitudes of all of them."""

    name = "sd_lora"
    official_head_init = "linear"  # the official `SimpleLinear`: U(+-sqrt(3/D)) kernel, bias 0
    defaults: ClassVar[dict[str, Any]] = {
        "sd_lora_blocks": tuple(range(12)),  # the official code's: every block of ViT-B
        "sd_lora_rank": 10,
        "sd_lora_magnitude_init": 0.8,
        "sd_lora_rank_steps": (),  # SD-LoRA-RR: ((4, 8), (8, 6)) with rank 10
    }
    reference_settings: ClassVar[dict[str, Any]] = SD_LORA_SETTINGS
    uses_model_peft: ClassVar[bool] = False
    # Its draws run op by op (one compilation per shape), not as one program per task.
    grows_on_host: ClassVar[bool] = True

    def __init__(self, cfg: ml_collections.ConfigDict):
        super().__init__(cfg)
        m = cfg.method
        self.blocks = cut_blocks(m.sd_lora_blocks, cfg.model.depth)
        self.rank = int(m.sd_lora_rank)
        self.width = int(cfg.model.hidden_size)
        self.num_tasks = int(cfg.data.num_tasks)
        self.ranks = task_ranks(self.rank, m.sd_lora_rank_steps, self.num_tasks)
        net_cfg = ml_collections.ConfigDict(cfg.model.to_dict())
        net_cfg.peft.kind = "lora"
        net_cfg.peft.blocks = self.blocks
        net_cfg.peft.lora_rank = self.num_tasks * self.rank
        net_cfg.peft.lora_targets = _TARGETS
        self.net = Network(net_cfg)

    @classmethod
    def check(cls, cfg: ml_collections.ConfigDict) -> list[str]:
        m, p = cfg.method, []
        blocks, default = tuple(m.sd_lora_blocks), cls.defaults["sd_lora_blocks"]
        p += block_problems("sd_lora_blocks", blocks, cfg.model.depth, default, m.name == cls.name)
        r = m.sd_lora_rank
        if not (isinstance(r, int) and not isinstance(r, bool) and r >= 1):
            p.append(f"method.sd_lora_rank={r!r} must be an integer >= 1.")
            return p
        if m.name == cls.name and r > cfg.model.hidden_size:
            p.append(f"method.sd_lora_rank={r} must be <= model.hidden_size.")
        if not m.sd_lora_magnitude_init > 0:
            p.append(f"method.sd_lora_magnitude_init={m.sd_lora_magnitude_init} must be > 0.")
        steps = tuple(m.sd_lora_rank_steps)
        pair = lambda s: (
            isinstance(s, (tuple, list))
            and len(s) == 2
            and all(isinstance(v, int) and not isinstance(v, bool) for v in s)
        )
        if not all(pair(s) and s[0] >= 0 and 1 <= s[1] <= r for s in steps):
            p.append(
                f"method.sd_lora_rank_steps={steps} must be (first_task, rank) pairs with "
                f"first_task >= 0 and 1 <= rank <= method.sd_lora_rank={r}."
            )
        return p

    # -- state -------------------------------------------------------------------------------

    def initial_state(self) -> Params:
        t, n, d, r = self.num_tasks, len(self.blocks), self.width, self.rank
        a, b = jnp.zeros((t, n, r, d), jnp.float32), jnp.zeros((t, n, d, r), jnp.float32)
        return {"A_q": a, "A_v": a, "B_q": b, "B_v": b, "magnitudes": jnp.zeros((t, t))}

    def init_state(self, trainable: Params) -> Params:
        return self.initial_state()

    def _rank_mask(self, task: int | jax.Array) -> jax.Array:
        """(r,) 1 for the rows of A (columns of B) task `task` uses."""
        return (jnp.arange(self.rank) < jnp.asarray(self.ranks)[task]).astype(jnp.float32)

    def grow(self, task: int, trainable: Params, key: jax.Array) -> Params:
        """Task `task`'s A_q, A_v ~ U(+-1/sqrt(D)) (rows beyond its rank zero), B = 0, and the
        magnitudes at their initial value; the model's PEFT leaves dropped."""
        n, d, r = len(self.blocks), self.width, self.rank
        bound = float(np.float32(1) / np.sqrt(np.float32(d)))  # on the host: no eager program
        mask = jnp.asarray(np.arange(r) < self.ranks[task], jnp.float32)[None, :, None]
        k_q, k_v = jax.random.split(key)
        a = lambda k: jax.random.uniform(k, (n, r, d), jnp.float32, -bound, bound) * mask
        b = jnp.zeros((n, d, r), jnp.float32)
        init = float(self.cfg.method.sd_lora_magnitude_init)
        lora = {
            "A_q": a(k_q),
            "A_v": a(k_v),
            "B_q": b,
            "B_v": b,
            "alpha": jnp.full((), init, jnp.float32),
            "alpha_prev": jnp.full((self.num_tasks,), init, jnp.float32),
        }
        return {**base.heads_of(trainable), KEY: {"lora": lora}}

    def end_task(
        self, task: TaskSpec, trainable: Params, state: Params, ctx: TaskContext
    ) -> Params:
        """Stores task t's A, B and the magnitudes it ended with."""
        store = self.compiled("_stored", self._stored)
        return store(trainable[KEY]["lora"], state, jnp.asarray(task.index, jnp.int32))

    def _stored(self, lora: Params, state: Params, t: jax.Array) -> Params:
        """`state` with task t's A, B and magnitudes (t traced: one program for the run)."""
        prev = jnp.where(jnp.arange(self.num_tasks) < t, lora["alpha_prev"], 0.0)
        row = prev.at[t].set(lora["alpha"])
        out = {k: state[k].at[t].set(lora[k]) for k in ("A_q", "A_v", "B_q", "B_v")}
        return {**state, **out, "magnitudes": state["magnitudes"].at[t].set(row)}

    # -- the network ---------------------------------------------------------------------------

    def coefficients(self, lora: Params, state: Params, task: int | jax.Array) -> dict:
        """Per target, (T, n_blocks) multipliers of each task's `(x A_s^T) B_s^T`:
        alpha'_s / (||B_s|| ||A_s||) for s < t, alpha_t for s = t, 0 after."""
        s = jnp.arange(self.num_tasks)[:, None]
        out = {}
        for a_name, b_name, target in _PAIRS:
            norms = _frobenius(state[a_name]) * _frobenius(state[b_name])  # (T, n)
            earlier = s < task
            safe = jnp.where(earlier & (norms > 0), norms, 1.0)
            prev = jnp.where(earlier, lora["alpha_prev"][:, None] / safe, 0.0)
            out[target] = jnp.where(s == task, lora["alpha"], prev)
        return out

    def params(
        self, trainable: Params, frozen: Params, state: Params, task: int | jax.Array
    ) -> Params:
        """The full parameter tree at task `task` (may be traced): every task's LoRA stacked
        into one rank-T r LoRA per block, the heads of `trainable`."""
        lora = trainable[KEY]["lora"]
        n, d, r, big_t = len(self.blocks), self.width, self.rank, self.num_tasks
        chex.assert_shape(lora["A_q"], (n, r, d))
        chex.assert_shape(lora["B_q"], (n, d, r))
        mask = self._rank_mask(task)
        coef = self.coefficients(lora, state, task)
        flat = dict(traverse_util.flatten_dict(frozen))
        for a_name, b_name, target in _PAIRS:
            a = state[a_name].at[task].set(lora[a_name] * mask[None, :, None])  # (T, n, r, D)
            b = state[b_name].at[task].set(lora[b_name] * mask[None, None, :])  # (T, n, D, r)
            b = b * coef[target][:, :, None, None]
            for i, blk in enumerate(self.blocks):
                attn = ("Transformer", f"encoderblock_{blk}", _ATTN, "lora")
                flat[(*attn, f"{target}_A")] = a[:, i].reshape(big_t * r, d)
                flat[(*attn, f"{target}_B")] = jnp.moveaxis(b[:, i], 0, 1).reshape(d, big_t * r)
                flat[(*attn, f"{target}_scale")] = jnp.ones((), jnp.float32)
        return partition.merge(base.heads_of(trainable), traverse_util.unflatten_dict(flat))
