"""Tests for aepg_jax.schedules: the paper's Table 8, monotonicity, per-task restarts."""

import chex
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from absl.testing import parameterized

from aepg_jax import schedules


class SigmoidAnnealTest(chex.TestCase):
    @parameterized.parameters((4.0, 0.9820, 0.0180), (6.0, 0.9975, 0.0025), (8.0, 0.9997, 0.0003))
    def test_paper_table8_endpoints(self, tau, alpha_start, alpha_end):
        schedule = schedules.sigmoid_anneal(1000, tau=tau)
        self.assertEqual(round(float(schedule(0)), 4), alpha_start)
        self.assertEqual(round(float(schedule(1000)), 4), alpha_end)
        self.assertAlmostEqual(float(schedule(500)), 0.5, places=6)  # midpoint t = T/2

    @chex.variants(with_jit=True, without_jit=True)
    def test_formula(self):
        total, tau = 37, 6.0
        t = jnp.arange(total + 1)
        alpha = self.variant(schedules.sigmoid_anneal(total, tau))(t)
        chex.assert_shape(alpha, (total + 1,))
        expected = 1 / (1 + np.exp(-tau * (total - 2 * np.arange(total + 1)) / total))
        np.testing.assert_allclose(alpha, expected, rtol=1e-6)

    def test_default_tau_is_six(self):
        self.assertEqual(float(schedules.sigmoid_anneal(10)(0)), float(jax.nn.sigmoid(6.0)))


class AllSchedulesTest(chex.TestCase):
    @chex.variants(with_jit=True, without_jit=True)
    @parameterized.parameters("sigmoid", "linear", "cosine")
    def test_monotone_from_one_to_zero(self, name):
        total = 50
        alpha = np.asarray(self.variant(schedules.get_schedule(name, total))(jnp.arange(total + 1)))
        self.assertTrue(np.all(np.diff(alpha) < 0), f"{name} is not strictly decreasing")
        self.assertTrue(np.all((alpha >= 0) & (alpha <= 1)))
        if name != "sigmoid":
            self.assertAlmostEqual(alpha[0], 1.0, places=6)
            self.assertAlmostEqual(alpha[-1], 0.0, places=6)

    @parameterized.parameters("sigmoid", "linear", "cosine")
    def test_clipped_outside_the_task(self, name):
        schedule = schedules.get_schedule(name, 20)
        self.assertEqual(float(schedule(-5)), float(schedule(0)))
        self.assertEqual(float(schedule(25)), float(schedule(20)))

    def test_linear_and_cosine_formulas(self):
        t = np.arange(11)
        np.testing.assert_allclose(schedules.linear_anneal(10)(t), (10 - t) / 10, atol=1e-7)
        np.testing.assert_allclose(
            schedules.cosine_anneal(10)(t), 0.5 + 0.5 * np.cos(np.pi * t / 10), atol=1e-7
        )

    def test_constant(self):
        schedule = schedules.get_schedule("constant", 10, alpha=0.2)
        np.testing.assert_allclose(schedule(jnp.arange(5)), 0.2)
        self.assertEqual(jnp.shape(schedule(3)), ())
        with pytest.raises(ValueError, match=r"alpha must be in \[0, 1\]"):
            schedules.constant(1.2)

    def test_get_schedule_errors(self):
        with pytest.raises(ValueError, match=r"Unknown alpha schedule 'exp'\. Valid: sigmoid"):
            schedules.get_schedule("exp", 10)
        with pytest.raises(ValueError, match=r"unknown hyperparameter\(s\) tau; valid: none"):
            schedules.get_schedule("linear", 10, tau=6.0)
        with pytest.raises(ValueError, match="total_steps must be positive"):
            schedules.get_schedule("sigmoid", 0)
        with pytest.raises(TypeError, match="total_steps must be an int"):
            schedules.sigmoid_anneal(10.5)
        with pytest.raises(ValueError, match="tau must be positive"):
            schedules.sigmoid_anneal(10, tau=0.0)


class PerTaskTest(chex.TestCase):
    @chex.variants(with_jit=True, without_jit=True)
    def test_restarts_at_every_task(self):
        steps = [30, 10, 20]
        joined = self.variant(schedules.per_task(schedules.sigmoid_anneal, steps))
        alpha = np.asarray(joined(jnp.arange(sum(steps))))
        start = 0
        for total in steps:
            own = np.asarray(schedules.sigmoid_anneal(total)(jnp.arange(total)))
            np.testing.assert_allclose(alpha[start : start + total], own, rtol=1e-6)
            self.assertAlmostEqual(alpha[start], float(jax.nn.sigmoid(6.0)), places=6)
            self.assertTrue(np.all(np.diff(alpha[start : start + total]) < 0))
            start += total
        # A restart is a jump back up at each boundary.
        self.assertGreater(alpha[30], alpha[29])
        self.assertGreater(alpha[40], alpha[39])

    def test_is_an_optax_schedule_for_the_learning_rate_too(self):
        # Joined schedules plug into any optax optimizer argument that takes a schedule.
        sched = schedules.per_task(schedules.linear_anneal, [4, 4])
        opt = optax.sgd(learning_rate=sched)
        params = jnp.zeros(())
        state = opt.init(params)
        lrs = []
        for _ in range(8):
            updates, state = opt.update(jnp.ones(()), state, params)
            lrs.append(-float(updates))
        np.testing.assert_allclose(lrs, [1, 0.75, 0.5, 0.25] * 2, rtol=1e-6)

    def test_empty_task_list(self):
        with pytest.raises(ValueError, match="at least one task"):
            schedules.per_task(schedules.linear_anneal, [])
