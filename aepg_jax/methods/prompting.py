"""Shared machinery of the prompt baselines L2P++, DualPrompt and CODA-P (docs/algorithm.md §10).

- Query `q(x)`: the final-norm cls token (B, D) of the frozen backbone run without prompts,
  without the model's PEFT modules and without heads, under `stop_gradient`: one extra forward
  pass per step, a separate `apply` (nothing batched with it that could change its numerics).
- Prompts enter as prefixes: `(P_k, P_v)` (B, L_p, D) per block, appended to that block's
  attention keys and values (`vit.py`), plain softmax, no compensation.
- `cos(a, b) = <a / max(|a|, eps), b / max(|b|, eps)>`, eps = 1e-12 (torch's F.normalize).
- Trainable tree: the task heads + `prompt/...` (labelled `peft` by `partition.py`, so gated by
  the head-only phase like any PEFT). A prompt method brings its own parameters: `grow` drops the
  model's PEFT modules (`model.peft`, e.g. the default's LoRA) at task 0, and every forward pass
  runs the backbone with `model.peft.kind=none`.

Domain-incremental (`data.scenario=domain`, docs/algorithm.md §17): the three prompt methods
run. Their reference code has one classifier over all classes (logits of unseen classes
masked), which in this scenario is one head that every task trains; prompt selection needs no
task identity at test time (L2P++, CODA-P) or picks a task's prompt by its key (DualPrompt),
which a domain task has as a class task does.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, ClassVar

import chex
import jax
import jax.numpy as jnp
import ml_collections

from aepg_jax.methods import blocks
from aepg_jax.methods.base import Method, Network, Params, TaskSpec, predictions
from aepg_jax.models import partition, vit

PROMPT = "prompt"  # top-level key of the prompt leaves in the trainable tree
EPS = 1e-12

# L2P++ and CODA-P as run by CODA-Prompt's code (configs/imnet-r_prompt.yaml, docs/algorithm.md
# §14): Adam 1e-3, batch 128, 50 epochs, per-epoch cosine decay, no clipping, no head-only epochs.
CODA_REPO_SETTINGS: dict[str, Any] = {
    "optim.learning_rate": 1e-3,
    "optim.batch_size": 128,
    "optim.epochs": 50,
    "optim.peft_freeze_epochs": 0,
    "optim.lr_schedule": "cosine_epochs",
    "optim.clip_norm": 0.0,
}


def backbone_network(net: Network) -> Network:
    """`net` without the model's PEFT modules (`model.peft.kind=none`)."""
    cfg = ml_collections.ConfigDict(net.model_cfg.to_dict())
    cfg.peft.kind = "none"
    return Network(cfg)


def query(net: Network, frozen: Params, images: jax.Array) -> jax.Array:
    """`q(x)` (B, D): the frozen backbone's final-norm cls token, no prompts, no gradient."""
    _, out = backbone_network(net).apply(frozen, images, ())
    return jax.lax.stop_gradient(out["features"])


def normalize(x: jax.Array, axis: int = -1) -> jax.Array:
    """`x / max(|x|, 1e-12)` along `axis`."""
    return x / jnp.maximum(jnp.linalg.norm(x, axis=axis, keepdims=True), EPS)


def cosine(q: jax.Array, keys: jax.Array) -> jax.Array:
    """`s[b, j] = cos(q_b, K_j)`: q (B, D), keys (M, D) -> (B, M)."""
    chex.assert_rank((q, keys), 2)
    return normalize(q) @ normalize(keys).T


def split_kv(p: jax.Array) -> tuple[jax.Array, jax.Array]:
    """A prompt (..., L, D) as its key half (..., L/2, D) and value half (CODA's layout)."""
    half = p.shape[-2] // 2
    return p[..., :half, :], p[..., half:, :]


def uniform(key: jax.Array, shape: tuple[int, ...], low: float, high: float) -> jax.Array:
    """U(low, high) float32 (torch's `uniform_` default is U(0, 1))."""
    return jax.random.uniform(key, shape, jnp.float32, low, high)


