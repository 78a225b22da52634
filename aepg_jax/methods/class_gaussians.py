"""Class-wise Gaussian feature statistics, sampling from them, and classifier alignment on the
samples (docs/algorithm.md §24; SLCA's and HiDe-Prompt's classifier alignment).

Statistics, per class c over the features f_i (D,) of its images:
    n_c = |{i: y_i = c}|      mu_c = (1/n_c) sum_i f_i      M2_c = sum_i (f_i - mu_c)(f_i - mu_c)^T
    Sigma_c = M2_c / (n_c - 1) + ridge I                   (torch.cov's unbiased estimator)
The class sums and counts are `prototypes.ClassSums` (so the means are the prototypes'); M2 is
kept centred and updated batch by batch with Chan et al.'s parallel formula (batch b: count
m_c, mean nu_c, centred M2'_c):
    M2_c <- M2_c + M2'_c + (n_c m_c / (n_c + m_c)) (nu_c - mu_c)(nu_c - mu_c)^T
which in float32 stays within float32 tolerance of a float64 covariance of the stored
features (a raw sum of outer products would cancel catastrophically for large means). The
statistics cover every class of the run from the start (fixed shapes): checkpointed and
vmapped with the method state.

Sampling: `x = mu_c + L_c eps`, eps ~ N(0, I), L_c the Cholesky factor of Sigma_c
(torch's `MultivariateNormal.sample`), factored one class at a time (`cholesky_factors`: a
batched CPU factorization can deadlock a run of several devices in one process).

Alignment (`align_classifier`): the classifier (kernel (D, C), bias (C,)) trained by SGD on
the sampled features, pure and jitted; it takes the samples as input, so a test can feed any
sampler's features (e.g. the reference's own).

Checks on the host (`check_statistics`, `check_alignment`): a class whose statistics are not
finite, or whose covariance has no Cholesky factor in float32 (the factor is then NaN, and so
are its draws and every classifier aligned on them), ends the run with one line naming the
class and its task, instead of NaN predictions. Each reads a (C,) flag vector from one small
jitted reduction; the Cholesky factors are computed again only once an alignment is NaN.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable
from typing import Any

import chex
import flax
import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
from jax.experimental import multihost_utils

from aepg_jax import schedules
from aepg_jax.data import augment
from aepg_jax.methods import prototypes
from aepg_jax.methods.base import NEG

_HI = jax.lax.Precision.HIGHEST
Batch = dict[str, jax.Array]


@flax.struct.dataclass
class ClassGaussians:
    """`sums` (C, D), `counts` (C,) as `prototypes.ClassSums`, and `m2` (C, D, D) the centred
    second moments; float32."""

    sums: jax.Array
    counts: jax.Array
    m2: jax.Array

    @classmethod
    def zeros(cls, num_classes: int, dim: int) -> ClassGaussians:
        s = prototypes.ClassSums.zeros(num_classes, dim)
        return cls(s.sums, s.counts, jnp.zeros((num_classes, dim, dim), jnp.float32))

    @property
    def class_sums(self) -> prototypes.ClassSums:
        return prototypes.ClassSums(self.sums, self.counts)

    def add(self, features: jax.Array, labels: jax.Array, mask: jax.Array) -> ClassGaussians:
        """The statistics with the rows of `features` (B, D) whose `mask` (B,) is True added to
        their class `labels` (B,): Chan's update (module docstring), no per-example loop."""
        num_classes, dim = self.sums.shape
        chex.assert_shape(features, (None, dim))
        chex.assert_equal_shape_prefix((features, labels, mask), 1)
        f = features.astype(jnp.float32)
        m = mask.astype(jnp.float32)
        batch = prototypes.ClassSums.zeros(num_classes, dim).add(f, labels, mask)
        nu = batch.means()  # (C, D) the batch's class means
        centred = (f - nu[labels]) * m[:, None]
        outer = jnp.einsum("bd,be->bde", centred, centred, precision=_HI)
        m2_batch = jnp.zeros_like(self.m2).at[labels].add(outer)
        n, k = self.counts, batch.counts
        delta = nu - self.class_sums.means()
        weight = n * k / jnp.maximum(n + k, 1.0)  # 0 when either side has no example
        m2 = self.m2 + m2_batch + weight[:, None, None] * delta[:, :, None] * delta[:, None, :]
        total = self.class_sums
        total = prototypes.ClassSums(total.sums + batch.sums, total.counts + batch.counts)
        return ClassGaussians(total.sums, total.counts, m2)

    def means(self) -> jax.Array:
        """(C, D) class means; zero rows for classes with no example."""
        return self.class_sums.means()

    def covariances(self, ridge: float = 0.0) -> jax.Array:
        """(C, D, D) `M2_c / (n_c - 1) + ridge I` (unbiased, torch.cov); classes with fewer
        than two examples get `ridge I` alone."""
        dim = self.sums.shape[1]
        denom = jnp.maximum(self.counts - 1.0, 1.0)[:, None, None]
        cov = jnp.where((self.counts > 1.0)[:, None, None], self.m2 / denom, 0.0)
        return cov + ridge * jnp.eye(dim, dtype=jnp.float32)

    def combined(self, other: ClassGaussians) -> ClassGaussians:
        """The statistics of two disjoint sets of images as one: sums and counts add, and
        `M2 = M2_a + M2_b + (n_a n_b / (n_a + n_b)) (mu_b - mu_a)(mu_b - mu_a)^T` (Chan et al.,
        as `add` merges a batch)."""
        delta = other.means() - self.means()
        n, k = self.counts, other.counts
        w = n * k / jnp.maximum(n + k, 1.0)
        m2 = self.m2 + other.m2 + w[:, None, None] * delta[:, :, None] * delta[:, None, :]
        return ClassGaussians(self.sums + other.sums, self.counts + other.counts, m2)


