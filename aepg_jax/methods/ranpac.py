"""RanPAC (docs/algorithm.md §22; RanPAC/RanPAC `RanPAC.py`, `inc_net.py`).

Phase 1, first-session adaptation (task 0 only; `trains_task`): the `model.peft` modules and a
cosine classifier train with the configured loss (the reference's cross-entropy there):
    logits = s cos(f(x), w_c)        (`models/head.py`'s `cosine_head`, `CosineLinear`)
with w_c the task heads' kernel columns (`head_init` uniform: U(+-1/sqrt(D)), torch's
`CosineLinear.reset_parameters`; the heads' biases are unused) and s the trainable scale
`cosine_scale`, 1 at the start. Later tasks train nothing (the
PEFT stays as task 0 left it). With `model.peft.kind=none` no task trains (the reference's
"RanPAC without PETL").

Phase 2, after every task t (`end_task`), with f the adapted model's features (the final-norm
class token of the task's training images, test transform), W (D, M) the random projection
drawn once after task 0, h = ReLU(f W) (M = `method.ranpac_m`; M = 0: h = f, no projection):
    G <- G + sum_i h_i h_i^T      (M, M)       Q <- Q + sum_i h_i y_i^T      (M, C)
    W_o = ((G + lam I)^-1 Q)^T    (C, M)       prediction: argmax_c (h W_o^T)_c (seen classes)
lam is chosen per task from {10^-8, ..., 10^8} on the task's own features: the task's images
in a random order (the seed's key; the reference's shuffled loader), the first floor(0.8 N)
fit `(G_fit + lam I)^-1 Q_fit`, the rest score it by the squared error of `h W_o^T` against the
one-hot labels (over every class of the run); the smallest error wins (the first on ties,
numpy's argmin).

How the ridge is solved is this module's choice; the answers are the exact ones. All 17
candidates come from one symmetric eigendecomposition, in float64 on the host (where float32
rounding picks another lam at M >> N):
    dual, n_fit < L (L = M, or D without a projection): the kernel K = H H^T (n_fit, n_fit)
        = U diag(s) U^T, and  h W(lam)^T = (h H^T U) diag(1 / (s + lam)) U^T Y
    primal, otherwise: G_fit = V diag(s) V^T (L, L), and  h W(lam)^T = (h V) diag(1/(s+lam)) V^T Q
(the same W: `H^T (H H^T + lam I)^-1 = (H^T H + lam I)^-1 H^T`). The readout with the chosen lam
is the dual `W_o^T = H^T (H H^T + lam I)^-1 Y` over every row seen while the run has seen
fewer than L rows (the state keeps their features, at most L of them), and the float32 linear
solve of `G + lam I` on the device (the reference's `torch.linalg.solve`) from then on.

G and Q are float32 device arrays, as the reference keeps them (`torch.zeros` defaults,
`RanPAC.py` L254-260), with float32 matmuls at full precision. Memory (per seed): G is M^2
floats (M = 10000: 400 MB, checkpointed with the method state), W and the kept features D M
each, Q and W_o M C; the final device solve holds two more (M, M) matrices while it runs; the
host holds the rows' projections (N x M float64) and their kernel, or, on the primal side,
G_fit and its eigenvectors (2 L^2 float64).

Domain-incremental (`data.scenario=domain`): runs, as the reference's DIL datasets do: task 0
adapts on the first domain, G and Q accumulate over every domain's images with all classes.

The predictions are scores, not probabilities (`Method.scores`): `h W_o^T` is a least-squares
fit to one-hot targets (values near 0 and 1), not the logits of a likelihood model. The
reference (`inc_net.py` `CosineLinear.forward` with `use_RP`) multiplies them by the scale sigma
trained in phase 1, a scale fitted to cosines, not to these outputs; its results read only the
argmax. No calibration is reported (docs/algorithm.md §4).

`method.ranpac_m` is refused before anything is built when the run's peak with G and its
copies (`PEAK_GRAMS` M^2 float32 per seed held, measured) cannot fit the memory the fit check
measures (`memory_problems`, `continual/fit.check_config`).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, ClassVar

import chex
import jax
import jax.numpy as jnp
import ml_collections
import numpy as np

from aepg_jax.data import augment
from aepg_jax.methods import base, prototypes
from aepg_jax.methods.base import Method, Network, Params, TaskContext, TaskSpec
from aepg_jax.models import head, partition
from aepg_jax.system import hosts

RIDGES = 10.0 ** np.arange(-8, 9)  # RanPAC.py L139: the candidate lambdas, in this order
FIT_FRACTION = 0.8  # RanPAC.py L140: the first 80% of the shuffled images fit, the rest score
_HI = jax.lax.Precision.HIGHEST

# RanPAC's args/*_publish.csv (ID 7, every dataset): SGD over the adapters and the cosine head
# (momentum 0.9, lr 0.01 = `body_lr`, weight decay 5e-4), torch's per-epoch CosineAnnealingLR to
# `min_lr` 0 over 20 epochs, batch 48, no clipping (RanPAC.py L231-232). Its adapter
# (`model.peft.adapter_style=ffn`, width 64, scale 0.1) is a `model.peft` setting, not set here.
RANPAC_SETTINGS: dict[str, Any] = {
    "optim.optimizer": "sgd",
    "optim.momentum": 0.9,
    "optim.learning_rate": 0.01,
    "optim.weight_decay": 5e-4,
    "optim.lr_schedule": "cosine_annealing",
    "optim.batch_size": 48,
    "optim.epochs": 20,
    "optim.peft_freeze_epochs": 0,
    "optim.clip_norm": 0.0,
}


# -- the random-projection machinery (pure functions; the method's programs jit them) -----------


def draw_projection(key: jax.Array, width: int, m: int) -> jax.Array:
    """W (D, M) ~ N(0, 1) from `key` (the reference's `torch.randn(D, M)`, from torch's RNG:
    the distribution is the same, the matrix is not)."""
    return jax.random.normal(key, (width, m), jnp.float32)


def project(features: jax.Array, w_rand: jax.Array | None) -> jax.Array:
    """h = ReLU(f W) (B, M), or f itself without a projection (`w_rand` None)."""
    f = features.astype(jnp.float32)
    if w_rand is None:
        return f
    return jax.nn.relu(jnp.matmul(f, w_rand, precision=_HI))


def gram_update(gram: jax.Array, h: jax.Array, weight: jax.Array) -> jax.Array:
    """`G + h^T diag(w) h` (M, M) for h (B, M) and row weights w (B,)."""
    chex.assert_rank(h, 2)
    hw = h * weight.astype(jnp.float32)[:, None]
    return gram + jnp.matmul(hw.T, h, precision=_HI)


def ridge_solve(gram: jax.Array, sums: prototypes.ClassSums, ridge: jax.Array) -> jax.Array:
    """W_o = ((G + lam I)^-1 Q)^T (C, M), Q = `sums.sums^T` (M, C), by a linear solve (the
    reference's `torch.linalg.solve`, not an inverse)."""
    eye = jnp.eye(gram.shape[0], dtype=gram.dtype)
    return jnp.linalg.solve(gram + ridge * eye, sums.sums.T).T


# -- the ridge search and the dual readout: float64 on the host -------------------------------


def project_rows(feats: np.ndarray, w_rand: np.ndarray | None) -> np.ndarray:
    """h = ReLU(f W) (N, M) in float64 on the host, or f itself without a projection."""
    f = np.asarray(feats, np.float64)
    return f if w_rand is None else np.maximum(f @ np.asarray(w_rand, np.float64), 0.0)


def one_hot(labels: np.ndarray, num_classes: int) -> np.ndarray:
    return np.eye(num_classes, dtype=np.float64)[np.asarray(labels)]


def ridge_errors(
    fit: tuple[np.ndarray, np.ndarray],
    val: tuple[np.ndarray, np.ndarray],
    w_rand: np.ndarray | None,
    num_classes: int,
    chunk: int,
) -> np.ndarray:
    """`sum_val ||h W(lam)^T - y||^2` (R,) for each lam of `RIDGES`, W(lam)^T = (G_fit + lam I)^-1
    Q_fit over the `fit` (features, labels) rows, scored on the `val` rows, in float64, from one
    eigendecomposition: every candidate's predictions are `A diag(1 / (s + lam)) B` with
        dual (n_fit < L):  H H^T = U diag(s) U^T,  A = h_val H^T U,  B = U^T Y   (n_fit^2 L)
        primal:            H^T H = V diag(s) V^T,  A = h_val V,      B = V^T Q   (n_fit L^2)
    plus the eigendecomposition, ~9 n_fit^3 or ~9 L^3 flops. s is clipped at 0 (G is PSD)."""
    (f_fit, y_fit), (f_val, y_val) = fit, val
    dim = f_fit.shape[1] if w_rand is None else w_rand.shape[1]
    if len(y_fit) < dim:
        h = project_rows(f_fit, w_rand)
        s, u = np.linalg.eigh(h @ h.T)
        a = (project_rows(f_val, w_rand) @ h.T) @ u
        b = u.T @ one_hot(y_fit, num_classes)
    else:  # chunk by chunk: H_fit (n_fit, L) is never whole on the host
        gram, q = np.zeros((dim, dim)), np.zeros((dim, num_classes))
        for start in range(0, len(y_fit), chunk):
            h = project_rows(f_fit[start : start + chunk], w_rand)
            gram += h.T @ h
            q += h.T @ one_hot(y_fit[start : start + chunk], num_classes)
        s, v = np.linalg.eigh(gram)
        a, b = project_rows(f_val, w_rand) @ v, v.T @ q
    s = np.maximum(s, 0.0)
    y = one_hot(y_val, num_classes)
    return np.asarray([np.sum(((a / (s + lam)) @ b - y) ** 2) for lam in RIDGES])


def dual_readout(
    feats: np.ndarray, labels: np.ndarray, w_rand: np.ndarray | None, num_classes: int, ridge
) -> np.ndarray:
    """W_o = (H^T (H H^T + lam I)^-1 Y)^T (C, L) over the rows (N < L) in float64: the primal
    `((G + lam I)^-1 Q)^T` for G = H^T H, Q = H^T Y, at N^2 L + 2/3 N^3 flops, not 2/3 L^3."""
    h = project_rows(feats, w_rand)
    kernel = h @ h.T
    kernel[np.diag_indices_from(kernel)] += ridge
    return (h.T @ np.linalg.solve(kernel, one_hot(labels, num_classes))).T


def choose_ridge(errors: np.ndarray) -> float:
    """The lambda of the smallest validation error (the first on ties, RanPAC.py L148)."""
    return float(RIDGES[int(np.argmin(np.asarray(errors)))])


class RanPAC(Method):
    """First-session PEFT adaptation, then a frozen random-projection ridge classifier."""

    name = "ranpac"
    # CosineLinear.reset_parameters: U(+-1/sqrt(D)), inc_net.py L24-26.
    layout = head.COSINE_LAYOUT
    official_head_init = "uniform"
    defaults: ClassVar[dict[str, Any]] = {"ranpac_m": 10000}
    scores: ClassVar[dict[str, str]] = {
        "model": "ridge-regression outputs fitted by least squares to one-hot targets, not logits"
    }
    reference_settings: ClassVar[dict[str, Any]] = RANPAC_SETTINGS
    task_data_passes: ClassVar[int] = 1  # the features pass after every task

    def __init__(self, cfg: ml_collections.ConfigDict):
        super().__init__(cfg)
        self.width = int(cfg.model.hidden_size)
        self.m = int(cfg.method.ranpac_m)
        self.dim = self.m if self.m > 0 else self.width  # L: the readout's input width

    @classmethod
    def check(cls, cfg: ml_collections.ConfigDict) -> list[str]:
        m = cfg.method.ranpac_m
        if not (isinstance(m, int) and not isinstance(m, bool) and m >= 0):
            return [f"method.ranpac_m={m!r} must be an integer >= 0 (0: no random projection)."]
        return []

    # The peak RSS of a run grows by about PEAK_GRAMS x M^2 float32 per seed held beyond the
    # process's own (`/usr/bin/time -v`, the default config, 2 tasks: BENCHMARKS.md): G in the
    # state, the accumulation's input and output, the copies placed on the mesh and saved
    # with the checkpoint, kept mapped by the heap (system/memory.py).
    PEAK_GRAMS: ClassVar[int] = 7

    @classmethod
    def memory_problems(
        cls, cfg: ml_collections.ConfigDict, left: int, where: str, seeds: int
    ) -> list[str]:
        """`method.ranpac_m` = M whose statistics cannot fit `left`: `PEAK_GRAMS` M^2 float32
        and the projection W and the kept features (2 D M float32), per seed held (`seeds`:
        every seed on every device that shares `left`)."""
        if cfg.method.name != cls.name:
            return []
        m = cfg.method.ranpac_m
        if not isinstance(m, int) or m <= 0:
            return []
        width = int(cfg.model.hidden_size)
        a, b = 4.0 * seeds * cls.PEAK_GRAMS, 8.0 * seeds * width  # need(M) = a M^2 + b M

        def need(k: int) -> float:
            return a * k * k + b * k

        if need(m) <= left:
            return []
        fits = int((-b + (b * b + 4 * a * max(left, 0)) ** 0.5) / (2 * a))  # need(fits) <= left
        fits = fits // 1000 * 1000 if fits >= 1000 else fits
        set_m = f"method.ranpac_m <= {fits}" if fits else "method.ranpac_m=0 (no projection)"
        return [
            f"method.ranpac_m={m} needs about {need(m) / 2**30:,.1f} GiB for RanPAC's Gram "
            f"matrix, its copies and its ridge solve ({cls.PEAK_GRAMS} x M^2 float32 x {seeds} "
            f"seed(s) held); the {where} is {left / 2**30:.1f} GiB; set {set_m} (the reference's: "
            "10000)."
        ]

    def trains_task(self, task: int) -> bool:
        """Task 0 only (first-session adaptation), and only with a PEFT module to adapt."""
        return task == 0 and self.cfg.model.peft.kind != "none"

    # -- state -------------------------------------------------------------------------------

    def initial_state(self, num_classes: int) -> Params:
        """Zero statistics over the run's `num_classes` classes (W is drawn after task 0)."""
        state = {
            "gram": jnp.zeros((self.dim, self.dim), jnp.float32),
            "sums": prototypes.ClassSums.zeros(num_classes, self.dim),  # Q^T and counts
            "readout": jnp.zeros((num_classes, self.dim), jnp.float32),
            "ridge": jnp.zeros((), jnp.float32),
            # The features of the first L rows seen (the dual readout's), and how many rows.
            "kept_features": jnp.zeros((self.dim, self.width), jnp.float32),
            "kept_labels": jnp.zeros((self.dim,), jnp.int32),
            "rows": jnp.zeros((), jnp.int32),
        }
        if self.m > 0:
            state["w_rand"] = jnp.zeros((self.width, self.m), jnp.float32)
        return state

    def init_state(self, trainable: Params) -> Params:
        return self.initial_state(head.num_classes(trainable))

    def grow(self, task: int, trainable: Params, key: jax.Array) -> Params:
        """The cosine classifier's scale, 1 (`CosineLinear.sigma`), added once."""
        return trainable if head.COSINE_SCALE in trainable else head.with_cosine_scale(trainable)

    # -- the network ---------------------------------------------------------------------------

    def _features(self, net: Network, trainable: Params, frozen: Params, images: jax.Array):
        kept = {k: v for k, v in trainable.items() if k != head.COSINE_SCALE}
        params = partition.merge(kept, frozen)
        heads = head.head_sizes(params)
        return net.apply(params, images, heads)[1]["features"]

    def forward(
        self,
        net: Network,
        trainable: Params,
        frozen: Params,
        state: Params,
        images: jax.Array,
        task: TaskSpec,
    ) -> tuple[jax.Array, jax.Array | None]:
        """`s cos(f, w_c)` over every class of the run (inc_net.py L30-47)."""
        return head.cosine_head(trainable, self._features(net, trainable, frozen, images)), None

    def predict(
        self,
        net: Network,
        trainable: Params,
        frozen: Params,
        state: Params,
        images: jax.Array,
        task: TaskSpec,
    ) -> tuple[dict[str, jax.Array], jax.Array]:
        """`h W_o^T` over the seen classes (the reference keeps rows `[0, seen)` of W_o)."""
        h = project(self._features(net, trainable, frozen, images), state.get("w_rand"))
        return base.predictions(jnp.matmul(h, state["readout"].T, precision=_HI), task)

    # -- host side: the statistics after each task ----------------------------------------

    def _batch_features(self, trainable, frozen, images):
        x = augment.test_transform(images, self.cfg.model.image_size, self.cfg.input.normalize)
        return self._features(Network(self.cfg.model), trainable, frozen, x)

    def task_features(self, ctx: TaskContext, trainable: Params):
        """The adapted model's features (N, D) and labels (N,) of the task's training images,
        in the loader's order, gathered on the host (RanPAC.py L102-113)."""
        step = self.compiled("_batch_features", self._batch_features)
        return base.task_rows(
            ctx, lambda b: step(trainable, ctx.frozen, b["image"]), "RanPAC features"
        )

    def end_task(
        self, task: TaskSpec, trainable: Params, state: Params, ctx: TaskContext
    ) -> Params:
        """Draws W after task 0, adds the task's h to G and Q, picks lam, solves W_o."""
        state = dict(state)
        if self.m > 0 and task.index == 0:  # the same draw on every process, via the host:
            # a process-local jax.Array put on a multi-process mesh makes a malformed array
            w_rand = draw_projection(jax.random.fold_in(ctx.key, 0), self.width, self.m)
            state["w_rand"] = np.asarray(w_rand)
        state = base.on_mesh(state, trainable)  # w_rand drawn here is placed too
        feats, labels = self.task_features(ctx, trainable)
        # Shuffled on the host: a jitted permutation compiles once per task size.
        seed = np.asarray(jax.random.key_data(jax.random.fold_in(ctx.key, 1)))
        order = np.random.default_rng(seed).permutation(len(labels))
        chunk = max(int(self.cfg.eval.batch_size), 1)
        # The host-made leaves (readout, kept rows) replicated on the run's mesh like the rest.
        return base.on_mesh(self.update(state, feats[order], labels[order], chunk), trainable)

    def update(self, state: Params, feats: np.ndarray, labels: np.ndarray, chunk: int) -> Params:
        """The statistics and readout after one task whose features (N, D) and labels are in
        the order that splits them: rows `[0, floor(0.8 N))` fit, the rest validate. The leaves
        made on the host come back as NumPy arrays (`end_task` places them on the run's mesh:
        a process-local jax.Array put on a multi-process mesh makes a malformed array)."""
        chex.assert_rank(feats, 2)
        n = len(labels)
        n_fit = int(n * FIT_FRACTION)
        w_rand = state.get("w_rand")
        acc = self.compiled("_accumulate", _accumulate)
        gram, sums = state["gram"], state["sums"]
        for f, y, w in _chunks(feats, labels, chunk):
            gram, sums = acc(gram, sums, w_rand, f, y, w)
        host = hosts.gather(
            {k: state[k] for k in ("w_rand", "kept_features", "kept_labels", "rows") if k in state}
        )
        w_host, num_classes = host.get("w_rand"), int(sums.counts.shape[0])
        fit, val = (feats[:n_fit], labels[:n_fit]), (feats[n_fit:], labels[n_fit:])
        ridge = choose_ridge(ridge_errors(fit, val, w_host, num_classes, chunk))
        seen = int(host["rows"])
        kept_f, kept_y = np.array(host["kept_features"]), np.array(host["kept_labels"])
        if seen + n <= self.dim:  # the rows still fit: keep them
            kept_f[seen : seen + n], kept_y[seen : seen + n] = feats, labels
        if seen + n < self.dim:  # fewer rows than L: the dual readout, float64
            rows = slice(0, seen + n)
            readout = dual_readout(kept_f[rows], kept_y[rows], w_host, num_classes, ridge)
            readout = readout.astype(np.float32)
        else:
            readout = self.compiled("ridge_solve", ridge_solve)(gram, sums, jnp.float32(ridge))
        return {
            **state,
            "gram": gram,
            "sums": sums,
            "readout": readout,
            "ridge": np.asarray(ridge, np.float32),
            "kept_features": kept_f,
            "kept_labels": kept_y,
            "rows": np.asarray(seen + n, np.int32),
        }

    def host_programs(
        self, trainable: Params, state: Params, frozen: Params, batch, task: int
    ) -> dict[str, tuple[Callable, tuple, int]]:
        """The features pass and the G/Q accumulation (once per batch of the task's training
        images) and the final device solve (once per task, once the run has seen L rows;
        `passes` counts per batch, so the plan over-counts its calls by the task's number of
        batches; XLA's cost analysis does not count the LU solve's FLOPs: 2/3 M^3 a task). The
        ridge search and the dual readout run in float64 NumPy on the host, not listed."""
        b = batch["image"].shape[0]
        f = jnp.zeros((b, self.width), jnp.float32)
        y = jnp.zeros((b,), jnp.int32)
        w = jnp.ones((b,), jnp.float32)
        w_rand = state.get("w_rand")
        g, q = state["gram"], state["sums"]
        w_rand, g, q = base.on_mesh((w_rand, g, q), trainable)
        p = self.compiled
        images = batch["image"]
        return {
            "features": (
                p("_batch_features", self._batch_features),
                (trainable, frozen, images),
                1,
            ),
            "accumulate": (p("_accumulate", _accumulate), (g, q, w_rand, f, y, w), 1),
            "solve": (p("ridge_solve", ridge_solve), (g, q, jnp.float32(1.0)), 1),
        }


def _accumulate(gram, sums, w_rand, f, y, w):
    """One chunk of features (B, D) into the run's G and Q (rows of weight w > 0)."""
    h = project(f, w_rand)
    return gram_update(gram, h, w), sums.add(h, y, w > 0)


def _chunks(feats: np.ndarray, labels: np.ndarray, size: int):
    """`(features (size, D), labels (size,), weight (size,))`, zero-padded to `size`."""
    for start in range(0, len(labels), size):
        f, y = feats[start : start + size], labels[start : start + size]
        pad = size - len(y)
        w = np.concatenate([np.ones(len(y), np.float32), np.zeros(pad, np.float32)])
        yield (
            np.pad(f, ((0, pad), (0, 0))),
            np.pad(y, (0, pad)),
            w,
        )
