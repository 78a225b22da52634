"""Per-example classification losses, in the style of `optax.losses`.

Every loss maps `logits[..., K]` and integer `labels[...]` to a per-example loss `[...]`; the
caller takes the mean. Notation: `p = softmax(logits)`, `p_y` the probability of the label,
`H(p) = -sum_k p_k log p_k`, `K` the number of classes on the last axis.

All functions work from `log_softmax` (no `log(0)`), compute in at least float32 (bfloat16 and
float16 logits are upcast; float64 stays float64) and return that dtype. They are jit, vmap and
grad safe, with finite values and gradients for logits of magnitude 1e4 and for fully confident
predictions.

The paper's methods reduce to:
    * CE      `-log p_y`      gradient `-grad log p_y`          (exploration, high entropy)
    * EPG     `-p_y`          gradient `-p_y grad log p_y`      (exploitation, Eq. 7)
    * aEPG    `alpha_t CE + (1 - alpha_t) EPG`                  (Eq. 10 at the loss level)
so per example `grad CE = grad EPG / p_y` (Eq. 8): same direction, EPG weights each example by
its confidence `p_y`.

`get_loss(name, **hyper)` maps the config names of docs/algorithm.md §1 to these functions.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable, Mapping
from typing import Any

import chex
import jax
import jax.numpy as jnp

Array = jax.Array
LossFn = Callable[..., Array]


def _compute_dtype(x: Array) -> jnp.dtype:
    """float32, or float64 for float64 input: low-precision logits are upcast."""
    return jnp.promote_types(x.dtype, jnp.float32)


def _log_probs(logits: Array) -> Array:
    """`log_softmax(logits)` in the compute dtype."""
    logits = jnp.asarray(logits)
    if logits.ndim < 1:
        raise ValueError(f"logits must have a class axis; got shape {logits.shape}.")
    return jax.nn.log_softmax(logits.astype(_compute_dtype(logits)), axis=-1)


def _label_log_prob(log_p: Array, labels: Array) -> Array:
    """`log p_y`, gathered at the integer labels: `log_p[..., y]`."""
    labels = jnp.asarray(labels)
    chex.assert_type(labels, int)
    chex.assert_equal_shape_prefix((log_p, labels), labels.ndim)
    chex.assert_rank(log_p, labels.ndim + 1)
    return jnp.take_along_axis(log_p, labels[..., None], axis=-1)[..., 0]


def _entropy_from_log_probs(log_p: Array) -> Array:
    """`H(p) = -sum_k p_k log p_k`; terms with `p_k = 0` contribute 0 (also for `-inf` logits)."""
    p = jnp.exp(log_p)
    safe_log_p = jnp.where(p > 0, log_p, 0.0)
    return -jnp.sum(p * safe_log_p, axis=-1)


def cross_entropy(logits: Array, labels: Array) -> Array:
    """Cross-entropy `CE = -log p_y`."""
    return -_label_log_prob(_log_probs(logits), labels)


def epg(logits: Array, labels: Array) -> Array:
    """Expected policy gradient loss `EPG = -p_y` (minus the expected 0-1 reward).

    Its gradient is `-p_y grad log p_y`, the paper's Eq. 7 for a one-hot reward.
    """
    return -jnp.exp(_label_log_prob(_log_probs(logits), labels))


def aepg(logits: Array, labels: Array, alpha: chex.Numeric) -> Array:
    """Annealed mix `alpha * CE + (1 - alpha) * EPG` (paper Eq. 10, loss-level form).

    `alpha` is a scalar (e.g. `alpha_t` from `schedules.sigmoid_anneal`) or broadcasts against
    `labels`. Because `alpha` does not depend on the parameters, the gradient of this loss is
    the paper's gradient-level mix `alpha g_CE + (1 - alpha) g_EPG` at the cost of one backward
    pass.
    """
    log_p_y = _label_log_prob(_log_probs(logits), labels)
    alpha = jnp.asarray(alpha, log_p_y.dtype)
    return alpha * (-log_p_y) + (1.0 - alpha) * (-jnp.exp(log_p_y))


def focal(logits: Array, labels: Array, gamma: float = 1.0) -> Array:
    """Focal loss `(1 - p_y)^gamma * CE`.

    `1 - p_y` is computed as `-expm1(log p_y)` (exact near `p_y = 1`) and clamped at the
    smallest normal float, so the gradient stays finite for `gamma < 1` at `p_y = 1`.
    """
    log_p_y = _label_log_prob(_log_probs(logits), labels)
    one_minus_p = jnp.maximum(-jnp.expm1(log_p_y), jnp.finfo(log_p_y.dtype).tiny)
    return one_minus_p**gamma * (-log_p_y)


def label_smoothing(logits: Array, labels: Array, smoothing: float = 0.05) -> Array:
    """Label smoothing `(1 - g) CE + g KL(u || p)`, `u` uniform over the `K` classes.

    `KL(u || p) = -log K - (1/K) sum_k log p_k`. (This differs from the smoothed-target
    cross-entropy only by the constant `g log K`, so the gradients are the same.)
    """
    log_p = _log_probs(logits)
    ce = -_label_log_prob(log_p, labels)
    num_classes = log_p.shape[-1]
    kl_uniform = -jnp.log(jnp.asarray(num_classes, log_p.dtype)) - jnp.mean(log_p, axis=-1)
    return (1.0 - smoothing) * ce + smoothing * kl_uniform


def confidence_penalty(logits: Array, labels: Array, beta: float = 0.1) -> Array:
    """Confidence penalty `CE - beta H(p)` (raises entropy)."""
    log_p = _log_probs(logits)
    return -_label_log_prob(log_p, labels) - beta * _entropy_from_log_probs(log_p)


def entropy_penalty(logits: Array, labels: Array, beta: float = 1.0) -> Array:
    """Entropy penalty `CE + beta H(p)` (lowers entropy)."""
    log_p = _log_probs(logits)
    return -_label_log_prob(log_p, labels) + beta * _entropy_from_log_probs(log_p)


def entropy(logits: Array) -> Array:
    """Per-example entropy of the predictive distribution, `H(softmax(logits))` in nats."""
    return _entropy_from_log_probs(_log_probs(logits))


def mean_entropy(logits: Array, where: Array | None = None) -> Array:
    """Mean `H(p)` over the examples, optionally only over those with `where` True.

    `where[...]` (bool, the shape of `logits[..., 0]`) masks padded examples in evaluation.
    """
    h = entropy(logits)
    if where is None:
        return jnp.mean(h)
    chex.assert_equal_shape((h, where))
    return jnp.sum(jnp.where(where, h, 0.0)) / jnp.maximum(jnp.sum(where), 1)


def lwf_distillation(
    new_logits: Array, old_logits: Array, temperature: float = 1.0, where: Array | None = None
) -> Array:
    """LwF distillation `T^2 KL(softmax(z_old / T) || softmax(z_new / T))` per example.

    Both inputs hold the *old* classes' logits only (`[..., K_old]`), or all classes with
    `where` (their shape) True on the old ones (the others then count as absent); `old_logits`
    come from the frozen copy of the previous task's model and receive no gradient.
    """
    chex.assert_equal_shape((new_logits, old_logits))
    if where is not None:
        neg = jnp.asarray(-1e30, new_logits.dtype)
        new_logits, old_logits = (jnp.where(where, z, neg) for z in (new_logits, old_logits))
    old_logits = jax.lax.stop_gradient(old_logits)
    log_q = _log_probs(old_logits / temperature)
    log_p = _log_probs(new_logits / temperature)
    q = jnp.exp(log_q)
    kl = jnp.sum(jnp.where(q > 0, q * (log_q - log_p), 0.0), axis=-1)
    return temperature**2 * kl


def mix(logits: Array, labels: Array, alpha: float = 0.5) -> Array:
    """Fixed-alpha mix `alpha CE + (1 - alpha) EPG` (paper Table 4, train from scratch)."""
    return aepg(logits, labels, alpha)


# ----------------------------------------------------------------------------------------------
# Registry: config name -> loss function with validated hyperparameters (docs/algorithm.md §1).


def _in_unit_interval(x: float) -> bool:
    return 0.0 <= x <= 1.0


def _non_negative(x: float) -> bool:
    return x >= 0.0


@dataclasses.dataclass(frozen=True)
class _LossEntry:
    fn: LossFn
    defaults: Mapping[str, float]
    checks: Mapping[str, tuple[Callable[[float], bool], str]]
    annealed: bool = False  # the returned function takes `alpha=alpha_t` at every call


LOSSES: Mapping[str, _LossEntry] = {
    "ce": _LossEntry(cross_entropy, {}, {}),
    "epg": _LossEntry(epg, {}, {}),
    "aepg": _LossEntry(aepg, {}, {}, annealed=True),
    "focal": _LossEntry(focal, {"gamma": 1.0}, {"gamma": (_non_negative, ">= 0")}),
    "label_smoothing": _LossEntry(
        label_smoothing,
        {"smoothing": 0.05},
        {"smoothing": (_in_unit_interval, "in [0, 1]")},
    ),
    "confidence_penalty": _LossEntry(
        confidence_penalty, {"beta": 0.1}, {"beta": (_non_negative, ">= 0")}
    ),
    "entropy_penalty": _LossEntry(
        entropy_penalty, {"beta": 1.0}, {"beta": (_non_negative, ">= 0")}
    ),
    "mix": _LossEntry(mix, {"alpha": 0.5}, {"alpha": (_in_unit_interval, "in [0, 1]")}),
}


def is_annealed(name: str) -> bool:
    """True when the loss `name` takes the schedule's `alpha=alpha_t` at every call (aEPG)."""
    return _entry(name).annealed