FeatureFn = Callable[[Any, jax.Array], jax.Array]
StatsStep = Callable[[ClassGaussians, Any, Batch], ClassGaussians]


def stats_step(features: FeatureFn, cfg: ml_collections.ConfigDict) -> StatsStep:
    """`class_statistics(stats, params, batch)`: the batch's uint8 images through the test
    transform and `features`, added to `stats` by label (jit it once, `Method.compiled`; run it
    with `prototypes.accumulate`)."""

    def class_statistics(stats: ClassGaussians, params: Any, batch: Batch) -> ClassGaussians:
        images = augment.test_transform(batch["image"], cfg.model.image_size, cfg.input.normalize)
        return stats.add(features(params, images), batch["label"], batch["mask"])

    return class_statistics


def cholesky_factors(covariances: jax.Array) -> jax.Array:
    """(C, D, D) the lower Cholesky factors L_c (L_c L_c^T = Sigma_c), one matrix per call.

    One at a time because of how jaxlib's CPU LAPACK kernels run a batch: above ~2e5 flops
    they cut it into chunks scheduled on XLA:CPU's intra-op thread pool and block the calling
    thread, itself a pool thread when XLA runs the kernel there, until the chunks are done. As
    many batched kernels at once as the pool has threads then wait forever for chunks no thread
    is left to run: one replicated program on as many devices of one process as the machine
    has cores (`--xla_force_host_platform_device_count`) is exactly that. A single matrix is
    factored in the calling thread; each factor equals the batched kernel's (the same LAPACK
    call per matrix)."""
    return jax.lax.map(jnp.linalg.cholesky, covariances.astype(jnp.float32))


def sample(means: jax.Array, covariances: jax.Array, n_per_class: int, key: jax.Array) -> jax.Array:
    """(C, n, D) draws `mu_c + L_c eps` (L_c = cholesky(Sigma_c), eps ~ N(0, I)) for every
    class; `n_per_class` static."""
    chex.assert_shape(covariances, (*means.shape, means.shape[1]))
    return sample_factored(means, cholesky_factors(covariances), n_per_class, key)


def sample_factored(
    means: jax.Array, factors: jax.Array, n_per_class: int, key: jax.Array
) -> jax.Array:
    """`sample` from the covariances' `cholesky_factors` (C, D, D), computed once for many
    draws."""
    num_classes, dim = means.shape
    chex.assert_shape(factors, (num_classes, dim, dim))
    eps = jax.random.normal(key, (num_classes, n_per_class, dim), jnp.float32)
    return means[:, None, :] + jnp.einsum("cde,cne->cnd", factors, eps, precision=_HI)


