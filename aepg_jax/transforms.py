"""Optax gradient transformation for the paper's gradient-level aEPG update (Eq. 10).

`anneal_gradients(schedule)` takes a *pair* of gradient trees `(g_explore, g_exploit)` (the
gradients of the CE and EPG losses) and emits `alpha_t g_explore + (1 - alpha_t) g_exploit`,
with `alpha_t = schedule(t)` and `t` its own update count. Placed first in an `optax.chain`,
the rest of the chain sees one ordinary gradient tree:

    opt = optax.chain(anneal_gradients(sigmoid_anneal(T)), optax.adam(5e-4))
    updates, state = opt.update((g_ce, g_epg), state, params)

The training step does not use it: because `alpha_t` does not depend on the parameters,
`grad(alpha_t CE + (1 - alpha_t) EPG)` (`losses.aepg`) is the same update with one backward
pass instead of two. This transformation exists for users who compute the two gradients
separately (e.g. to log both) and as the executable form of Eq. 10; a test checks that both
paths give the same parameters.
"""

from __future__ import annotations

from typing import NamedTuple

import chex
import jax
import jax.numpy as jnp
import optax


class AnnealGradientsState(NamedTuple):
    """`count`: number of updates applied so far (the `t` of `alpha_t`)."""

    count: chex.Array


def anneal_gradients(schedule: optax.Schedule) -> optax.GradientTransformation:
    """`(g_explore, g_exploit) -> alpha_t g_explore + (1 - alpha_t) g_exploit`, t = update count."""

    def init_fn(params: optax.Params) -> AnnealGradientsState:
        del params
        return AnnealGradientsState(count=jnp.zeros([], jnp.int32))

    def update_fn(updates, state: AnnealGradientsState, params=None):
        del params
        if not (isinstance(updates, tuple) and len(updates) == 2):
            raise TypeError(
                "anneal_gradients expects updates=(g_explore, g_exploit), a pair of gradient "
                f"trees (CE and EPG gradients); got {type(updates).__name__}."
            )
        g_explore, g_exploit = updates
        chex.assert_trees_all_equal_shapes_and_dtypes(g_explore, g_exploit)
        alpha = schedule(state.count)
        mixed = jax.tree.map(
            lambda a, b: (alpha * a + (1.0 - alpha) * b).astype(a.dtype), g_explore, g_exploit
        )
        return mixed, AnnealGradientsState(count=optax.safe_increment(state.count))

    return optax.GradientTransformation(init_fn, update_fn)
