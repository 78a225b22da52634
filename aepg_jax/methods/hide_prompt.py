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
from collections.abc import Callable
from typing import Any, ClassVar

import chex
import jax
import jax.numpy as jnp
import ml_collections
import numpy as np

from aepg_jax.data import augment
from aepg_jax.methods import base, blocks, prompting
from aepg_jax.methods import class_gaussians as cg
from aepg_jax.methods import task_identity as tii_lib
from aepg_jax.methods.base import Network, Params, TaskContext, TaskSpec
from aepg_jax.models import head as head_lib
from aepg_jax.models import partition, vit

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


def contrastive(features: jax.Array, means: jax.Array, learned: jax.Array) -> jax.Array:
    """`orth_loss` without its weight: CE(S, diag) of `S = M M^T / 0.8`, M the learned classes'
    means (`learned` (C,) True) then the batch's features, over M's rows."""
    chex.assert_rank((features, means), 2)
    m = jnp.concatenate([means, features.astype(jnp.float32)], 0)
    valid = jnp.concatenate([learned, jnp.ones(features.shape[0], bool)])
    sim = jnp.matmul(m, m.T, precision=HI) / TEMPERATURE
    return tii_lib.masked_ce(sim, jnp.arange(m.shape[0]), valid, valid)


def merge_statistics(old: Params, acc: cg.ClassGaussians, task: TaskSpec, diagonal: bool):
    """The task's own classes' (mean, cov) from `acc` (cov + 1e-4 I; its diagonal alone with
    `diagonal`), the other classes' from `old`."""
    mean, cov = acc.means(), acc.covariances(RIDGE)
    if diagonal:
        cov = jnp.diagonal(cov, axis1=1, axis2=2)
    cls = jnp.arange(mean.shape[0])
    own = (cls >= task.offset) & (cls < task.stop)
    pick = lambda new, cur: jnp.where(own.reshape((-1,) + (1,) * (new.ndim - 1)), new, cur)
    return {"mean": pick(mean, old["mean"]), "cov": pick(cov, old["cov"])}


