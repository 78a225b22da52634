"""HiDe-Prompt (docs/algorithm.md §25), as thu-ml/HiDe-Prompt (commit 0ed4333) runs it on
ImageNet-R (`training_scripts/train_imr_vit.sh`): three parts, each with its own parameters.

- Within-task prediction (WTP): E-prompts on blocks `hide_prompt_blocks` (0-4), a pool of
  M = `hide_prompt_pool_size` (10) slots E_l (2, M, L, D), L = `hide_prompt_length` key and L
  value tokens per slot, ~ U(-1, 1); task t trains slot t (no keys) and the model's task heads
  under the run's loss, plus the contrastive term below. Before task t >= 1 slot t becomes a
  copy of slot t-1 (`shared_prompt_pool`). With momentum m = `hide_prompt_momentum` (0.01), task
  t >= 1 trains with the prompt `(1 - m) E_t + m sg(mean_{j<t} E_j)` and, after its epochs,
  `E_t <- (1 - m) E_t + m mean_{j<t} E_j` (`engines/hide_promtp_wtp_and_tap_engine.py`).
- Contrastive term (`orth_loss`): with the class means mu_c of the prompted features of the
  classes learned before (c < offset) and the batch's prompted features f_b,
  `M = [mu; f]`, `S = M M^T / 0.8`, `reg * CE(S, diag)` averaged over M's rows,
  reg = `hide_prompt_reg` (0.5).
- Task-identity inference (TII): the frozen backbone's cls feature q(x) through an MLP
  (`Linear(D, hD), GELU, Linear(hD, D)`, plus q, LayerNorm, h = `hide_prompt_tii_hidden` 2)
  and a linear classifier over every class; trained after each task's WTP epochs (in
  `end_task`) for `hide_prompt_tii_epochs` epochs of Adam at `hide_prompt_tii_lr` with the
  gradient norm clipped at 1, CE over the task's own classes (`engines/hide_tii_engine.py`).
- Task-adaptive prediction (TAP): per class, the mean and covariance of its training images'
  features (torch.cov + 1e-4 I; `hide_prompt_storage=variance` keeps the diagonal) for the
  prompted model (slot t) and for the TII input q; from task 1 on, each classifier is aligned
  on features drawn from the Gaussians of every seen class: `hide_prompt_ca_epochs` (30)
  epochs, each one fresh draw shuffled and `offset` batches (the classes learned before) of
  n per class taken from it, SGD (momentum 0.9, no weight decay: the parameter group's 0
  overrides the optimizer's 5e-4) at a per-epoch cosine-annealed rate, logits of unseen
  classes masked. WTP: n = `hide_prompt_tap_batch` (120), rate `hide_prompt_tap_lr` (0.005),
  the task heads. TII: n = `hide_prompt_tii_ca_batch` (24), rate `hide_prompt_tii_ca_lr`
  (0.005 * 24 / 256), the MLP and classifier.
- Prediction: the TII classifier picks the most likely seen class, its task picks the slot,
  the prompted model with the aligned heads gives the logits.
- Non-finite statistics of a task's class, or a NaN alignment (a covariance that float32's
  Cholesky cannot factor), end the run in one line naming the class and its task
  (`class_gaussians.check_statistics`, `check_alignment`).

Method state (fixed shapes, checkpointed): the TII MLP and classifier, the aligned heads, and
both sets of class Gaussians (C means, C covariances or variances). This is not rehearsal-free
in the strict sense: it keeps per-class feature statistics.

Class-incremental only: TII maps a class to its task, which a domain task (every class in
every task) does not allow.
"""

from __future__ import annotations

import functools
import itertools
from collections.abc import Callable
from typing import Any, ClassVar

import chex
import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import optax

from aepg_jax.data import augment
from aepg_jax.methods import base, prompting
from aepg_jax.methods import class_gaussians as cg
from aepg_jax.methods.base import Network, Params, TaskContext, TaskSpec, softmax_probs
from aepg_jax.models import head as head_lib
from aepg_jax.models import partition, vit
from aepg_jax.system import hosts

TEMPERATURE = 0.8  # the contrastive term's, hard-coded in `orth_loss`
RIDGE = 1e-4  # added to every covariance's diagonal (`_compute_mean`)
HI = jax.lax.Precision.HIGHEST