def shuffled_batches(
    draws: jax.Array, seen: jax.Array, key: jax.Array
) -> tuple[jax.Array, jax.Array]:
    """The draws (C, n, D) of classes `[0, seen)` in one random order, cut into C batches of n:
    `(features (C, n, D), labels (C, n))`; batches `>= seen` hold the other classes' rows and
    are to be skipped (`align_classifier`'s `steps`)."""
    num_classes, n, dim = draws.shape
    labels = jnp.repeat(jnp.arange(num_classes), n)
    order = jax.random.uniform(key, (num_classes * n,)) + (labels >= seen) * 2.0
    perm = jnp.argsort(order)
    feats = draws.reshape(num_classes * n, dim)[perm].reshape(num_classes, n, dim)
    return feats, labels[perm].reshape(num_classes, n)


def per_task_norm_logits(
    logits: jax.Array, head_sizes: tuple[int, ...], seen_tasks: jax.Array, temperature: float
) -> jax.Array:
    """SLCA's logit normalisation: `logits / (mean_{t < seen_tasks} (|logits_t|_2 + 1e-7)) / T`
    with logits_t the columns of task t's head."""
    bounds = [0]
    for size in head_sizes:
        bounds.append(bounds[-1] + size)
    norms = jnp.stack(
        [jnp.linalg.norm(logits[:, a:b], axis=-1) + 1e-7 for a, b in itertools.pairwise(bounds)],
        axis=-1,
    )  # (B, T)
    used = (jnp.arange(len(head_sizes)) < seen_tasks).astype(logits.dtype)
    mean = (norms * used).sum(-1, keepdims=True) / jnp.maximum(used.sum(), 1.0)
    return logits / mean / temperature


def align_classifier(
    kernel: jax.Array,
    bias: jax.Array,
    features: jax.Array,
    labels: jax.Array,
    steps: jax.Array,
    seen: jax.Array,
    seen_tasks: jax.Array,
    *,
    head_sizes: tuple[int, ...],
    learning_rate: float,
    momentum: float = 0.9,
    weight_decay: float = 5e-4,
    temperature: float = 0.0,
) -> tuple[jax.Array, jax.Array, jax.Array]:
    """The classifier after SGD on sampled features: `(kernel (D, C), bias (C,), losses (E, S))`.

    `features` (E, S, B, D) and `labels` (E, S, B): epoch e's S batches; only the first `steps`
    batches of each epoch train (the rest: no update, loss 0). Cross-entropy over classes
    `[0, seen)` of `f W + b` (with `temperature > 0`, of `per_task_norm_logits` over the first
    `seen_tasks` heads). torch's SGD: `g = grad + wd p; buf = m buf + g` (first `buf = g`);
    `p -= lr_e buf`, with `lr_e = lr (1 + cos(pi e / E)) / 2` (CosineAnnealingLR stepped per
    epoch). Only the columns of seen classes change (the others do not exist in the reference).
    """
    epochs, num_steps, _, dim = features.shape
    num_classes = bias.shape[0]
    chex.assert_shape(kernel, (dim, num_classes))
    chex.assert_shape(labels, features.shape[:3])
    seen_cols = jnp.arange(num_classes) < seen

    def loss_fn(params, x, y):
        w, b = params
        logits = jnp.matmul(x, w, precision=_HI) + b
        if temperature > 0:
            logits = per_task_norm_logits(logits, head_sizes, seen_tasks, temperature)
        logits = jnp.where(seen_cols, logits, NEG)
        logp = jax.nn.log_softmax(logits, axis=-1)
        return -jnp.mean(jnp.take_along_axis(logp, y[:, None], axis=-1))

    grad_fn = jax.value_and_grad(loss_fn)

    def epoch_body(carry, inputs):
        e, xs, ys = inputs
        lr = schedules.epoch_cosine(learning_rate, e, epochs)

        def step_body(carry, inp):
            params, buf, first = carry
            s, x, y = inp
            loss, grads = grad_fn(params, x, y)
            g = jax.tree.map(lambda gr, p: gr + weight_decay * p, grads, params)
            new_buf = jax.tree.map(lambda bu, gr: jnp.where(first, gr, momentum * bu + gr), buf, g)
            new_params = jax.tree.map(lambda p, bu: p - lr * bu, params, new_buf)
            w, b = new_params
            new_params = (jnp.where(seen_cols, w, params[0]), jnp.where(seen_cols, b, params[1]))
            live = s < steps

            def keep(new, old):
                return jax.tree.map(lambda a, o: jnp.where(live, a, o), new, old)

            carry = (keep(new_params, params), keep(new_buf, buf), first & ~live)
            return carry, jnp.where(live, loss, 0.0)

        carry, losses = jax.lax.scan(step_body, carry, (jnp.arange(num_steps), xs, ys))
        return carry, losses

    params = (kernel.astype(jnp.float32), bias.astype(jnp.float32))
    init = (params, jax.tree.map(jnp.zeros_like, params), jnp.asarray(True))
    (params, _, _), losses = jax.lax.scan(
        epoch_body, init, (jnp.arange(epochs), features.astype(jnp.float32), labels)
    )
    return params[0], params[1], losses


