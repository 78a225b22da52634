"""EASE (docs/algorithm.md §21): one adapter per task, prototypes in every task's subspace.

Expandable Subspace Ensemble (Zhou et al., CVPR 2024), as its code (sun-hailong/CVPR24-Ease)
computes it. Every task t trains a fresh AdaptFormer adapter a_t (`peft.Adapter`, style
`ffn`, width `method.ease_ffn_num`, in every block) with a cosine head over the task's
classes, `logits = sigma cos(f_t(x), w_c)` (`models/head.py`'s `cosine_head`: w_c the task
heads' kernel columns, sigma the scalar `cosine_scale` trained with the adapter, 1 at the
start of each task), under the configured loss on the task's own classes; earlier adapters
are frozen.
f_s(x) is the backbone's normed class token with adapter s (f_ptm: no adapter).

After task t (end_task, on the task's training images under the test transform):
  - a_t is stored; for each new class c, P[c, s] = mean of f_s over its images, for every
    subspace s <= t (and the pretrained one with `ease_use_init_ptm`);
  - every old class c (of task k < t) in every later subspace j (k < j <= t) is completed:
    P[c, j] = sum_{c'} softmax_{c'}(cos(P[c, k], P[c', k])) P[c', j], over the classes c' of
    tasks j..t (recomputed from the real prototypes after every task: `solve_sim_reset`).
Prediction after task t over the seen classes, with c of task k:
  logit_c = sum_{s <= t} w_{c,s} cos(f_s(x), P[c, s]),  w = 1 for s = k, alpha / t for another
  adapter, beta for the pretrained subspace (`forward_reweight`); `ease_reweight=False`: the
  cosine of the concatenations [f_s]_{s<=t} and [P[c, s]]_{s<=t} (`CosineLinear.forward`).

Method state (fixed shapes for the run): every task's adapter stacked, `adapters` with leaves
(T, depth, ...) (a task's slot used from its task on), and `prototypes` (C, S, D), S = T
(+1 with the pretrained subspace first). Evaluation runs one backbone pass per subspace seen so
far (a `lax.cond` per slot skips the later ones): up to S passes per image, `eval_forwards`.

Domain-incremental (`data.scenario=domain`): refused at validation; EASE completes old classes
in new subspaces from the classes a task brings, and a domain task brings none.

The predictions are scores, not probabilities (`Method.scores`): weighted sums of cosines. The
trained scale sigma is the task's training head's (`proxy_fc` in the reference's
`utils/inc_net.py` `EaseNet`); the classifier that predicts (`fc`, `forward_reweight` of
`backbone/linears.py`) multiplies by its own sigma, which starts at 1 and gets no gradient (it is
not in the training forward pass), so the reference defines no probability either. No
calibration is reported (docs/algorithm.md §4).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any, ClassVar

import chex
import jax
import jax.numpy as jnp
import ml_collections
from flax import traverse_util

from aepg_jax.methods import base, prototypes
from aepg_jax.methods.base import Method, Network, Params, TaskContext, TaskSpec
from aepg_jax.models import head as head_lib

KEY = "ease"  # trainable `ease/adapter/...` (the `adapter/` path labels it peft)
_NORM_EPS = 1e-12  # torch F.normalize's
_COS_EPS = 1e-8  # torch cosine_similarity's


def _backbone_cfg(model_cfg: ml_collections.ConfigDict, width: int) -> ml_collections.ConfigDict:
    """The model with an AdaptFormer adapter of hidden width `width` in every block."""
    cfg = ml_collections.ConfigDict(model_cfg.to_dict())
    cfg.peft.kind = "adapter"
    cfg.peft.blocks = tuple(range(int(model_cfg.depth)))
    cfg.peft.adapter_dim = width
    cfg.peft.adapter_style = "ffn"  # AdaptFormer's: beside the MLP, ReLU, fixed scale
    cfg.peft.adapter_scale = 0.1  # the official `ffn_adapter_scalar`
    return cfg


def normalize(x: jax.Array, axis: int = -1) -> jax.Array:
    """`x / max(|x|, 1e-12)` along `axis` (torch's F.normalize)."""
    norm = jnp.sqrt(jnp.sum(jnp.square(x), axis=axis, keepdims=True))
    return x / jnp.maximum(norm, _NORM_EPS)


def complete(prototypes: jax.Array, owner: jax.Array, task: jax.Array, ptm: int) -> jax.Array:
    """Old classes' prototypes in later subspaces from semantic similarity (`solve_sim_reset`).

    prototypes (C, S, D): P[c, s] real for the subspaces s <= own(c) = owner[c] + ptm (and the
    pretrained slot 0 with ptm = 1). For every class c with own(c) < j <= task + ptm:
    P[c, j] = sum_{c'} softmax_{c'}(cos(P[c, own(c)], P[c', own(c)])) P[c', j] over the classes
    c' with own(c') >= j among those seen (owner[c'] <= task). Other entries are returned as
    given. `task` may be traced."""
    c, s, _ = prototypes.shape
    chex.assert_shape(owner, (c,))
    own = owner + ptm
    hp = jax.lax.Precision.HIGHEST
    # sim[c, c'] = cos(P[c, own(c)], P[c', own(c)]): every pair in every slot, then c's own.
    dots = jnp.einsum("asd,bsd->abs", prototypes, prototypes, precision=hp)
    norms = jnp.sqrt(jnp.sum(jnp.square(prototypes), axis=-1))  # (C, S)
    cos = dots / jnp.maximum(norms[:, None, :] * norms[None, :, :], _COS_EPS)
    sim = jnp.take_along_axis(cos, own[:, None, None], axis=2)[..., 0]  # (C, C')
    slots = jnp.arange(s)
    seen = owner <= task
    # candidate c' for slot j: own(c') >= j and seen; target (c, j): own(c) < j <= task + ptm.
    cand = (own[None, :] >= slots[:, None]) & seen[None, :]  # (S, C')
    logits = jnp.where(cand[None], sim[:, None, :], -jnp.inf)  # (C, S, C')
    target = (own[:, None] < slots[None, :]) & (slots[None, :] <= task + ptm) & seen[:, None]
    weights = jax.nn.softmax(jnp.where(target[..., None], logits, 0.0), axis=-1)
    completed = jnp.einsum("ajb,bjd->ajd", weights, prototypes, precision=hp)
    return jnp.where(target[..., None], completed, prototypes)


def store_adapter(adapters: Params, adapter: Params, task: jax.Array) -> Params:
    """`adapters` (T, depth, ...) with slot `task` set to `adapter` (depth, ...); traced."""
    return jax.tree.map(
        lambda s, a: jax.lax.dynamic_update_index_in_dim(s, a.astype(s.dtype), task, 0),
        adapters,
        adapter,
    )


def put_means(
    protos: jax.Array, sums: prototypes.ClassSums, new: jax.Array, slot: jax.Array
) -> jax.Array:
    """`protos` (C, S, D) with the classes `new` (C,) set to their means in subspace `slot`."""
    column = jax.lax.dynamic_index_in_dim(protos, slot, 1, keepdims=False)
    column = jnp.where(new[:, None], sums.means(), column)
    return jax.lax.dynamic_update_index_in_dim(protos, column, slot, 1)


def subspace_logits(
    features: jax.Array,
    prototypes: jax.Array,
    owner: jax.Array,
    task: jax.Array,
    ptm: int,
    alpha: float,
    beta: float,
    reweight: bool,
) -> jax.Array:
    """Logits (B, C) from the subspaces' features (S, B, D) and prototypes (C, S, D) after task
    `task` (slots beyond `task + ptm` ignored); classes not yet seen are not masked here."""
    s = features.shape[0]
    slots = jnp.arange(s)
    live = slots <= task + ptm  # (S,)
    hp = jax.lax.Precision.HIGHEST
    if reweight:  # CosineLinear.forward_reweight: per-subspace cosines, weighted
        cos = jnp.einsum("sbd,csd->bcs", normalize(features), normalize(prototypes), precision=hp)
        own = (owner + ptm)[:, None]  # (C, 1)
        other = jnp.where((slots == 0) & (ptm == 1), beta, alpha / jnp.maximum(task, 1))
        w = jnp.where(slots[None, :] == own, 1.0, other[None, :])
        return jnp.sum(cos * jnp.where(live[None, :], w, 0.0)[None], axis=-1)
    # CosineLinear.forward: the cosine of the concatenations over the live subspaces.
    x = features * live[:, None, None]
    p = prototypes * live[None, :, None]
    dots = jnp.einsum("sbd,csd->bc", x, p, precision=hp)
    x_norm = jnp.sqrt(jnp.sum(jnp.square(x), axis=(0, 2)))  # (B,)
    p_norm = jnp.sqrt(jnp.sum(jnp.square(p), axis=(1, 2)))  # (C,)
    return dots / jnp.maximum(x_norm, _NORM_EPS)[:, None] / jnp.maximum(p_norm, _NORM_EPS)


class Ease(Method):
    """Expandable subspace ensemble: per-task adapters, completed prototypes, cosine scoring."""

    name = "ease"
    layout = head_lib.COSINE_LAYOUT
    official_head_init = "uniform"  # CosineLinear.reset_parameters: U(+-1/sqrt(D)), bias unused
    scores: ClassVar[dict[str, str]] = {
        "model": "weighted sums of cosine similarities to the class prototypes, with no "
        "trained scale (the reference's evaluation sigma stays 1)"
    }
    defaults: ClassVar[dict[str, Any]] = {
        "ease_ffn_num": 64,  # the adapter's hidden width (the official `ffn_num`; VTAB: 16)
        "ease_alpha": 0.1,  # weight of another task's subspace, divided by t (`alpha`)
        "ease_beta": 0.0,  # weight of the pretrained subspace (`beta`)
        "ease_use_init_ptm": False,  # add the pretrained backbone's subspace (`use_init_ptm`)
        "ease_reweight": True,  # subspace reweighting at inference (`use_reweight`)
    }
    # EASE's code trains the adapter from the task's first step (no head-only phase).
    reference_settings: ClassVar[dict[str, Any]] = {"optim.peft_freeze_epochs": 0}
    uses_model_peft: ClassVar[bool] = False

    def __init__(self, cfg: ml_collections.ConfigDict):
        super().__init__(cfg)
        m = cfg.method
        self.ffn_num = int(m.ease_ffn_num)
        self.ptm = int(bool(m.ease_use_init_ptm))
        self.alpha, self.beta = float(m.ease_alpha), float(m.ease_beta)
        self.reweight = bool(m.ease_reweight)
        self.width, self.depth = int(cfg.model.hidden_size), int(cfg.model.depth)
        self.num_tasks = int(cfg.data.num_tasks)
        self.slots = self.num_tasks + self.ptm
        self.net = Network(_backbone_cfg(cfg.model, self.ffn_num))
        # One backbone pass per subspace at evaluation (at most S, after the last task), and
        # after task t, t + 1 (+1) passes over its training images for the prototypes.
        self.eval_forwards = self.slots
        self.task_data_passes = (self.num_tasks + 1) / 2 + self.ptm

    @classmethod
    def check(cls, cfg: ml_collections.ConfigDict) -> list[str]:
        m, p = cfg.method, []
        f = m.ease_ffn_num
        if not (isinstance(f, int) and not isinstance(f, bool) and f >= 1):
            p.append(f"method.ease_ffn_num={f!r} must be an integer >= 1.")
        for field in ("ease_alpha", "ease_beta"):
            if not (isinstance(m[field], int | float) and m[field] >= 0):
                p.append(f"method.{field}={m[field]!r} must be a number >= 0.")
        if m.name == cls.name and cfg.data.scenario == "domain":
            p.append(
                "method.name=ease does not run with data.scenario=domain: EASE completes old "
                "classes' prototypes in new subspaces from the classes each task brings, and a "
                "domain task brings none; use data.scenario=class or another method."
            )
        return p

    # -- parameters --------------------------------------------------------------------------

    def fresh_adapter(self, key: jax.Array) -> Params:
        """Adapters of every block, stacked (depth, ...): Down U(+-1/sqrt(D)) (torch's
        kaiming_uniform(a=sqrt 5)), biases and Up zero (`init_option=lora`)."""
        n, d, m = self.depth, self.width, self.ffn_num
        bound = 1.0 / math.sqrt(d)
        return {
            "down": {
                "kernel": jax.random.uniform(key, (n, d, m), jnp.float32, -bound, bound),
                "bias": jnp.zeros((n, m), jnp.float32),
            },
            "up": {
                "kernel": jnp.zeros((n, m, d), jnp.float32),
                "bias": jnp.zeros((n, d), jnp.float32),
            },
        }

    def params(self, frozen: Params, adapter: Params) -> Params:
        """The backbone with `adapter` ((depth, ...) leaves) in every block."""
        flat = dict(traverse_util.flatten_dict(frozen))
        for i in range(self.depth):
            for layer in ("down", "up"):
                for leaf in ("kernel", "bias"):
                    path = ("Transformer", f"encoderblock_{i}", "adapter", layer, leaf)
                    flat[path] = adapter[layer][leaf][i]
        return traverse_util.unflatten_dict(flat)

    def features(self, frozen: Params, adapter: Params, images: jax.Array) -> jax.Array:
        """f(x) (B, D) float32: the normed class token of the backbone with `adapter`."""
        _, aux = self.net.apply(self.params(frozen, adapter), images, ())
        return aux["features"].astype(jnp.float32)

    def slot_adapter(self, state: Params, slot: jax.Array | int) -> Params:
        """The adapter of subspace `slot` (zeros, i.e. the pretrained backbone, for the
        pretrained slot 0 with `ease_use_init_ptm`); `slot` may be traced."""
        task = jnp.maximum(jnp.asarray(slot) - self.ptm, 0)
        take = jax.tree.map(lambda a: jax.lax.dynamic_index_in_dim(a, task, 0, False), state)
        if not self.ptm:
            return take
        return jax.tree.map(lambda a: jnp.where(jnp.asarray(slot) == 0, 0.0, a), take)

    # -- state ---------------------------------------------------------------------------------

    def initial_state(self, num_classes: int) -> Params:
        zeros = jax.tree.map(jnp.zeros_like, self.fresh_adapter(jax.random.key(0)))
        return {
            "adapters": jax.tree.map(lambda a: jnp.zeros((self.num_tasks, *a.shape)), zeros),
            "prototypes": jnp.zeros((num_classes, self.slots, self.width), jnp.float32),
        }

    def init_state(self, trainable: Params) -> Params:
        return self.initial_state(head_lib.num_classes(trainable))

    def grow(self, task: int, trainable: Params, key: jax.Array) -> Params:
        """Task `task`'s fresh adapter and head scale sigma = 1; the model's PEFT dropped."""
        adapter = self.fresh_adapter(key)
        return head_lib.with_cosine_scale({**base.heads_of(trainable), KEY: {"adapter": adapter}})

    # -- host side -----------------------------------------------------------------------------

    def end_task(
        self, task: TaskSpec, trainable: Params, state: Params, ctx: TaskContext
    ) -> Params:
        """Stores a_t; prototypes of the task's classes in subspaces 0..t (+ pretrained);
        old classes completed in the subspaces after their own."""
        t = int(task.index)
        adapter = trainable[KEY]["adapter"]
        num_classes = state["prototypes"].shape[0]
        owner = jnp.asarray(head_lib.class_tasks(task.head_sizes))
        chex.assert_shape(owner, (num_classes,))
        t_arr = jnp.asarray(t, jnp.int32)
        adapters = self.compiled("store_adapter", store_adapter)(state["adapters"], adapter, t_arr)
        protos = state["prototypes"]
        for slot in range(t + 1 + self.ptm):
            slot_arr = jnp.asarray(slot, jnp.int32)
            sums = prototypes.accumulate(
                self._sums_step(),
                (ctx.frozen, adapters, slot_arr),
                ctx,
                prototypes.ClassSums.zeros(num_classes, self.width),  # placed by accumulate
                desc=f"task {t + 1} EASE prototypes, subspace {slot + 1}",
            )
            protos = self.compiled("put_means", put_means)(protos, sums, owner == t_arr, slot_arr)
        protos = self._complete_step()(protos, owner, t_arr, self.ptm)
        return {"adapters": adapters, "prototypes": protos}

    def _sums_step(self) -> Callable:
        """The prototype pass (task and slot traced): one compilation per run."""
        return self.compiled("class_sums_step", prototypes.sums_step(self._slot_features, self.cfg))

    def _complete_step(self) -> Callable:
        return self.compiled("complete", complete, static_argnums=(3,))

    def _slot_features(self, params: tuple[Params, Params, jax.Array], images: jax.Array):
        """f_slot(x) (B, D) for `params = (frozen, adapters (T, ...), slot)`, slot traced."""
        frozen, adapters, slot = params
        return self.features(frozen, self.slot_adapter(adapters, slot), images)

    def host_programs(
        self, trainable: Params, state: Params, frozen: Params, batch, task: int
    ) -> dict[str, tuple[Callable, tuple, int]]:
        """The prototype pass (one per subspace seen, at most S per task) and the completion."""
        c = state["prototypes"].shape[0]
        slot = jnp.asarray(task, jnp.int32)
        sums = base.on_mesh(prototypes.ClassSums.zeros(c, self.width), frozen)
        owner = jnp.asarray(head_lib.class_tasks(head_lib.head_sizes(trainable)))
        args = (sums, (frozen, state["adapters"], slot), batch)
        return {
            "prototypes": (self._sums_step(), args, self.slots),
            "completion": (self._complete_step(), (state["prototypes"], owner, slot, self.ptm), 1),
        }

    # -- inside the jitted steps ---------------------------------------------------------------

    def forward(
        self,
        net: Network,
        trainable: Params,
        frozen: Params,
        state: Params,
        images: jax.Array,
        task: TaskSpec,
    ) -> tuple[jax.Array, jax.Array | None]:
        """`sigma cos(f_t(x), w_c)` for every class's head column (the loss reads the task's)."""
        feats = self.features(frozen, trainable[KEY]["adapter"], images)
        return head_lib.cosine_head(trainable, feats), None

    def predict(
        self,
        net: Network,
        trainable: Params,
        frozen: Params,
        state: Params,
        images: jax.Array,
        task: TaskSpec,
    ) -> tuple[dict[str, jax.Array], jax.Array]:
        t = jnp.asarray(task.index)
        last = t + self.ptm

        def one(slot: jax.Array) -> jax.Array:
            # A later subspace is skipped (the task index is not batched over seeds, so the
            # cond stays a branch under vmap).
            return jax.lax.cond(
                slot <= last,
                lambda: self.features(frozen, self.slot_adapter(state["adapters"], slot), images),
                lambda: jnp.zeros((images.shape[0], self.width), jnp.float32),
            )

        feats = jax.lax.map(one, jnp.arange(self.slots))
        owner = jnp.asarray(head_lib.class_tasks(task.head_sizes))
        logits = subspace_logits(
            feats,
            state["prototypes"],
            owner,
            t,
            self.ptm,
            self.alpha,
            self.beta,
            self.reweight,
        )
        return base.predictions(logits, task)