# The official ImageNet-R run (train_imr_vit.sh, second stage; configs/imr_hideprompt_5e.py):
# Adam at 0.03 * 24 / 256, batch 24, 150 epochs, gradient norm clipped at 1. Its timm cosine
# schedule (min 1e-5, stepped after each epoch) is the nearest schedule here, torch's
# CosineAnnealingLR (docs/algorithm.md §25); its head trains at 0.1x the prompts' rate
# (`--larger_prompt_lr`, `method.hide_prompt_head_lr_scale`).
HIDE_PROMPT_SETTINGS: dict[str, Any] = {
    "optim.learning_rate": 0.03 * 24 / 256,
    "optim.batch_size": 24,
    "optim.epochs": 150,
    "optim.peft_freeze_epochs": 0,
    "optim.lr_schedule": "cosine_annealing",
    "optim.clip_norm": 1.0,
}


# -- pure pieces (the official comparison calls these directly) ------------------------------


def layer_norm(x: jax.Array, scale: jax.Array, bias: jax.Array, eps: float = 1e-5) -> jax.Array:
    """torch's `nn.LayerNorm` (biased variance, eps 1e-5)."""
    mu = jnp.mean(x, -1, keepdims=True)
    var = jnp.mean(jnp.square(x - mu), -1, keepdims=True)
    return (x - mu) * jax.lax.rsqrt(var + eps) * scale + bias


def tii_init(key: jax.Array, width: int, hidden: int, num_classes: int) -> Params:
    """The TII MLP and classifier: Linear kernels ~ trunc N(0, 0.02^2) on [-2, 2] (timm's
    `trunc_normal_`, whose bounds are absolute), biases 0, LayerNorm (1, 0)."""
    k1, k2, k3 = jax.random.split(key, 3)

    def trunc(k, shape):
        return jax.random.truncated_normal(k, -100.0, 100.0, shape, jnp.float32) * 0.02

    return {
        "fc1": {"kernel": trunc(k1, (width, hidden * width)), "bias": jnp.zeros(hidden * width)},
        "fc2": {"kernel": trunc(k2, (hidden * width, width)), "bias": jnp.zeros(width)},
        "norm": {"scale": jnp.ones(width), "bias": jnp.zeros(width)},
        "head": {"kernel": trunc(k3, (width, num_classes)), "bias": jnp.zeros(num_classes)},
    }


def tii_logits(tii: Params, q: jax.Array) -> jax.Array:
    """`head(LN(q + fc2(GELU(fc1 q))))` (B, C): `MlpMapping` then the classifier."""
    h = jax.nn.gelu(jnp.matmul(q, tii["fc1"]["kernel"], precision=HI) + tii["fc1"]["bias"], False)
    h = jnp.matmul(h, tii["fc2"]["kernel"], precision=HI) + tii["fc2"]["bias"]
    h = layer_norm(h + q, tii["norm"]["scale"], tii["norm"]["bias"])
    return jnp.matmul(h, tii["head"]["kernel"], precision=HI) + tii["head"]["bias"]


def masked_ce(logits: jax.Array, labels: jax.Array, keep: jax.Array, rows: jax.Array) -> jax.Array:
    """Cross-entropy of `logits` (B, C) with the classes outside `keep` (C,) at -inf, averaged
    over the rows where `rows` (B,) is True (torch's `index_fill(-inf)` then `CrossEntropyLoss`)."""
    logits = jnp.where(keep, logits, -jnp.inf)
    per = -jnp.take_along_axis(jax.nn.log_softmax(logits), labels[:, None], 1)[:, 0]
    w = rows.astype(jnp.float32)
    return jnp.sum(jnp.where(rows, per, 0.0)) / jnp.maximum(jnp.sum(w), 1.0)


def contrastive(features: jax.Array, means: jax.Array, learned: jax.Array) -> jax.Array:
    """`orth_loss` without its weight: CE(S, diag) of `S = M M^T / 0.8`, M the learned classes'
    means (`learned` (C,) True) then the batch's features, over M's rows."""
    chex.assert_rank((features, means), 2)
    m = jnp.concatenate([means, features.astype(jnp.float32)], 0)
    valid = jnp.concatenate([learned, jnp.ones(features.shape[0], bool)])
    sim = jnp.matmul(m, m.T, precision=HI) / TEMPERATURE
    return masked_ce(sim, jnp.arange(m.shape[0]), valid, valid)