# -- host-side checks ----------------------------------------------------------------------------


@jax.jit
def finite_rows(tree: Any) -> jax.Array:
    """(C,) True where every leaf's row c (leaves with leading axis C) is finite."""
    flags = [jnp.isfinite(x).reshape(x.shape[0], -1).all(axis=1) for x in jax.tree.leaves(tree)]
    return jnp.stack(flags).all(axis=0)


@jax.jit
def all_finite(tree: Any) -> jax.Array:
    """() True where every leaf of `tree` is finite: one program per tree structure."""
    return jnp.stack([jnp.isfinite(x).all() for x in jax.tree.leaves(tree)]).all()


@jax.jit
def factorable(covariances: jax.Array) -> jax.Array:
    """(C,) True where `sample` can draw from class c: its covariance (D, D) has a finite
    Cholesky factor in float32 (`cholesky_factors`: one matrix per call, as the sampler's), or
    its variances (D,) a finite square root."""
    if covariances.ndim == 2:
        return jnp.isfinite(jnp.sqrt(covariances)).all(axis=1)
    return jnp.isfinite(cholesky_factors(covariances)).all(axis=(1, 2))


def _host(x: jax.Array) -> np.ndarray:
    return np.asarray(multihost_utils.process_allgather(x, tiled=True))


def _class_task(c: int, head_sizes: tuple[int, ...]) -> int:
    """The 1-based task whose head holds class c."""
    return int(np.searchsorted(np.cumsum(head_sizes), c, side="right")) + 1


def check_statistics(
    who: str, stats: Any, classes: np.ndarray, head_sizes: tuple[int, ...], task: int
) -> None:
    """Raises FloatingPointError (one line) naming the first of `classes` ((C,) bool) whose
    statistics (`stats`: arrays with a leading class axis) are not finite after task `task`
    (0-based)."""
    bad = np.flatnonzero(np.asarray(classes) & ~_host(finite_rows(stats)))
    if bad.size:
        c = int(bad[0])
        raise FloatingPointError(
            f"{who}: the feature statistics of class {c} (task {_class_task(c, head_sizes)}) "
            f"are not finite after task {task + 1}: the model's features of its training "
            "images are NaN or inf (a diverged training); lower optim.learning_rate."
        )


def check_alignment(
    who: str,
    aligned: Any,
    covariances: jax.Array,
    seen: np.ndarray,
    head_sizes: tuple[int, ...],
    task: int,
    fix: str,
) -> None:
    """Raises FloatingPointError (one line) when the classifier (any pytree) `aligned` after
    task `task` (0-based) on draws from `covariances` (C, D, D) or variances (C, D) is not
    finite: naming the first `seen` class whose covariance cannot be factored (its draws are
    NaN), or else the alignment itself; `fix` says what to change."""
    if bool(_host(all_finite(aligned))):
        return
    bad = np.flatnonzero(np.asarray(seen) & ~_host(factorable(covariances)))
    after = f"after task {task + 1}"
    if bad.size:
        c = int(bad[0])
        raise FloatingPointError(
            f"{who}: the feature covariance of class {c} (task {_class_task(c, head_sizes)}) "
            f"has no Cholesky factor in float32 (not positive definite), so its Gaussian draws "
            f"and the classifier aligned on them {after} are NaN; {fix}."
        )
    raise FloatingPointError(f"{who}: the classifier aligned {after} is not finite; {fix}.")
