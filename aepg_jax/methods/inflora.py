"""InfLoRA (docs/algorithm.md §15): per task a LoRA pair on K and V, A fixed before the task.

In each block b of `method.inflora_blocks` (cut at the depth), with x the block's attention
input (the LN_0 output) and tasks 0..t seen so far:
    k = x W_k + x sum_{s<=t} A_s^T B_{k,s}^T,   v likewise with B_{v,s}     (A_s: (r, D))
Before task t, on the task's training data and the model as it stands (B_t = 0), the input
covariance C = mean_tokens x x^T (D, D) of every block is accumulated on the device; then
A_t = U[:, :r]^T / sqrt(3), U the left singular vectors of C projected against the block's
DualGPM memory (`dualgpm.py`), and A_t is frozen (A_{k,t} = A_{v,t} = A_t, as the reference).
B_{k,t}, B_{v,t} (D, r) start at 0 and train with the task's head; B_{s<t} and all A are frozen.
After task t the covariance of the trained model updates the memory with the threshold
th_t = (lame - lamb) t / T + lamb. The covariance passes are jitted (one compilation, the task
index traced) over the task's training images under the test transform (the reference used its
training augmentation; ours is deterministic); the SVDs run on the host in float64, per seed.

The frozen tasks' deltas are merged into the frozen K/V kernels, `W + sum_{s<t} A_s^T B_s^T`
((D, H, Dh) as the kernels), which equals adding `x A_s^T B_s^T`; the current task's pair runs
unmerged through the ViT's LoRA branch (`peft.LoRA`, A = A_t frozen, scale 1), `(x A_t^T) B_t^T`
in float32: the step then takes no weight gradient of the K/V kernels (D x D per token), and
with a bfloat16 compute dtype only B_t's gradient, float32, is all-reduced. The user's
`model.peft` modules are not used; the method's network carries LoRA on `inflora_blocks`.

Domain-incremental (`data.scenario=domain`, docs/algorithm.md §17): refused at validation. The
method's interference-free argument protects the old tasks through the LoRA subspaces and one
classifier per task of new classes, frozen once its task ends (the reference's
`classifier_pool`, here the task heads of the class scenario, of which only the current one
gets a gradient); in the domain scenario one head over every class trains in every task, so
each domain would move the classifier of the earlier ones and the method would not be InfLoRA.

Trainable: the heads + `inflora/lora/{B_k, B_v}` (n_blocks, D, r) of the current task.
Method state (fixed shapes, checkpointed and vmapped): `A` (T, n_blocks, r, D), `B_k`, `B_v`
(T, n_blocks, D, r) (B of task s stored at its end), the memory `basis` (n_blocks, D, D)
zero-padded, `basis_dim` and `retain` (n_blocks,) int32.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, ClassVar

import chex
import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
from flax import traverse_util

from aepg_jax.data import augment
from aepg_jax.methods import base, dualgpm
from aepg_jax.methods.base import ComposedParams, Method, Network, Params, TaskContext, TaskSpec
from aepg_jax.methods.blocks import block_problems, cut_blocks
from aepg_jax.models import partition, vit

# InfLoRA's code (configs/mimg10_inflora*.json, docs/algorithm.md §15): Adam 5e-4, batch 128, 50
# epochs with the per-epoch cosine decay, no clipping; B_t trains with the head from the start.
INFLORA_SETTINGS: dict[str, Any] = {
    "optim.learning_rate": 5e-4,
    "optim.batch_size": 128,
    "optim.epochs": 50,
    "optim.peft_freeze_epochs": 0,
    "optim.lr_schedule": "cosine_epochs",
    "optim.clip_norm": 0.0,
}
KEY = "inflora"  # top-level key of the B leaves in the trainable tree (`lora/` -> peft label)
_ATTN = "MultiHeadDotProductAttention_0"


def _backbone_cfg(
    model_cfg: ml_collections.ConfigDict, blocks: tuple[int, ...], rank: int
) -> ml_collections.ConfigDict:
    """The model with a rank-`rank` LoRA branch on `blocks` (the current task's pair)."""
    cfg = ml_collections.ConfigDict(model_cfg.to_dict())
    cfg.peft.kind = "lora"
    cfg.peft.blocks = tuple(blocks)
    cfg.peft.lora_rank = rank
    return cfg


def lora_delta(a: jax.Array, b: jax.Array) -> jax.Array:
    """`sum_s A_s^T B_s^T` per block: a (S, n, r, D), b (S, n, D, r) -> (n, D_in, D_out)."""
    return jnp.einsum("snri,snor->nio", a, b, precision=jax.lax.Precision.HIGHEST)


def merged_backbone(
    frozen: Params,
    blocks: tuple[int, ...],
    delta_k: jax.Array,
    delta_v: jax.Array,
    branch: dict[str, jax.Array] | None = None,
) -> Params:
    """`frozen` with `delta` (n, D, D) added to the key/value kernels (D, H, Dh) of `blocks`;
    with `branch` = {"A": (n, r, D), "B_k", "B_v": (n, D, r)}, block i's LoRA leaves set to
    `key_A = value_A = A[i]`, `key_B = B_k[i]`, `value_B = B_v[i]`, scales 1."""
    flat = dict(traverse_util.flatten_dict(frozen))
    for i, blk in enumerate(blocks):
        attn = ("Transformer", f"encoderblock_{blk}", _ATTN)
        for name, delta in (("key", delta_k[i]), ("value", delta_v[i])):
            path = (*attn, name, "kernel")
            kernel = flat[path]
            flat[path] = kernel + delta.reshape(kernel.shape).astype(kernel.dtype)
        if branch is not None:
            for name, b in (("key", branch["B_k"][i]), ("value", branch["B_v"][i])):
                flat[(*attn, "lora", f"{name}_A")] = branch["A"][i]
                flat[(*attn, "lora", f"{name}_B")] = b
                flat[(*attn, "lora", f"{name}_scale")] = jnp.ones((), jnp.float32)
    return traverse_util.unflatten_dict(flat)


class InfLoRA(ComposedParams, Method):
    """Interference-free LoRA: per-task (A_t, B_t) on K and V, A_t from the DualGPM memory."""

    name = "inflora"
    # One `nn.Linear(embd_dim, n_t)` per task, torch's default init (models/sinet_inflorab5.py
    # L74-77); N(0, 0.001^2) before `method.head_init`.
    official_head_init = "uniform"
    head_init_before_field = "normal"
    defaults: ClassVar[dict[str, Any]] = {
        "inflora_blocks": (0, 1, 2, 3, 4),  # the paper's InfLoRA-b5; all 12: the reference's
        "inflora_rank": 5,  # the paper's Table 5 (the reference's configs: 10)
        "inflora_lamb": 0.99,
        "inflora_lame": 1.0,
        "inflora_memory": "dualgpm",  # dualgpm (remove/retain) | gpm (remove only, b5's code)
    }
    reference_settings: ClassVar[dict[str, Any]] = INFLORA_SETTINGS
    uses_model_peft: ClassVar[bool] = False
    grows_on_host: ClassVar[bool] = True  # zeros and dropped leaves: no program to compile
    task_data_passes: ClassVar[int] = 2  # the covariance pass, at begin_task and end_task

    def __init__(self, cfg: ml_collections.ConfigDict):
        super().__init__(cfg)
        m = cfg.method
        self.blocks = cut_blocks(m.inflora_blocks, cfg.model.depth)
        self.rank = int(m.inflora_rank)
        self.width = int(cfg.model.hidden_size)
        self.num_tasks = int(cfg.data.num_tasks)
        self.net = Network(_backbone_cfg(cfg.model, self.blocks, self.rank))

    @classmethod
    def check(cls, cfg: ml_collections.ConfigDict) -> list[str]:
        m, p = cfg.method, []
        blocks, default = tuple(m.inflora_blocks), cls.defaults["inflora_blocks"]
        p += block_problems("inflora_blocks", blocks, cfg.model.depth, default, m.name == cls.name)
        r = m.inflora_rank
        if not (isinstance(r, int) and not isinstance(r, bool) and r >= 1):
            p.append(f"method.inflora_rank={r!r} must be an integer >= 1.")
        elif m.name == cls.name and r > cfg.model.hidden_size:
            p.append(f"method.inflora_rank={r} must be <= model.hidden_size.")
        for field in ("inflora_lamb", "inflora_lame"):
            if not 0.0 < m[field] <= 1.0:
                p.append(f"method.{field}={m[field]} must be in (0, 1].")
        if m.inflora_memory not in dualgpm.MODES:
            p.append(f"method.inflora_memory={m.inflora_memory!r}: use one of {dualgpm.MODES}.")
        if m.name == cls.name and cfg.data.scenario == "domain":
            p.append(
                "method.name=inflora does not run with data.scenario=domain: InfLoRA keeps one "
                "classifier per task of new classes, frozen after its task, and a domain task "
                "brings no new classes (docs/algorithm.md §17); use data.scenario=class or "
                "another method."
            )
        return p

    # -- state -------------------------------------------------------------------------------

    def _zeros_b(self) -> jax.Array:
        return jnp.zeros((len(self.blocks), self.width, self.rank), jnp.float32)

    def initial_state(self) -> Params:
        t, n, d, r = self.num_tasks, len(self.blocks), self.width, self.rank
        return {
            "A": jnp.zeros((t, n, r, d), jnp.float32),
            "B_k": jnp.zeros((t, n, d, r), jnp.float32),
            "B_v": jnp.zeros((t, n, d, r), jnp.float32),
            "basis": jnp.zeros((n, d, d), jnp.float32),
            "basis_dim": jnp.zeros((n,), jnp.int32),
            "retain": jnp.zeros((n,), jnp.int32),
        }

    def init_state(self, trainable: Params) -> Params:
        return self.initial_state()

    def grow(self, task: int, trainable: Params, key: jax.Array) -> Params:
        """Task `task`'s B_k, B_v (zeros, no randomness); the model's PEFT leaves dropped."""
        kept = base.heads_of(trainable)
        return {**kept, KEY: {"lora": {"B_k": self._zeros_b(), "B_v": self._zeros_b()}}}

    def _memories(self, state: Params) -> list[dualgpm.Memory]:
        basis, dims, retain = (np.asarray(state[k]) for k in ("basis", "basis_dim", "retain"))
        return [
            dualgpm.Memory.from_padded(basis[i], int(dims[i]), bool(retain[i]))
            for i in range(len(self.blocks))
        ]

    # -- host side, once per task ----------------------------------------------------------

    def begin_task(
        self, task: TaskSpec, trainable: Params, state: Params, ctx: TaskContext
    ) -> tuple[Params, Params]:
        """A_t from the covariance of the model with LoRAs 0..t-1, projected by the memory."""
        state = state or self.initial_state()
        t = task.index
        cov = self.covariance(ctx, state, None, t, f"task {t + 1} InfLoRA A")
        a = np.stack(
            [
                dualgpm.down_projection(cov[i], mem, self.rank)
                for i, mem in enumerate(self._memories(state))
            ]
        )
        chex.assert_shape(a, (len(self.blocks), self.rank, self.width))
        return trainable, {**state, "A": state["A"].at[t].set(jnp.asarray(a, jnp.float32))}

    def end_task(
        self, task: TaskSpec, trainable: Params, state: Params, ctx: TaskContext
    ) -> Params:
        """Stores B_t; updates the memory with the trained model's input covariance."""
        t, lora = task.index, trainable[KEY]["lora"]
        state = {
            **state,
            "B_k": state["B_k"].at[t].set(lora["B_k"]),
            "B_v": state["B_v"].at[t].set(lora["B_v"]),
        }
        cov = self.covariance(ctx, state, lora, t, f"task {t + 1} InfLoRA memory")
        m = self.cfg.method
        th = dualgpm.threshold(m.inflora_lamb, m.inflora_lame, t, self.num_tasks)
        mems = [
            dualgpm.update(cov[i], mem, th, m.inflora_memory)
            for i, mem in enumerate(self._memories(state))
        ]
        memory = {
            "basis": np.stack([x.padded() for x in mems]).astype(np.float32),
            "basis_dim": np.asarray([x.basis.shape[1] for x in mems], np.int32),
            "retain": np.asarray([int(x.retain) for x in mems], np.int32),
        }
        # Replicated on the run's mesh: a multi-process checkpoint refuses one device's array.
        return {**state, **base.on_mesh(memory, trainable)}

    def covariance(
        self, ctx: TaskContext, state: Params, lora: Params | None, task: int, desc: str
    ) -> np.ndarray:
        """`mean_tokens x x^T` (n_blocks, D, D) of each block's attention input over the task's
        training images (test transform), with LoRAs 0..task-1 and `lora` as task's B."""
        lora = lora or {"B_k": self._zeros_b(), "B_v": self._zeros_b()}
        # The state and LoRA leaves placed like the backbone's: leaves made on the host (after
        # end_task) and leaves a step returned then have one sharding, so one program serves.
        state, lora = base.on_mesh((state, lora), ctx.frozen)
        task_index = jnp.asarray(task, jnp.int32)
        sums, count = None, 0
        for batch in base.task_batches(ctx, desc):
            s, c = self._cov_step()(ctx.frozen, state, lora, batch, task_index)
            sums, count = (s if sums is None else sums + s), count + c
        if sums is None:
            raise ValueError(f"Task {task} has no training images for InfLoRA's covariance.")
        return np.asarray(sums, np.float64) / max(int(count), 1)

    def host_programs(
        self, trainable: Params, state: Params, frozen: Params, batch, task: int
    ) -> dict[str, tuple[Callable, tuple, int]]:
        """The covariance pass, run twice per task (`begin_task` and `end_task`)."""
        lora = {"B_k": self._zeros_b(), "B_v": self._zeros_b()}
        state, lora = base.on_mesh((state, lora), frozen)
        args = (frozen, state, lora, batch, jnp.asarray(task, jnp.int32))
        return {"covariance": (self._cov_step(), args, 2)}

    def _cov_step(self) -> Callable:
        """The covariance pass (the task index traced): one compilation per run."""
        return self.compiled("_covariance_sums", self._covariance_sums)

    def _covariance_sums(self, frozen, state, lora, batch, task):
        """`(sum over the batch's valid tokens of x x^T (n_blocks, D, D), their count)`."""
        images = augment.test_transform(
            batch["image"], self.cfg.model.image_size, self.cfg.input.normalize
        )
        x = self.block_inputs(self.params({KEY: {"lora": lora}}, frozen, state, task), images)
        w = batch["mask"].astype(jnp.float32)[None, :, None, None]
        sums = jnp.einsum("nbti,nbtj->nij", x * w, x, precision=jax.lax.Precision.HIGHEST)
        return sums, jnp.sum(batch["mask"]).astype(jnp.int32) * x.shape[2]

    # -- the network: the merged LoRAs and the current branch ------------------------------

    def params(
        self, trainable: Params, frozen: Params, state: Params, task: int | jax.Array
    ) -> Params:
        """The full parameter tree at task `task`: LoRAs 0..task-1 from the state, task's B from
        `trainable`, the heads of `trainable`. `task` may be traced."""
        lora, a = trainable[KEY]["lora"], state["A"]
        chex.assert_shape(lora["B_k"], (len(self.blocks), self.width, self.rank))
        # Tasks before `task` merged into the frozen kernels (no gradient reaches them); the
        # current task's pair unmerged, so the step differentiates only `(x A_t^T) B_t^T`.
        earlier = (jnp.arange(self.num_tasks) < task).astype(jnp.float32)[:, None, None, None]
        delta = {name: lora_delta(a, state[name] * earlier) for name in ("B_k", "B_v")}
        branch = {"A": a[task], "B_k": lora["B_k"], "B_v": lora["B_v"]}
        backbone = merged_backbone(frozen, self.blocks, delta["B_k"], delta["B_v"], branch)
        return partition.merge(base.heads_of(trainable), backbone)

    def block_inputs(self, params: Params, images: jax.Array) -> jax.Array:
        """The LN_0 outputs (n_blocks, B, N, D) of the chosen blocks, float32."""
        model = vit.build(self.net.model_cfg, ())
        _, inter = model.apply(
            {"params": {k: v for k, v in params.items() if k != "head"}},
            images,
            capture_intermediates=lambda mdl, method: mdl.name == "LayerNorm_0",
            mutable=["intermediates"],
        )
        blocks = inter["intermediates"]["Transformer"]
        x = [blocks[f"encoderblock_{b}"]["LayerNorm_0"]["__call__"][0] for b in self.blocks]
        return jnp.stack(x).astype(jnp.float32)