def combine(a: cg.ClassGaussians, b: cg.ClassGaussians) -> cg.ClassGaussians:
    """Two sets of statistics over disjoint images as one: sums and counts add, and
    `M2 = M2_a + M2_b + (n_a n_b / (n_a + n_b)) (mu_b - mu_a)(mu_b - mu_a)^T` (Chan et al.,
    as `ClassGaussians.add` merges a batch)."""
    delta = b.means() - a.means()
    n, k = a.counts, b.counts
    w = n * k / jnp.maximum(n + k, 1.0)
    m2 = a.m2 + b.m2 + w[:, None, None] * delta[:, :, None] * delta[:, None, :]
    return cg.ClassGaussians(a.sums + b.sums, a.counts + b.counts, m2)


def draws(
    key: jax.Array, mean: jax.Array, cov: jax.Array, per_class: int, seen, diagonal: bool
) -> tuple[jax.Array, jax.Array]:
    """One epoch's alignment data: `per_class` draws of every class, from N(mean_c, cov_c)
    (`class_gaussians.sample`) or, `diagonal`, N(mean_c, diag(var_c)) (`cov` (C, D)), shuffled
    with the seen classes' first and cut into C batches: (C, n, D) features, (C, n) labels."""
    k_s, k_p = jax.random.split(key)
    if diagonal:
        eps = jax.random.normal(k_s, (mean.shape[0], per_class, mean.shape[1]), jnp.float32)
        x = mean[:, None] + eps * jnp.sqrt(cov)[:, None]
    else:
        x = cg.sample(mean, cov, per_class, k_s)
    return cg.shuffled_batches(x, seen, k_p)


def cosine_rate(lr: float, epoch: int, epochs: int) -> float:
    """torch's `CosineAnnealingLR(T_max=epochs)` stepped once per epoch: epoch e's rate."""
    return lr * 0.5 * (1.0 + float(np.cos(np.pi * epoch / epochs)))


def named(fn: Callable, name: str, **bound: Any) -> Callable:
    """`fn` with `bound` arguments fixed, under `name` (its compilations' name in the logs)."""
    out = functools.partial(fn, **bound)
    out.__name__ = name  # type: ignore[attr-defined]
    return out


# -- the method --------------------------------------------------------------------------------