def combined(a, b):
    """Two batches' (prompted, backbone) statistics as one (`ClassGaussians.combined`)."""
    return a[0].combined(b[0]), a[1].combined(b[1])


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
            p += blocks.block_problems(
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
        c, d = head_lib.num_classes(trainable), self.width
        cov = (c, d) if self.diagonal else (c, d, d)
        gauss = {"mean": jnp.zeros((c, d)), "cov": jnp.zeros(cov)}
        tii = jax.tree.map(jnp.zeros_like, tii_lib.init(jax.random.key(0), d, self._hidden, c))
        return {"head": heads, "tii": tii, "wtp_stats": gauss, "tii_stats": dict(gauss)}

    @property
    def _hidden(self) -> int:
        return int(self.cfg.method.hide_prompt_tii_hidden)

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
        return base.predictions(logits, task)

    @staticmethod
    def infer_task(tii: Params, q: jax.Array, task: TaskSpec) -> jax.Array:
        """(B,) the task of the TII classifier's most likely seen class."""
        logits = tii_lib.logits(tii, q)
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
        e = self.compiled("begin", begin)(trainable[prompting.PROMPT]["e"], task.traced())
        return {**trainable, "head": state["head"], prompting.PROMPT: {"e": e}}, state

    def momentum(self, e: jax.Array, task: TaskSpec) -> jax.Array:
        """The prompts with slot t's momentum step after its epochs (t >= 1)."""
        cur = self.train_prompt(e, task.index)
        return e.at[:, :, task.index].set(jnp.where(task.index > 0, cur, e[:, :, task.index]))

    def statistics(self, trainable: Params, frozen: Params, batch, task: TaskSpec):
        """One batch's (prompted, backbone) feature moments, and its backbone features q."""
        cfg = self.cfg
        images = augment.test_transform(batch["image"], cfg.model.image_size, cfg.input.normalize)
        net = Network(cfg.model)
        e = trainable[prompting.PROMPT]["e"]
        slot = jax.lax.dynamic_index_in_dim(e, task.index, axis=2, keepdims=False)
        e_sel = jnp.broadcast_to(slot[:, :, None], (e.shape[0], 2, images.shape[0], *e.shape[3:]))
        _, feats = self.prompted_out(net, trainable, frozen, images, e_sel, trainable["head"])
        q = prompting.query(net, frozen, images)
        zeros = cg.ClassGaussians.zeros(head_lib.num_classes(trainable), feats.shape[-1])
        wtp = zeros.add(feats, batch["label"], batch["mask"])
        return wtp, zeros.add(q, batch["label"], batch["mask"]), q

    def end_task(
        self, task: TaskSpec, trainable: Params, state: Params, ctx: TaskContext
    ) -> Params:
        """Momentum on slot t, both statistics passes, the TII training, both alignments."""
        t, m, p = task.traced(), self.cfg.method, self.compiled
        e = p("momentum", self.momentum)(trainable[prompting.PROMPT]["e"], t)
        trainable = {**trainable, prompting.PROMPT: {"e": e}}
        c, d = state["wtp_stats"]["mean"].shape
        # Host-side inputs placed as the programs' outputs will be, and the statistics summed
        # outside the per-batch program: each program compiles once for the run.
        state = base.on_mesh(state, ctx.frozen)
        sums = []

        def one(batch):
            wtp, tiig, q = p("statistics", self.statistics)(trainable, ctx.frozen, batch, t)
            sums[:] = [(wtp, tiig) if not sums else p("combined", combined)(sums[0], (wtp, tiig))]
            return q

        feats, labels = base.task_rows(ctx, one, f"task {task.index + 1} HiDe-Prompt statistics")
        merge = p("merge_statistics", merge_statistics, static_argnums=3)
        state = {
            **state,
            "wtp_stats": merge(state["wtp_stats"], sums[0][0], t, self.diagonal),
            "tii_stats": merge(state["tii_stats"], sums[0][1], t, self.diagonal),
        }
        sizes, cls = task.head_sizes, np.arange(c)
        own, seen = (cls >= task.offset) & (cls < task.stop), cls < task.stop
        for name in ("wtp_stats", "tii_stats"):
            cg.check_statistics("HiDe-Prompt", state[name], own, sizes, task.index)
        k_init, k_tii, k_ca, k_tap = jax.random.split(ctx.key, 4)
        if task.index == 0:
            init = p("tii_init", tii_lib.init, static_argnums=(1, 2, 3))
            tii = base.on_mesh(init(k_init, d, self._hidden, c), ctx.frozen)
        else:
            tii = state["tii"]
        tii = self.train_tii(tii, feats, labels, task, k_tii)
        heads = base.on_mesh(trainable["head"], ctx.frozen)
        if task.index > 0:
            sgd = base.on_mesh(p("sgd_init", tii_lib.SGD.init)(tii), ctx.frozen)
            step, lr = p("tii_align", tii_lib.align_step), m.hide_prompt_tii_ca_lr
            tii = tii_lib.align(
                step, self.tii_draw(), tii, sgd, state["tii_stats"], task, k_ca, lr,
                int(m.hide_prompt_ca_epochs),
            )  # fmt: skip
            stats = state["wtp_stats"]
            heads, _ = self.tap_align()(heads, k_tap, stats["mean"], stats["cov"], t)
            fix = "method.hide_prompt_storage=variance draws from the variances alone"
            for aligned, name in ((tii, "tii_stats"), (heads, "wtp_stats")):
                cov = state[name]["cov"]
                cg.check_alignment("HiDe-Prompt", aligned, cov, seen, sizes, task.index, fix)
        return {**state, "tii": tii, "head": heads}

    def train_tii(
        self, tii: Params, feats: np.ndarray, labels: np.ndarray, task: TaskSpec, key: jax.Array
    ) -> Params:
        """`hide_prompt_tii_epochs` epochs over the task's features in a random order per
        epoch, batches of `optim.batch_size` (the last one short)."""
        epochs = int(self.cfg.method.hide_prompt_tii_epochs)
        rng = np.random.default_rng(np.asarray(jax.random.key_data(key)).tolist())
        orders = [rng.permutation(len(feats)) for _ in range(epochs)]
        lr, bs = float(self.cfg.method.hide_prompt_tii_lr), int(self.cfg.optim.batch_size)
        opt_state = base.on_mesh(
            self.compiled("tii_opt_init", tii_lib.optimizer(lr).init)(tii), tii
        )
        step = self.compiled("tii_step", functools.partial(tii_lib.train_step, lr=lr))
        return tii_lib.train(step, tii, opt_state, feats, labels, task, orders, bs)[0]

    # -- the jitted host-side programs (one compilation each per run) -------------------------

    def tii_draw(self) -> Callable:
        m = self.cfg.method
        n, diagonal = int(m.hide_prompt_tii_ca_batch), self.diagonal

        def tii_draw(key, mean, cov, task):
            return tii_lib.draws(key, mean, cov, n, task.stop, diagonal)

        return self.compiled("tii_draw", tii_draw)

    def tap_align(self) -> Callable:
        m = self.cfg.method
        align = functools.partial(
            tii_lib.tap_align,
            epochs=int(m.hide_prompt_ca_epochs),
            per_class=int(m.hide_prompt_tap_batch),
            diagonal=self.diagonal,
            lr=float(m.hide_prompt_tap_lr),
        )
        return self.compiled("tap_align", align)

    def host_programs(
        self, trainable: Params, state: Params, frozen: Params, batch, task: int
    ) -> dict[str, tuple[Callable, tuple, int]]:
        """The statistics pass over the task's images, once per task (per batch), and the
        heads' alignment, once per task from task 1 (its draws of every epoch are one
        (epochs, C, n, D) input: the largest host-side buffer; `passes` counts per batch, so
        the plan over-counts its calls by the task's number of batches). The TII training and
        alignment run on (batch, D) features: far smaller."""
        sizes = head_lib.head_sizes(trainable)
        t = TaskSpec(task, 0, 1, 0, sizes).traced()
        stats = state["wtp_stats"]
        key = jax.random.key(0)
        tap = (trainable["head"], key, stats["mean"], stats["cov"], t)
        stats_pass = self.compiled("statistics", self.statistics)
        return {
            "stats": (stats_pass, (trainable, frozen, batch, t), 1),
            "tap_align": (self.tap_align(), tap, 1),
        }


def begin(e: jax.Array, task: TaskSpec) -> jax.Array:
    """The prompts with slot t a copy of slot t-1."""
    return e.at[:, :, task.index].set(e[:, :, task.index - 1])
