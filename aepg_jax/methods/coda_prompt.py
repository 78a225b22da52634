"""CODA-Prompt (docs/algorithm.md §13; GT-RIPL/CODA-Prompt models/zoo.py CodaPrompt).

Per prompted block l (`method.coda_blocks`, default 0-4): components P_l (M, L, D), keys K_l
(M, D) and attention vectors A_l (M, D), M = `coda_pool_size` (100), L = `coda_length` (8: the
first L/2 rows are key prefixes, the rest value prefixes). With T tasks, task t owns rows
[t pt, (t+1) pt), pt = M // T; s = t pt, f = s + pt.

    w[b, k] = cos(q_b * A_k, K_k)                    (no top-k, no softmax)
    prefix_b = sum_{k < f} w[b, k] P_k   (L, D)      split into L/2 key and L/2 value tokens

Training task t uses rows [0, f) with rows [0, s) under stop_gradient (frozen: their gradients
are zero, so Adam, fresh each task, leaves them bit-identical); evaluation after task t uses
rows [0, f). Loss term: mu * sum_l (mean((K K^T - I)^2) + mean((A A^T - I)^2) +
mean((P P^T - I)^2)) over rows [0, f) (P flattened to (f, L D)), mu = `coda_ortho_weight`
(0, the shipped script's value).

Gram-Schmidt, host side, in `grow` (the seed's key, before each task's training): rows [s, f)
of K, A and flattened P become fresh N(0, 1) vectors made orthogonal to every earlier row and
to each other, then unit-normalised; rows [0, s) keep their values bit for bit, rows >= f stay
0 until their task. The reference projects each new vector on every earlier row separately
(classical GS), which is orthogonal to the trained rows only while they are mutually
orthogonal; we project out the span of the earlier rows (identical when they are orthogonal,
e.g. before any training, and what GS intends when training has moved them).

Heads (`method.head_init`, every method's field): `official` (the default) is `uniform`, kernel
and bias ~ U(-1/sqrt(D), 1/sqrt(D)), as the reference's `ViTZoo.last = nn.Linear(768,
num_classes)` starts (torch's default init); `normal` gives N(0, 0.001^2) kernels and zero
biases. It replaces CODA-P's own `method.coda_head_init`: a config saved with that field
compares, and resumes, at its value (`earlier_head_init`).

Domain-incremental (`data.scenario=domain`, docs/algorithm.md §17): runs. Task t (domain t) adds
its rows of components as in the class scenario; the one head covers every class
(`prompting.py`).
"""

from __future__ import annotations

from typing import Any, ClassVar

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np

from aepg_jax.methods import prompting
from aepg_jax.methods.base import Params
from aepg_jax.methods.blocks import block_problems
from aepg_jax.models import vit

_RESTART_NORM = 1e-4  # a fresh vector this close to the span of the earlier rows is redrawn


def gram_schmidt(rows: np.ndarray, start: int, stop: int, key: jax.Array) -> np.ndarray:
    """`rows` (M, d) with rows [start, stop) replaced by orthonormal fresh N(0, 1) vectors,
    orthogonal to rows [0, start); the other rows are returned unchanged (float32). Once d
    rows span the space (a tiny model: width < pool size) further rows are random unit
    vectors (the reference would restart forever)."""
    rows = np.asarray(rows, np.float32)
    out = rows.copy()
    basis = np.zeros((0, rows.shape[1]))
    if start:  # an orthonormal basis of the span of the earlier rows (float64)
        q, r = np.linalg.qr(rows[:start].astype(np.float64).T)
        basis = q.T[np.abs(np.diag(r)) > 1e-10 * max(np.abs(np.diag(r)).max(), 1e-30)]
    fresh = np.asarray(jax.random.normal(key, (stop - start, rows.shape[1])), np.float64)
    for k in range(start, stop):
        v = fresh[k - start]
        if len(basis) >= rows.shape[1]:  # no direction left (more rows than dimensions)
            out[k] = (v / np.linalg.norm(v)).astype(np.float32)
            continue
        for attempt in range(1, 100):
            w = v
            for _ in range(2):  # twice is enough (Kahan): orthogonal to float64 precision
                w = w - basis.T @ (basis @ w)
            if np.linalg.norm(w) > _RESTART_NORM * np.linalg.norm(v):
                break
            redraw = jax.random.fold_in(key, 1000 * k + attempt)  # as the reference restarts
            v = np.asarray(jax.random.normal(redraw, v.shape), np.float64)
        v = w / np.linalg.norm(w)
        basis = np.concatenate([basis, v[None]], axis=0)
        out[k] = v.astype(np.float32)
    return out


def component_weights(q: jax.Array, attention: jax.Array, keys: jax.Array) -> jax.Array:
    """`w[b, k] = cos(q_b * A_k, K_k)`: q (B, D), attention and keys (k, D) -> (B, k)."""
    aq = q[:, None, :] * attention[None]  # (B, k, D)
    return jnp.sum(prompting.normalize(aq) * prompting.normalize(keys)[None], axis=-1)


def ortho_penalty(
    t: jax.Array, rows: jax.Array | None = None, count: jax.Array | int | None = None
) -> jax.Array:
    """`mean((t t^T - I)^2)` of a (k, d) matrix; with `rows` (k,) bool and their `count`, of
    the submatrix of those rows (the mean over `count^2` entries)."""
    if rows is None:
        return jnp.mean((t @ t.T - jnp.eye(t.shape[0], dtype=t.dtype)) ** 2)
    t = jnp.where(rows[:, None], t, 0.0)
    sq = (t @ t.T - jnp.eye(t.shape[0], dtype=t.dtype)) ** 2
    pair = rows[:, None] & rows[None, :]
    return jnp.sum(jnp.where(pair, sq, 0.0)) / jnp.asarray(count, sq.dtype) ** 2