class HiDePrompt(prompting.PromptMethod):
    """HiDe-Prompt: task prompts, task-identity inference and aligned classifiers from class
    Gaussians."""

    name = "hide_prompt"
    # `VisionTransformer.head = nn.Linear` under timm's `init_weights_vit_timm`, trunc
    # N(0, 0.02^2), bias 0 (vits/hide_prompt_vision_transformer.py `init_weights`);
    # N(0, 0.001^2) before `method.head_init`.
    official_head_init = "trunc_normal"
    head_init_before_field = "normal"
    reference_settings: ClassVar[dict[str, Any]] = HIDE_PROMPT_SETTINGS
    task_data_passes: ClassVar[int] = 2  # the prompted and the backbone statistics pass
    # `grow` draws the prompts at task 0 and returns the tree unchanged after: on the host, so
    # no program is compiled per task.
    grows_on_host: ClassVar[bool] = True
    defaults: ClassVar[dict[str, Any]] = {
        "hide_prompt_pool_size": 10,
        "hide_prompt_length": 20,
        "hide_prompt_blocks": (0, 1, 2, 3, 4),
        "hide_prompt_momentum": 0.01,
        "hide_prompt_reg": 0.5,
        "hide_prompt_tii_hidden": 2,
        "hide_prompt_tii_epochs": 20,
        "hide_prompt_tii_lr": 0.0005 * 24 / 256,
        "hide_prompt_ca_epochs": 30,
        "hide_prompt_tap_lr": 0.005,
        "hide_prompt_tap_batch": 120,
        "hide_prompt_tii_ca_lr": 0.005 * 24 / 256,
        "hide_prompt_tii_ca_batch": 24,
        "hide_prompt_storage": "covariance",
        "hide_prompt_head_lr_scale": 0.1,
    }

    def __init__(self, cfg: ml_collections.ConfigDict):
        super().__init__(cfg)
        self._programs: dict[str, Callable] = {}
        self._place: Callable = lambda tree: tree

    @property
    def lr_scales(self) -> dict[str, float]:
        """The heads train at `hide_prompt_head_lr_scale` (0.1) times the prompts' rate
        (`--larger_prompt_lr`: a parameter group at 0.1 lr)."""
        return {partition.HEAD: float(self.cfg.method.hide_prompt_head_lr_scale)}

    @classmethod
    def check(cls, cfg: ml_collections.ConfigDict) -> list[str]:
        m = cfg.method
        ints = (
            "hide_prompt_pool_size",
            "hide_prompt_length",
            "hide_prompt_tii_hidden",
            "hide_prompt_tii_epochs",
            "hide_prompt_ca_epochs",
            "hide_prompt_tap_batch",
            "hide_prompt_tii_ca_batch",
        )
        p = prompting.positive_int_problems(m, ints)
        for f in ("hide_prompt_momentum", "hide_prompt_reg", "hide_prompt_tii_lr"):
            if not m[f] >= 0:
                p.append(f"method.{f}={m[f]} must be >= 0.")
        if not m.hide_prompt_head_lr_scale > 0:
            p.append(
                f"method.hide_prompt_head_lr_scale={m.hide_prompt_head_lr_scale} must be > 0 "
                "(the heads' rate over the prompts')."
            )
        for f in ("hide_prompt_tap_lr", "hide_prompt_tii_ca_lr"):
            if not m[f] >= 0:
                p.append(f"method.{f}={m[f]} must be >= 0.")
        if m.hide_prompt_storage not in ("covariance", "variance"):
            p.append(
                f"method.hide_prompt_storage={m.hide_prompt_storage!r} must be covariance or "
                "variance."
            )
        if m.name == cls.name:
            p += base.block_problems(
                "hide_prompt_blocks",
                m.hide_prompt_blocks,
                cfg.model.depth,
                cls.defaults["hide_prompt_blocks"],
            )
            if not p and m.hide_prompt_pool_size < cfg.data.num_tasks:
                p.append(
                    f"method.hide_prompt_pool_size={m.hide_prompt_pool_size} must be >= "
                    f"data.num_tasks={cfg.data.num_tasks} (task t trains slot t)."
                )
            if cfg.data.get("scenario", "class") == "domain":
                p.append(
                    "method.name=hide_prompt infers a sample's task from its predicted class, "
                    "which a domain task does not identify; use data.scenario=class."
                )
        return p

    # -- parameters and state ----------------------------------------------------------------

    @property
    def diagonal(self) -> bool:
        return self.cfg.method.hide_prompt_storage == "variance"

    def init_prompts(self, key: jax.Array) -> Params:
        m = self.cfg.method
        n = len(self.blocks("hide_prompt_blocks"))
        shape = (n, 2, m.hide_prompt_pool_size, m.hide_prompt_length, self.width)
        return {"e": prompting.uniform(key, shape, -1.0, 1.0)}

    def init_state(self, trainable: Params) -> Params:
        heads = base.heads_of(trainable)["head"]
        c, d = sum(int(h["bias"].shape[0]) for h in heads.values()), self.width
        cov = (c, d) if self.diagonal else (c, d, d)
        gauss = {"mean": jnp.zeros((c, d)), "cov": jnp.zeros(cov)}
        tii = jax.tree.map(jnp.zeros_like, tii_init(jax.random.key(0), d, self._hidden, c))
        return {"head": heads, "tii": tii, "wtp_stats": gauss, "tii_stats": dict(gauss)}

    @property
    def _hidden(self) -> int:
        return int(self.cfg.method.hide_prompt_tii_hidden)

    def state_like(self, task: int, phase: str, trainable_at: Callable[[int], Params]) -> Params:
        return self.init_state(trainable_at(0))

    # -- prompts -------------------------------------------------------------------------------

    def train_prompt(self, e: jax.Array, task: jax.Array | int) -> jax.Array:
        """Slot `task`'s prompt while training it (n, 2, L, D): `(1 - m) E_t + m sg(mean_{j<t}
        E_j)` for t >= 1, E_0 at task 0."""
        t = jnp.asarray(task)
        cur = jax.lax.dynamic_index_in_dim(e, t, axis=2, keepdims=False)
        before = (jnp.arange(e.shape[2]) < t).astype(e.dtype)
        mean = jnp.einsum("nkmld,m->nkld", e, before) / jnp.maximum(t, 1).astype(e.dtype)
        m = jnp.where(t > 0, self.cfg.method.hide_prompt_momentum, 0.0).astype(e.dtype)
        return (1.0 - m) * cur + m * jax.lax.stop_gradient(mean)

    def slot_prefixes(self, e_sel: jax.Array) -> vit.Prefixes:
        """Prefixes from per-sample prompts (n, 2, B, L, D): sample b's keys are its slot's key
        half, its values the value half (docs/algorithm.md §25 on the official reshape)."""
        return {
            block: (e_sel[i, 0], e_sel[i, 1])
            for i, block in enumerate(self.blocks("hide_prompt_blocks"))
        }

    def prompted_out(
        self, net: Network, trainable: Params, frozen: Params, images: jax.Array, e_sel, heads
    ) -> tuple[jax.Array, jax.Array]:
        """(logits over every head, final-norm cls features) of the prompted backbone."""
        rest = {k: v for k, v in trainable.items() if k not in (prompting.PROMPT, "head")}
        params = partition.merge({**rest, "head": heads}, frozen)
        sizes = head_lib.head_sizes({"head": heads})
        logits, out = prompting.backbone_network(net).apply(
            params, images, sizes, self.slot_prefixes(e_sel)
        )
        return logits, out["features"]

    def train_prefix_prompts(self, e: jax.Array, task, batch: int) -> jax.Array:
        p = self.train_prompt(e, task)  # (n, 2, L, D)
        return jnp.broadcast_to(p[:, :, None], (p.shape[0], 2, batch, *p.shape[2:]))

    def forward(
        self,
        net: Network,
        trainable: Params,
        frozen: Params,
        state: Params,
        images: jax.Array,
        task: TaskSpec,
    ) -> tuple[jax.Array, jax.Array | None]:
        e = trainable[prompting.PROMPT]["e"]
        e_sel = self.train_prefix_prompts(e, task.index, images.shape[0])
        logits, feats = self.prompted_out(net, trainable, frozen, images, e_sel, trainable["head"])
        learned = jnp.arange(state["wtp_stats"]["mean"].shape[0]) < task.learned_before
        extra = self.cfg.method.hide_prompt_reg * contrastive(
            feats, state["wtp_stats"]["mean"], learned
        )
        return logits, extra

    def predict(
        self,
        net: Network,
        trainable: Params,
        frozen: Params,
        state: Params,
        images: jax.Array,
        task: TaskSpec,
    ) -> tuple[dict[str, jax.Array], jax.Array]:
        q = prompting.query(net, frozen, images)
        slot = self.infer_task(state["tii"], q, task)
        e = trainable[prompting.PROMPT]["e"]
        e_sel = e[:, :, slot]  # (n, 2, B, L, D)
        logits, _ = self.prompted_out(net, trainable, frozen, images, e_sel, state["head"])
        logits = base.mask_unseen(logits, task)
        return {"model": softmax_probs(logits)}, logits

    @staticmethod
    def infer_task(tii: Params, q: jax.Array, task: TaskSpec) -> jax.Array:
        """(B,) the task of the TII classifier's most likely seen class."""
        logits = tii_logits(tii, q)
        cls = jnp.argmax(jnp.where(task.seen_mask(logits.shape[-1]), logits, -jnp.inf), -1)
        stops = jnp.cumsum(jnp.asarray(task.head_sizes))
        return jnp.sum(cls[:, None] >= stops[None, :], axis=1).astype(jnp.int32)

    # -- host side -----------------------------------------------------------------------------

    def begin_task(
        self, task: TaskSpec, trainable: Params, state: Params, ctx: TaskContext
    ) -> tuple[Params, Params]:
        """From task 1 on: the heads continue from their aligned values; slot t starts as a
        copy of slot t-1."""
        if task.index == 0:
            return trainable, state
        e = self.programs()["begin"](trainable[prompting.PROMPT]["e"], task.traced())
        return {**trainable, "head": state["head"], prompting.PROMPT: {"e": e}}, state

    def end_task(
        self, task: TaskSpec, trainable: Params, state: Params, ctx: TaskContext
    ) -> Params:
        """Momentum on slot t, both statistics passes, the TII training, both alignments."""
        p = self.programs()
        t = task.traced()
        e = p["momentum"](trainable[prompting.PROMPT]["e"], t)
        trainable = {**trainable, prompting.PROMPT: {"e": e}}
        c, d = state["wtp_stats"]["mean"].shape
        batches = iter(ctx.train_batches())
        first = next(batches)
        # Host-side inputs placed as the programs' outputs will be (replicated on the
        # batches' mesh), and the statistics summed outside the per-batch program: each
        # program compiles once for the run.
        place = self._place = self._placer(first["label"])
        state = place(state)
        wtp = tiig = None
        feats, labels = [], []
        for batch in itertools.chain([first], batches):
            w, g, q = p["stats"](trainable, ctx.frozen, batch, t)
            wtp, tiig = (w, g) if wtp is None else p["combine"]((wtp, tiig), (w, g))
            # Every process's rows of the batch (its global arrays span every process).
            q, y, keep = hosts.gather((q, batch["label"], batch["mask"]))
            keep = keep.astype(bool)
            feats.append(np.asarray(q)[keep])
            labels.append(np.asarray(y)[keep])
        state = {
            **state,
            "wtp_stats": p["merge"](state["wtp_stats"], wtp, t),
            "tii_stats": p["merge"](state["tii_stats"], tiig, t),
        }
        sizes, cls = task.head_sizes, np.arange(c)
        own, seen = (cls >= task.offset) & (cls < task.stop), cls < task.stop
        for name in ("wtp_stats", "tii_stats"):
            cg.check_statistics("HiDe-Prompt", state[name], own, sizes, task.index)
        k_init, k_tii, k_ca, k_tap = jax.random.split(ctx.key, 4)
        tii = place(p["tii_init"](k_init, d, self._hidden, c)) if task.index == 0 else state["tii"]
        tii = self.train_tii(tii, np.concatenate(feats), np.concatenate(labels), task, k_tii)
        heads = place(trainable["head"])
        if task.index > 0:
            m = self.cfg.method
            tii = self.align("tii", tii, state["tii_stats"], task, k_ca, m.hide_prompt_tii_ca_lr)
            wtp_stats = state["wtp_stats"]
            heads, _ = p["tap_align"](heads, k_tap, wtp_stats["mean"], wtp_stats["cov"], t)
            fix = "method.hide_prompt_storage=variance draws from the variances alone"
            for aligned, name in ((tii, "tii_stats"), (heads, "wtp_stats")):
                cov = state[name]["cov"]
                cg.check_alignment("HiDe-Prompt", aligned, cov, seen, sizes, task.index, fix)
        return {**state, "tii": tii, "head": heads}

    @staticmethod
    def _placer(like: jax.Array) -> Callable:
        """`device_put` replicated on `like`'s mesh (a batch's), if it has one."""
        mesh = getattr(like.sharding, "mesh", None)
        if mesh is None:
            return lambda tree: tree
        sharding = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec())
        return lambda tree: jax.device_put(tree, sharding)

    def train_tii(
        self, tii: Params, feats: np.ndarray, labels: np.ndarray, task: TaskSpec, key: jax.Array
    ) -> Params:
        """`hide_prompt_tii_epochs` epochs over the task's features in a random order per
        epoch, batches of `optim.batch_size` (the last one short)."""
        epochs = int(self.cfg.method.hide_prompt_tii_epochs)
        rng = np.random.default_rng(np.asarray(jax.random.key_data(key)).tolist())
        orders = [rng.permutation(len(feats)) for _ in range(epochs)]
        return self.train_tii_orders(tii, feats, labels, task, orders)[0]

    def train_tii_orders(
        self, tii: Params, feats: np.ndarray, labels: np.ndarray, task: TaskSpec, orders
    ) -> tuple[Params, list[jax.Array]]:
        """The TII training over the given per-epoch orders (the official comparison's), and
        each step's loss."""
        bs = int(self.cfg.optim.batch_size)
        step = self.programs()["tii_step"]
        opt_state = self._place(self.programs()["tii_opt_init"](tii))
        t, losses = task.traced(), []
        for order in orders:
            for s in range(0, len(order), bs):
                idx = order[s : s + bs]
                pad = bs - len(idx)
                f = np.concatenate([feats[idx], np.zeros((pad, feats.shape[1]), feats.dtype)])
                y = np.concatenate([labels[idx], np.zeros(pad, labels.dtype)])
                rows = np.arange(bs) < len(idx)
                tii, opt_state, loss = step(tii, opt_state, f, y, rows, t)
                losses.append(loss)
        return tii, losses

    def tii_optimizer(self) -> optax.GradientTransformation:
        return optax.chain(
            optax.clip_by_global_norm(1.0), optax.adam(self.cfg.method.hide_prompt_tii_lr)
        )

    def align(self, which: str, params: Params, stats: Params, task: TaskSpec, key, lr) -> Params:
        """`hide_prompt_ca_epochs` epochs of alignment of the TII model on fresh draws from the
        seen classes' Gaussians (`class_gaussians.align_classifier` aligns a linear classifier;
        this one has the MLP in front)."""
        epochs = int(self.cfg.method.hide_prompt_ca_epochs)
        p = self.programs()
        draw, step = p[f"{which}_draw"], p[f"{which}_align"]
        opt_state = self._place(p["sgd_init"](params))
        t = task.traced()
        for epoch, k in enumerate(jax.random.split(key, epochs)):
            feats, labels = draw(k, stats["mean"], stats["cov"], t)
            rate = jnp.float32(cosine_rate(lr, epoch, epochs))
            for i in range(int(task.offset)):
                params, opt_state, _ = step(params, opt_state, feats, labels, i, rate, t)
        return params

    def align_batch(self, params, opt_state, feats, labels, rate, task):
        """One TII alignment step on given features (n, D) and labels, classes after the task
        masked: (params, opt_state, loss)."""
        return self.programs()["tii_align"](
            params, opt_state, feats[None], labels[None], 0, jnp.float32(rate), task.traced()
        )

    def programs(self) -> dict[str, Callable]:
        """The jitted host-side programs, built once per instance (one compilation per run)."""
        if self._programs:
            return self._programs
        cfg, diagonal, m = self.cfg, self.diagonal, self.cfg.method

        def begin(e, task):
            return e.at[:, :, task.index].set(e[:, :, task.index - 1])

        def merge(old, acc, task):
            """The task's own classes' (mean, cov) from `acc`, the others' from `old`."""
            mean, cov = acc.means(), acc.covariances(RIDGE)
            if diagonal:
                cov = jnp.diagonal(cov, axis1=1, axis2=2)
            cls = jnp.arange(mean.shape[0])
            own = (cls >= task.offset) & (cls < task.stop)
            pick = lambda new, cur: jnp.where(own.reshape((-1,) + (1,) * (new.ndim - 1)), new, cur)
            return {"mean": pick(mean, old["mean"]), "cov": pick(cov, old["cov"])}

        def momentum(e, task):
            cur = self.train_prompt(e, task.index)
            return e.at[:, :, task.index].set(jnp.where(task.index > 0, cur, e[:, :, task.index]))

        def stats(trainable, frozen, batch, task):
            """One batch's (prompted, backbone) feature moments, and its backbone features."""
            images = augment.test_transform(
                batch["image"], cfg.model.image_size, cfg.input.normalize
            )
            net = Network(cfg.model)
            b = images.shape[0]
            e = trainable[prompting.PROMPT]["e"]
            slot = jax.lax.dynamic_index_in_dim(e, task.index, axis=2, keepdims=False)
            e_sel = jnp.broadcast_to(slot[:, :, None], (e.shape[0], 2, b, *e.shape[3:]))
            _, feats = self.prompted_out(net, trainable, frozen, images, e_sel, trainable["head"])
            q = prompting.query(net, frozen, images)
            c = head_lib.head_sizes({"head": trainable["head"]})
            zeros = cg.ClassGaussians.zeros(sum(c), feats.shape[-1])
            wtp = zeros.add(feats, batch["label"], batch["mask"])
            tiig = zeros.add(q, batch["label"], batch["mask"])
            return wtp, tiig, q

        tii_opt = self.tii_optimizer()

        def tii_step(tii, opt_state, feats, labels, rows, task):
            keep = (jnp.arange(tii["head"]["bias"].shape[0]) >= task.offset) & (
                jnp.arange(tii["head"]["bias"].shape[0]) < task.stop
            )
            loss, g = jax.value_and_grad(
                lambda p: masked_ce(tii_logits(p, feats), labels, keep, rows)
            )(tii)
            updates, opt_state = tii_opt.update(g, opt_state, tii)
            return optax.apply_updates(tii, updates), opt_state, loss

        def draw(key, mean, cov, task, per_class):
            return draws(key, mean, cov, per_class, task.stop, diagonal)

        def tap_align(heads, key, mean, cov, task):
            """The heads aligned (`class_gaussians.align_classifier`) on every epoch's draws."""
            epochs = int(m.hide_prompt_ca_epochs)
            n = int(m.hide_prompt_tap_batch)
            x, y = jax.vmap(lambda k: draw(k, mean, cov, task, n))(jax.random.split(key, epochs))
            return align_heads(heads, x, y, task)

        def align_heads(heads, x, y, task):
            """The heads after SGD on given draws x (E, S, n, D), y (E, S, n): the first
            `task.offset` batches of each epoch train."""
            sizes = head_lib.head_sizes({"head": heads})
            names = [head_lib.task_name(i) for i in range(len(sizes))]
            kernel = jnp.concatenate([heads[k]["kernel"] for k in names], axis=1)
            bias = jnp.concatenate([heads[k]["bias"] for k in names])
            kernel, bias, losses = cg.align_classifier(
                kernel, bias, x, y, task.offset, task.stop, task.index + 1,
                head_sizes=sizes, learning_rate=float(m.hide_prompt_tap_lr), weight_decay=0.0,
            )  # fmt: skip
            cuts = np.cumsum(sizes)[:-1]
            out = {
                k: {"kernel": w, "bias": b_}
                for k, w, b_ in zip(
                    names, jnp.split(kernel, cuts, axis=1), jnp.split(bias, cuts), strict=True
                )
            }
            return out, losses

        def aligner(logits_fn):
            sgd = optax.sgd(1.0, momentum=0.9)

            def align_step(params, opt_state, feats, labels, i, rate, task):
                f, y = feats[i], labels[i]

                def loss_fn(p):
                    logits = logits_fn(p, f)
                    keep = jnp.arange(logits.shape[-1]) < task.stop
                    return masked_ce(logits, y, keep, jnp.ones(y.shape[0], bool))

                loss, g = jax.value_and_grad(loss_fn)(params)
                updates, opt_state = sgd.update(g, opt_state, params)
                updates = jax.tree.map(lambda u: rate * u, updates)
                return optax.apply_updates(params, updates), opt_state, loss

            return align_step

        def head_logits(heads, f):
            sizes = head_lib.head_sizes({"head": heads})
            return head_lib.TaskHeads(sizes).apply({"params": heads}, f)

        self._programs = {
            "momentum": jax.jit(momentum),
            "stats": jax.jit(stats),
            "tii_step": jax.jit(tii_step),
            "begin": jax.jit(begin),
            "tii_opt_init": jax.jit(tii_opt.init),
            "sgd_init": jax.jit(optax.sgd(1.0, momentum=0.9).init),
            "merge": jax.jit(merge),
            "tii_init": jax.jit(tii_init, static_argnums=(1, 2, 3)),
            "combine": jax.jit(lambda a, b: (combine(a[0], b[0]), combine(a[1], b[1]))),
            "tii_draw": jax.jit(named(draw, "tii_draw", per_class=int(m.hide_prompt_tii_ca_batch))),
            "tap_align": jax.jit(tap_align),
            "align_heads": jax.jit(align_heads),
            "tii_align": jax.jit(named(aligner(tii_logits), "tii_align")),
        }
        return self._programs

    def host_programs(
        self, trainable: Params, state: Params, frozen: Params, batch, task: int
    ) -> dict[str, tuple[Callable, tuple, int]]:
        """The statistics pass over the task's images, once per task (per batch), and the
        heads' alignment, once per task from task 1 (its draws of every epoch are one
        (epochs, C, n, D) input: the largest host-side buffer; `passes` counts per batch, so
        the plan over-counts its calls by the task's number of batches). The TII training and
        alignment run on (batch, D) features: far smaller."""
        p = self.programs()
        sizes = head_lib.head_sizes(trainable)
        t = TaskSpec(task, 0, 1, 0, sizes).traced()
        stats = state["wtp_stats"]
        key = jax.random.key(0)
        tap = (trainable["head"], key, stats["mean"], stats["cov"], t)
        return {
            "stats": (p["stats"], (trainable, frozen, batch, t), 1),
            "tap_align": (p["tap_align"], tap, 1),
        }
