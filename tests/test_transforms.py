"""Tests for aepg_jax.transforms.anneal_gradients (gradient-level Eq. 10)."""

import chex
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from aepg_jax import losses, schedules, transforms


def _problem(seed=0):
    rng = np.random.default_rng(seed)
    x = jnp.asarray(rng.standard_normal((32, 6)), jnp.float32)
    y = jnp.asarray(rng.integers(0, 5, 32), jnp.int32)
    params = {
        "w": jnp.asarray(0.3 * rng.standard_normal((6, 5)), jnp.float32),
        "b": jnp.zeros(5, jnp.float32),
    }
    return x, y, params


def _mean_loss(fn, x, y):
    return lambda p, *args: fn(x @ p["w"] + p["b"], y, *args).mean()


class AnnealGradientsTest(chex.TestCase):
    @chex.variants(with_jit=True, without_jit=True)
    def test_mixes_the_pair_with_the_schedule(self):
        schedule = schedules.sigmoid_anneal(4)
        tx = transforms.anneal_gradients(schedule)
        g1 = {"a": jnp.ones(3), "b": 2 * jnp.ones((2, 2))}
        g2 = {"a": -jnp.ones(3), "b": jnp.zeros((2, 2))}
        state = tx.init(g1)
        update = self.variant(tx.update)
        for t in range(6):
            out, state = update((g1, g2), state)
            alpha = float(schedule(t))
            np.testing.assert_allclose(out["a"], alpha - (1 - alpha), rtol=1e-6)
            np.testing.assert_allclose(out["b"], 2 * alpha, rtol=1e-6)
        self.assertEqual(int(state.count), 6)

    def test_same_update_as_loss_level_mix(self):
        """chain(anneal_gradients, adam) on (g_CE, g_EPG) == adam on grad(aepg) with alpha_t."""
        x, y, params = _problem()
        total = 12
        schedule = schedules.sigmoid_anneal(total)
        ce, epg = _mean_loss(losses.cross_entropy, x, y), _mean_loss(losses.epg, x, y)
        aepg = _mean_loss(losses.aepg, x, y)

        grad_level = optax.chain(transforms.anneal_gradients(schedule), optax.adam(5e-2))
        loss_level = optax.adam(5e-2)

        @jax.jit
        def step_gradient_level(p, state):
            grads = (jax.grad(ce)(p), jax.grad(epg)(p))
            updates, state = grad_level.update(grads, state, p)
            return optax.apply_updates(p, updates), state

        @jax.jit
        def step_loss_level(p, state, t):
            grads = jax.grad(aepg)(p, schedule(t))
            updates, state = loss_level.update(grads, state, p)
            return optax.apply_updates(p, updates), state

        p_a, s_a = params, grad_level.init(params)
        p_b, s_b = params, loss_level.init(params)
        for t in range(total):
            p_a, s_a = step_gradient_level(p_a, s_a)
            p_b, s_b = step_loss_level(p_b, s_b, t)
        chex.assert_trees_all_close(p_a, p_b, rtol=1e-5, atol=1e-6)
        # The parameters really moved, so the comparison is not vacuous.
        self.assertGreater(float(jnp.abs(p_a["w"] - params["w"]).max()), 0.1)

    def test_rejects_a_single_gradient_tree(self):
        tx = transforms.anneal_gradients(schedules.constant(0.5))
        g = {"a": jnp.ones(3)}
        with pytest.raises(TypeError, match=r"expects updates=\(g_explore, g_exploit\)"):
            tx.update(g, tx.init(g))

    def test_rejects_mismatched_trees(self):
        tx = transforms.anneal_gradients(schedules.constant(0.5))
        with pytest.raises(AssertionError):
            tx.update(({"a": jnp.ones(3)}, {"a": jnp.ones(4)}), tx.init(None))