class CodaPrompt(prompting.PromptMethod):
    """CODA-P: a weighted sum of prompt components per block, new components per task."""

    name = "coda_prompt"
    # `ViTZoo.last = nn.Linear(768, C)`, torch's default init (models/zoo.py L374).
    official_head_init = "uniform"
    grows_on_host = True  # Gram-Schmidt in numpy (`orthogonalise`)
    defaults: ClassVar[dict[str, Any]] = {
        "coda_pool_size": 100,
        "coda_length": 8,
        "coda_blocks": (0, 1, 2, 3, 4),
        "coda_ortho_weight": 0.0,
    }

    @classmethod
    def check(cls, cfg: ml_collections.ConfigDict) -> list[str]:
        m = cfg.method
        p = prompting.positive_int_problems(m, ("coda_pool_size", "coda_length"))
        if not p and m.coda_length % 2:
            p.append(f"method.coda_length={m.coda_length} must be even (L/2 keys, L/2 values).")
        if not m.coda_ortho_weight >= 0:
            p.append(f"method.coda_ortho_weight={m.coda_ortho_weight} must be >= 0.")
        if m.name == cls.name:
            p += block_problems(
                "coda_blocks", m.coda_blocks, cfg.model.depth, cls.defaults["coda_blocks"]
            )
            if not p and m.coda_pool_size < cfg.data.num_tasks:
                p.append(
                    f"method.coda_pool_size={m.coda_pool_size} must be >= data.num_tasks="
                    f"{cfg.data.num_tasks} (each task owns pool_size // num_tasks components)."
                )
        return p

    @classmethod
    def earlier_head_init(cls, flat: dict[str, Any]) -> str:
        """A config saved before `method.head_init`: `method.coda_head_init`, the field it
        replaced, or N(0, 0.001^2) from before that field."""
        return flat.get("method.coda_head_init", "normal")

    @property
    def per_task(self) -> int:
        return self.cfg.method.coda_pool_size // self.cfg.data.num_tasks

    def init_prompts(self, key: jax.Array) -> Params:
        m, n = self.cfg.method, len(self.blocks("coda_blocks"))
        zeros = {
            "keys": jnp.zeros((n, m.coda_pool_size, self.width)),
            "attention": jnp.zeros((n, m.coda_pool_size, self.width)),
            "components": jnp.zeros((n, m.coda_pool_size, m.coda_length, self.width)),
        }
        return self.orthogonalise(zeros, 0, key)

    def grow(self, task: int, trainable: Params, key: jax.Array) -> Params:
        if task == 0:
            return super().grow(task, trainable, key)
        prompts = self.orthogonalise(trainable[prompting.PROMPT], task, key)
        return {**trainable, prompting.PROMPT: prompts}

    def orthogonalise(self, prompts: Params, task: int, key: jax.Array) -> Params:
        """Gram-Schmidt of task `task`'s rows of every block's keys, attention, components."""
        s, f = task * self.per_task, (task + 1) * self.per_task
        out = {}
        for i, name in enumerate(("keys", "attention", "components")):
            stack = np.asarray(prompts[name])
            new = np.stack(
                [
                    gram_schmidt(
                        block.reshape(block.shape[0], -1), s, f, jax.random.fold_in(key, 8 * b + i)
                    ).reshape(block.shape)
                    for b, block in enumerate(stack)
                ]
            )
            out[name] = jnp.asarray(new)
        return out

    def prefixes(
        self, q: jax.Array, prompts: Params, task: jax.Array | int, train: bool
    ) -> tuple[vit.Prefixes, jax.Array | None]:
        # Rows [f, M) (later tasks') weigh 0 and get no gradient; rows [0, s) are frozen in
        # training. With `task` traced the masks are selects over all M rows.
        s, f = task * self.per_task, (task + 1) * self.per_task
        rows = jnp.arange(self.cfg.method.coda_pool_size)
        used, frozen_rows = rows < f, rows < s
        mu = self.cfg.method.coda_ortho_weight
        prefixes, penalty = {}, jnp.zeros([], jnp.float32)
        for i, block in enumerate(self.blocks("coda_blocks")):
            k, a, p = (prompts[n][i] for n in ("keys", "attention", "components"))
            if train:  # earlier tasks' rows are frozen
                k, a, p = (_where_rows(frozen_rows, jax.lax.stop_gradient(t), t) for t in (k, a, p))
            # Unused rows (zeros until their task) enter as ones: the norm of a zero vector
            # has a NaN gradient, which a select after it would not stop.
            a_in, k_in = (_where_rows(used, t, jnp.ones_like(t)) for t in (a, k))
            w = jnp.where(used[None], component_weights(q, a_in, k_in), 0.0)
            prefixes[block] = prompting.split_kv(jnp.einsum("bk,kld->bld", w, p))
            if train and mu > 0:
                penalty += sum(ortho_penalty(t.reshape(t.shape[0], -1), used, f) for t in (k, a, p))
        return prefixes, (mu * penalty if train and mu > 0 else None)


def _where_rows(rows: jax.Array, a: jax.Array, b: jax.Array) -> jax.Array:
    """Row r of `a` where `rows[r]`, else of `b`."""
    return jnp.where(rows.reshape(-1, *([1] * (a.ndim - 1))), a, b)