def concat_prefixes(*parts: vit.Prefixes) -> vit.Prefixes:
    """Merges per-block prefixes; a block in several parts gets their tokens concatenated."""
    out: dict[int, tuple[jax.Array, jax.Array]] = {}
    for part in parts:
        for block, (pk, pv) in part.items():
            if block in out:
                pk = jnp.concatenate([out[block][0], pk], axis=1)
                pv = jnp.concatenate([out[block][1], pv], axis=1)
            out[block] = (pk, pv)
    return out


def positive_int_problems(m: ml_collections.ConfigDict, fields: Sequence[str]) -> list[str]:
    """`method.<field> must be an integer >= 1` for each offending field."""
    return [
        f"method.{f}={m[f]!r} must be an integer >= 1."
        for f in fields
        if not (isinstance(m[f], int) and not isinstance(m[f], bool) and m[f] >= 1)
    ]


class PromptMethod(Method):
    """A prompt method: `init_prompts` builds its leaves at task 0, `prefixes` turns the query
    into per-block prefixes (and a method loss at training time)."""

    reference_settings: ClassVar[dict[str, Any]] = CODA_REPO_SETTINGS
    uses_model_peft: ClassVar[bool] = False
    extra_train_forwards: ClassVar[int] = 1  # the query q(x), at training and evaluation
    eval_forwards: ClassVar[int] = 2

    @property
    def width(self) -> int:
        return int(self.cfg.model.hidden_size)

    def blocks(self, field: str) -> tuple[int, ...]:
        """`method.<field>` cut at the model's depth."""
        return blocks.cut_blocks(self.cfg.method[field], self.cfg.model.depth)

    def init_prompts(self, key: jax.Array) -> Params:
        """The method's prompt leaves (fixed shapes for the whole run)."""
        raise NotImplementedError

    def prefixes(
        self, q: jax.Array, prompts: Params, task: jax.Array | int, train: bool
    ) -> tuple[vit.Prefixes, jax.Array | None]:
        """Per-block prefixes for query `q` (B, D) while training task `task` (train) or after
        it (evaluation over tasks 0..task), and the method's loss term (None: none). `task`
        may be traced (one program serves every task)."""
        raise NotImplementedError

    def grow(self, task: int, trainable: Params, key: jax.Array) -> Params:
        if task > 0:
            return trainable
        heads = partition.split(trainable, partition.label_params(trainable), (partition.HEAD,))
        return {**heads[0], PROMPT: self.init_prompts(key)}

    def prompted(
        self,
        net: Network,
        trainable: Params,
        frozen: Params,
        images: jax.Array,
        q: jax.Array,
        task: TaskSpec,
        train: bool,
    ) -> tuple[jax.Array, jax.Array | None]:
        """Logits of the prompted backbone (every head) for a given query, and the method's
        loss term."""
        chex.assert_shape(q, (images.shape[0], self.width))
        rest = {k: v for k, v in trainable.items() if k != PROMPT}
        prefixes, extra = self.prefixes(q, trainable[PROMPT], task.index, train)
        params = partition.merge(rest, frozen)
        logits, _ = backbone_network(net).apply(params, images, task.head_sizes, prefixes)
        return logits, extra

    def forward(
        self,
        net: Network,
        trainable: Params,
        frozen: Params,
        state: Params,
        images: jax.Array,
        task: TaskSpec,
    ) -> tuple[jax.Array, jax.Array | None]:
        q = query(net, frozen, images)
        return self.prompted(net, trainable, frozen, images, q, task, train=True)

    def predict(
        self,
        net: Network,
        trainable: Params,
        frozen: Params,
        state: Params,
        images: jax.Array,
        task: TaskSpec,
    ) -> tuple[dict[str, jax.Array], jax.Array]:
        q = query(net, frozen, images)
        logits, _ = self.prompted(net, trainable, frozen, images, q, task, train=False)
        return predictions(logits, task)
