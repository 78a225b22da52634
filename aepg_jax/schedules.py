"""Annealing schedules for the CE/EPG mixing weight `alpha_t`, as `optax.Schedule`s.

A schedule maps the 0-based optimizer step `t` within a task to `alpha_t` in [0, 1]; `T` is the
task's total number of optimizer steps (docs/algorithm.md §2). Steps outside `[0, T]` are
clipped, so `alpha` holds its end value after the task. All schedules are jit-safe (traced `t`).

  sigmoid   alpha_t = sigmoid(tau (T - 2t) / T)      (the paper's aEPG schedule, tau = 6)
  linear    alpha_t = (T - t) / T
  cosine    alpha_t = 0.5 + 0.5 cos(pi t / T)
  constant  alpha_t = alpha

`per_task` joins one schedule per task with `optax.join_schedules`, so the schedule restarts at
every task boundary. `epoch_cosine` is the per-epoch cosine learning rate of the methods'
reference code (torch's `CosineAnnealingLR` stepped once per epoch).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any

import chex
import jax
import jax.numpy as jnp
import numpy as np
import optax


def _check_total_steps(total_steps: int | jax.Array) -> int | jax.Array:
    if isinstance(total_steps, jax.Array):  # traced: one program serves tasks of any length
        return total_steps
    if isinstance(total_steps, bool) or not isinstance(total_steps, int | np.integer):
        raise TypeError(f"total_steps must be an int; got {total_steps!r}.")
    if total_steps <= 0:
        raise ValueError(f"total_steps must be positive; got {total_steps}.")
    return int(total_steps)


def _fraction(step: chex.Numeric, total_steps: int | jax.Array) -> jax.Array:
    """`clip(t, 0, T) / T` in float32 (`T` a Python int or a traced integer)."""
    if isinstance(total_steps, jax.Array):
        total = jnp.asarray(total_steps, jnp.float32)
        return jnp.clip(jnp.asarray(step, jnp.float32), 0.0, total) / total
    t = jnp.clip(jnp.asarray(step, jnp.float32), 0.0, float(total_steps))
    return t / total_steps


def sigmoid_anneal(total_steps: int, tau: float = 6.0) -> optax.Schedule:
    """`alpha_t = sigmoid(tau (T - 2t) / T)`: from `sigmoid(tau)` at t=0 to `sigmoid(-tau)` at T.

    With tau = 4 / 6 / 8, alpha_0 = .9820 / .9975 / .9997 (paper Table 8).
    """
    total_steps = _check_total_steps(total_steps)
    if not tau > 0:
        raise ValueError(f"tau must be positive; got {tau}.")

    def schedule(step):
        return jax.nn.sigmoid(tau * (1.0 - 2.0 * _fraction(step, total_steps)))

    return schedule


def linear_anneal(total_steps: int) -> optax.Schedule:
    """`alpha_t = (T - t) / T`: from 1 at t=0 to 0 at T."""
    total_steps = _check_total_steps(total_steps)
    return lambda step: 1.0 - _fraction(step, total_steps)


def cosine_anneal(total_steps: int) -> optax.Schedule:
    """`alpha_t = 0.5 + 0.5 cos(pi t / T)`: from 1 at t=0 to 0 at T."""
    total_steps = _check_total_steps(total_steps)
    return lambda step: 0.5 + 0.5 * jnp.cos(math.pi * _fraction(step, total_steps))


def epoch_cosine(lr: float, epoch: Any, epochs: int) -> Any:
    """torch's `CosineAnnealingLR(T_max=epochs, eta_min=0)` stepped once per epoch: epoch e's
    rate `lr (1 + cos(pi e / E)) / 2`, traced for a traced `epoch`, a float64-exact Python
    float for an int one (a host loop's)."""
    if isinstance(epoch, int | np.integer):
        return lr * 0.5 * (1.0 + float(np.cos(np.pi * epoch / epochs)))
    return lr * 0.5 * (1.0 + jnp.cos(jnp.pi * epoch / epochs))


def constant(alpha: float) -> optax.Schedule:
    """`alpha_t = alpha` for every step (the paper's fixed-alpha `mix`)."""
    if not 0.0 <= alpha <= 1.0:
        raise ValueError(f"alpha must be in [0, 1]; got {alpha}.")
    return lambda step: jnp.full(jnp.shape(step), alpha, jnp.float32)


SCHEDULES: dict[str, Callable[..., optax.Schedule]] = {
    "sigmoid": sigmoid_anneal,
    "linear": linear_anneal,
    "cosine": cosine_anneal,
    "constant": lambda total_steps, alpha=1.0: constant(alpha),
}


def get_schedule(name: str, total_steps: int, **hyper: Any) -> optax.Schedule:
    """The schedule `name` (sigmoid | linear | cosine | constant) over a task of `total_steps`.

    Hyperparameters: `tau` for sigmoid, `alpha` for constant, none for linear and cosine.
    """
    valid = {"sigmoid": {"tau"}, "linear": set(), "cosine": set(), "constant": {"alpha"}}
    if name not in SCHEDULES:
        raise ValueError(f"Unknown alpha schedule {name!r}. Valid: {', '.join(SCHEDULES)}.")
    unknown = sorted(set(hyper) - valid[name])
    if unknown:
        raise ValueError(
            f"Schedule {name!r} got unknown hyperparameter(s) {', '.join(unknown)}; "
            f"valid: {', '.join(sorted(valid[name])) or 'none'}."
        )
    return SCHEDULES[name](total_steps, **hyper)


def config_hyperparameters(section: Any) -> dict[str, float]:
    """The hyperparameters that a config's `schedule` section passes to `get_schedule`."""
    by_name = {"sigmoid": ("tau",), "constant": ("alpha",)}
    return {k: section[k] for k in by_name.get(section["name"], ())}


def per_task(
    make_schedule: Callable[[int], optax.Schedule], steps_per_task: Sequence[int]
) -> optax.Schedule:
    """One schedule per task, restarting at each boundary (`optax.join_schedules`).

    `make_schedule(T_i)` builds task i's schedule; on the global step `s` with
    `S_i <= s < S_{i+1}` (`S_i` = steps of the tasks before i) it is evaluated at `s - S_i`.
    """
    if not steps_per_task:
        raise ValueError("steps_per_task is empty: there must be at least one task.")
    schedules = [make_schedule(_check_total_steps(steps)) for steps in steps_per_task]
    boundaries = np.cumsum(steps_per_task)[:-1].tolist()
    return optax.join_schedules(schedules, boundaries)