def fixed_alpha(name: str, **hyper: Any) -> float | None:
    """The constant alpha of a fixed mix (`mix`'s `alpha`, default filled in), or None: an
    annealed loss takes alpha_t from the schedule, the others use no alpha. What the trainers log
    and plot as alpha."""
    entry = _entry(name)
    if entry.annealed or "alpha" not in entry.defaults:
        return None
    return float(hyper.get("alpha", entry.defaults["alpha"]))


def uses_alpha(name: str) -> bool:
    """True when the loss `name` weighs CE by an alpha (annealed, or a fixed mix)."""
    entry = _entry(name)
    return entry.annealed or "alpha" in entry.defaults


def loss_hyperparameters(name: str) -> dict[str, float]:
    """The hyperparameters the loss `name` accepts, with their default values."""
    return dict(_entry(name).defaults)


def config_hyperparameters(section: Mapping[str, Any]) -> dict[str, float]:
    """The hyperparameters that a config's `loss` section (`name` and values) passes to its
    loss: those the loss accepts, an unset (None) one left to the loss's default."""
    accepted = loss_hyperparameters(section["name"])
    return {k: section[k] for k in accepted if section.get(k) is not None}


def _entry(name: str) -> _LossEntry:
    if name not in LOSSES:
        raise ValueError(f"Unknown loss {name!r}. Valid names: {', '.join(sorted(LOSSES))}.")
    return LOSSES[name]


def get_loss(name: str, **hyper: Any) -> LossFn:
    """Returns the per-example loss `name` with its hyperparameters bound.

    Unset hyperparameters take the defaults of docs/algorithm.md §1. The result is called as
    `loss(logits, labels)`, or `loss(logits, labels, alpha=alpha_t)` when `is_annealed(name)`.
    Raises ValueError naming the valid choices for an unknown name, an unknown hyperparameter
    or a value out of range.
    """
    entry = _entry(name)
    unknown = sorted(set(hyper) - set(entry.defaults))
    if unknown:
        valid = ", ".join(sorted(entry.defaults)) or "none"
        hint = " (aepg's alpha comes from the schedule at every step)" if entry.annealed else ""
        raise ValueError(
            f"Loss {name!r} got unknown hyperparameter(s) {', '.join(unknown)}; "
            f"valid: {valid}{hint}."
        )
    bound = {**entry.defaults, **hyper}
    for key, value in bound.items():
        check, expected = entry.checks[key]
        if not isinstance(value, int | float) or isinstance(value, bool) or not check(value):
            raise ValueError(
                f"Loss {name!r}: {key}={value!r} is invalid; expected a number {expected}."
            )
    return functools.partial(entry.fn, **{k: float(v) for k, v in bound.items()})
