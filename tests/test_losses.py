"""Tests for aepg_jax.losses: formulas, the paper's identities, stability, the registry."""

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from absl.testing import parameterized

from aepg_jax import losses

K = 7
ALL_LOSSES = sorted(losses.LOSSES)


def _batch(seed=0, n=16, k=K, scale=3.0):
    rng = np.random.default_rng(seed)
    logits = jnp.asarray(scale * rng.standard_normal((n, k)), jnp.float32)
    labels = jnp.asarray(rng.integers(0, k, n), jnp.int32)
    return logits, labels


def _call(name, logits, labels, alpha=0.3, **hyper):
    fn = losses.get_loss(name, **hyper)
    return fn(logits, labels, alpha=alpha) if losses.is_annealed(name) else fn(logits, labels)


def _reference(name, logits, labels, alpha=0.3):
    """Direct NumPy float64 formulas of docs/algorithm.md §1, independent of the implementation."""
    z = np.asarray(logits, np.float64)
    z = z - z.max(-1, keepdims=True)
    p = np.exp(z) / np.exp(z).sum(-1, keepdims=True)
    y = np.asarray(labels)
    p_y = np.take_along_axis(p, y[..., None], -1)[..., 0]
    ce = -np.log(p_y)
    h = -(p * np.log(p)).sum(-1)
    k = z.shape[-1]
    kl_u = (1.0 / k * (np.log(1.0 / k) - np.log(p))).sum(-1)
    return {
        "ce": ce,
        "epg": -p_y,
        "aepg": alpha * ce + (1 - alpha) * (-p_y),
        "focal": (1 - p_y) ** 1.0 * ce,
        "label_smoothing": 0.95 * ce + 0.05 * kl_u,
        "confidence_penalty": ce - 0.1 * h,
        "entropy_penalty": ce + 1.0 * h,
        "mix": 0.5 * ce + 0.5 * (-p_y),
    }[name]


class LossValuesTest(chex.TestCase):
    @chex.variants(with_jit=True, without_jit=True)
    @parameterized.parameters(*ALL_LOSSES)
    def test_matches_float64_reference(self, name):
        logits, labels = _batch()
        fn = self.variant(lambda z, y: _call(name, z, y))
        out = fn(logits, labels)
        chex.assert_shape(out, labels.shape)
        chex.assert_type(out, jnp.float32)
        np.testing.assert_allclose(out, _reference(name, logits, labels), rtol=1e-5, atol=1e-6)

    @chex.variants(with_jit=True, without_jit=True)
    @parameterized.parameters(*ALL_LOSSES)
    def test_leading_batch_dims_and_vmap(self, name):
        logits, labels = _batch(n=12)
        fn = self.variant(lambda z, y: _call(name, z, y))
        flat = fn(logits, labels)
        nested = fn(logits.reshape(3, 4, K), labels.reshape(3, 4))
        chex.assert_shape(nested, (3, 4))
        np.testing.assert_allclose(nested.reshape(-1), flat, rtol=1e-6)
        per_row = jax.vmap(lambda z, y: _call(name, z, y))(logits, labels)
        np.testing.assert_allclose(per_row, flat, rtol=1e-6)

    @chex.variants(with_jit=True, without_jit=True)
    def test_entropy_metric(self):
        logits, _ = _batch()
        h = self.variant(losses.entropy)(logits)
        chex.assert_shape(h, (16,))
        z = np.asarray(logits, np.float64)
        p = np.exp(z - z.max(-1, keepdims=True))
        p /= p.sum(-1, keepdims=True)
        np.testing.assert_allclose(h, -(p * np.log(p)).sum(-1), rtol=1e-5)
        uniform = self.variant(losses.entropy)(jnp.zeros((3, K)))
        np.testing.assert_allclose(uniform, np.log(K) * np.ones(3), rtol=1e-6)
        self.assertTrue(np.all(np.asarray(h) >= 0) and np.all(np.asarray(h) <= np.log(K) + 1e-6))

    def test_mean_entropy_masks_padding(self):
        logits, _ = _batch(n=6)
        where = jnp.array([True, True, True, False, False, False])
        padded = logits.at[3:].set(jnp.zeros((3, K)))  # padding rows must not count
        np.testing.assert_allclose(
            losses.mean_entropy(padded, where), losses.entropy(logits[:3]).mean(), rtol=1e-6
        )
        np.testing.assert_allclose(
            losses.mean_entropy(logits), losses.entropy(logits).mean(), rtol=1e-6
        )

    @chex.variants(with_jit=True, without_jit=True)
    def test_lwf_distillation(self):
        new, _ = _batch(seed=1)
        old, _ = _batch(seed=2)
        temperature = 2.0
        out = self.variant(lambda a, b: losses.lwf_distillation(a, b, temperature))(new, old)
        chex.assert_shape(out, (16,))
        q = np.asarray(jax.nn.softmax(old / temperature), np.float64)
        p = np.asarray(jax.nn.softmax(new / temperature), np.float64)
        expected = temperature**2 * (q * (np.log(q) - np.log(p))).sum(-1)
        np.testing.assert_allclose(out, expected, rtol=1e-4)
        np.testing.assert_allclose(losses.lwf_distillation(old, old), 0.0, atol=1e-6)
        # The old model's logits are a fixed target: no gradient flows into them.
        g_old = jax.grad(lambda b: losses.lwf_distillation(new, b).sum())(old)
        np.testing.assert_array_equal(g_old, 0.0)

    def test_lwf_rejects_mismatched_shapes(self):
        with pytest.raises(AssertionError):
            losses.lwf_distillation(jnp.zeros((4, 3)), jnp.zeros((4, 5)))


class PaperIdentitiesTest(chex.TestCase):
    @chex.variants(with_jit=True, without_jit=True)
    def test_eq8_logit_gradients(self):
        """Per example: grad CE = grad EPG / p_y w.r.t. the logits (same direction)."""
        logits, labels = _batch(scale=2.0)

        def per_example_grad(fn):
            return jax.vmap(jax.grad(fn))(logits, labels)

        g_ce = self.variant(lambda: per_example_grad(losses.cross_entropy))()
        g_epg = self.variant(lambda: per_example_grad(losses.epg))()
        p_y = jnp.take_along_axis(jax.nn.softmax(logits), labels[:, None], -1)
        chex.assert_shape((g_ce, g_epg), logits.shape)
        np.testing.assert_allclose(g_ce, g_epg / p_y, rtol=1e-4, atol=1e-6)
        cosine = jnp.sum(g_ce * g_epg, -1) / (
            jnp.linalg.norm(g_ce, axis=-1) * jnp.linalg.norm(g_epg, axis=-1)
        )
        np.testing.assert_allclose(cosine, 1.0, rtol=1e-5)

    @chex.variants(with_jit=True, without_jit=True)
    def test_eq8_parameter_gradients_of_linear_model(self):
        """The identity holds w.r.t. the parameters of a model, example by example."""
        rng = np.random.default_rng(3)
        x = jnp.asarray(rng.standard_normal((10, 5)), jnp.float32)
        y = jnp.asarray(rng.integers(0, K, 10), jnp.int32)
        params = {
            "w": jnp.asarray(rng.standard_normal((5, K)), jnp.float32),
            "b": jnp.asarray(rng.standard_normal(K), jnp.float32),
        }

        def model_loss(loss_fn):
            return lambda prm, xi, yi: loss_fn(xi @ prm["w"] + prm["b"], yi)

        grads = self.variant(
            lambda prm: [
                jax.vmap(jax.grad(model_loss(fn)), in_axes=(None, 0, 0))(prm, x, y)
                for fn in (losses.cross_entropy, losses.epg)
            ]
        )
        g_ce, g_epg = grads(params)
        p_y = jnp.take_along_axis(jax.nn.softmax(x @ params["w"] + params["b"]), y[:, None], -1)
        chex.assert_shape(g_ce["w"], (10, 5, K))
        np.testing.assert_allclose(g_ce["w"], g_epg["w"] / p_y[:, :, None], rtol=1e-4, atol=1e-5)
        np.testing.assert_allclose(g_ce["b"], g_epg["b"] / p_y, rtol=1e-4, atol=1e-5)

    @chex.variants(with_jit=True, without_jit=True)
    @parameterized.parameters(0.0, 0.25, 0.6, 1.0)
    def test_aepg_mixes_ce_and_epg(self, alpha):
        logits, labels = _batch(seed=4)
        value = self.variant(lambda z: losses.aepg(z, labels, alpha))(logits)
        ce, e = losses.cross_entropy(logits, labels), losses.epg(logits, labels)
        np.testing.assert_allclose(value, alpha * ce + (1 - alpha) * e, rtol=1e-5, atol=1e-6)
        if alpha == 1.0:
            np.testing.assert_array_equal(value, ce)
        if alpha == 0.0:
            np.testing.assert_array_equal(value, e)

        def grad_of(fn):
            return jax.grad(lambda z: fn(z).sum())(logits)

        g_mix = self.variant(lambda: grad_of(lambda z: losses.aepg(z, labels, alpha)))()
        g_ce = grad_of(lambda z: losses.cross_entropy(z, labels))
        g_epg = grad_of(lambda z: losses.epg(z, labels))
        np.testing.assert_allclose(g_mix, alpha * g_ce + (1 - alpha) * g_epg, rtol=1e-5, atol=1e-6)

    def test_aepg_traced_alpha_compiles_once(self):
        logits, labels = _batch()
        traces = []

        @jax.jit
        def f(alpha):
            traces.append(None)
            return losses.aepg(logits, labels, alpha).mean()

        values = [float(f(jnp.float32(a))) for a in (1.0, 0.5, 0.0)]
        self.assertLen(traces, 1)
        self.assertGreater(values[0], values[1])
        self.assertGreater(values[1], values[2])

    @parameterized.parameters(0.05, 0.5)
    def test_entropy_ordering_after_one_step(self, init_scale):
        """One SGD step: entropy_penalty lowers H most, then CE, then confidence_penalty.

        Labels come from a noisy linear teacher; init_scale 0.05 starts near the uniform
        prediction (every loss lowers H), 0.5 from confident random predictions (CE raises H,
        as the paper's exploration argument says; the ordering still holds).
        """
        rng = np.random.default_rng(5)
        x = jnp.asarray(rng.standard_normal((64, 8)), jnp.float32)
        teacher = rng.standard_normal((8, K))
        noisy_scores = np.asarray(x) @ teacher + 0.5 * rng.standard_normal((64, K))
        y = jnp.asarray(np.argmax(noisy_scores, -1), jnp.int32)
        w0 = jnp.asarray(init_scale * rng.standard_normal((8, K)), jnp.float32)
        h0 = float(losses.entropy(x @ w0).mean())

        def entropy_after_step(name):
            loss_fn = losses.get_loss(name)
            g = jax.grad(lambda w: loss_fn(x @ w, y).mean())(w0)
            return float(losses.entropy(x @ (w0 - 0.5 * g)).mean())

        h_ep = entropy_after_step("entropy_penalty")
        h_ce = entropy_after_step("ce")
        h_cp = entropy_after_step("confidence_penalty")
        self.assertLess(h_ep, h_ce)
        self.assertLess(h_ce, h_cp)
        if init_scale == 0.05:
            self.assertLess(h_cp, h0)

    @parameterized.parameters((5, 0.0), (5, 0.3), (5, 0.79), (10, 0.5), (2, 0.4))
    def test_proposition2_noisy_epg_is_affine_in_clean(self, k, eta):
        """Symmetric noise eta < 1 - 1/K: J_eta = (1 - K eta/(K-1)) J + eta/(K-1), slope > 0.

        J(theta) = E[p_y] (= -mean EPG). J_eta is the exact expectation over the noisy label:
        the observed label is y with prob. 1 - eta, each other class with eta / (K - 1).
        Checked over many random "models" (logit tables): ranking by J_eta equals ranking by J.
        """
        rng = np.random.default_rng(6)
        n_models, n = 50, 32
        logits = jnp.asarray(3 * rng.standard_normal((n_models, n, k)), jnp.float32)
        y = jnp.asarray(rng.integers(0, k, n), jnp.int32)
        noise = np.full((n, k), eta / (k - 1))
        noise[np.arange(n), np.asarray(y)] = 1 - eta

        def clean_objective(z):
            return -losses.epg(z, y).mean()

        def noisy_objective(z):
            per_label = jnp.stack(
                [-losses.epg(z, jnp.full((n,), c, jnp.int32)) for c in range(k)], -1
            )
            return jnp.mean(jnp.sum(jnp.asarray(noise, jnp.float32) * per_label, -1))

        j = jax.vmap(clean_objective)(logits)
        j_eta = jax.vmap(noisy_objective)(logits)
        slope = 1 - k * eta / (k - 1)
        self.assertGreater(slope, 0)
        np.testing.assert_allclose(j_eta, slope * j + eta / (k - 1), rtol=1e-5, atol=1e-6)
        np.testing.assert_array_equal(np.argsort(j_eta), np.argsort(j))
        self.assertEqual(int(np.argmax(j_eta)), int(np.argmax(j)))

    def test_proposition2_bound_is_tight(self):
        """Above the bound (eta > 1 - 1/K) the slope is negative: the ranking reverses."""
        k, eta = 4, 0.9
        rng = np.random.default_rng(7)
        logits = jnp.asarray(3 * rng.standard_normal((20, 16, k)), jnp.float32)
        y = jnp.asarray(rng.integers(0, k, 16), jnp.int32)
        j = jax.vmap(lambda z: -losses.epg(z, y).mean())(logits)
        j_other = jax.vmap(
            lambda z: jnp.mean(
                jnp.stack([-losses.epg(z, (y + s) % k) for s in range(1, k)]).mean(0)
            )
        )(logits)
        j_eta = (1 - eta) * j + eta * j_other
        self.assertLess(1 - k * eta / (k - 1), 0)
        self.assertEqual(int(np.argmax(j_eta)), int(np.argmin(j)))


class StabilityTest(chex.TestCase):
    @chex.variants(with_jit=True, without_jit=True)
    @parameterized.product(name=[*ALL_LOSSES, "lwf", "entropy"], dtype=[jnp.float32, jnp.bfloat16])
    def test_finite_for_huge_and_confident_logits(self, name, dtype):
        huge = jnp.array(
            [[1e4, -1e4, 0.0], [-1e4, 1e4, 1e4], [1e4, 1e4, 1e4], [-1e4, -1e4, -1e4]], dtype
        )
        confident = jnp.array([[100.0, -100.0, -100.0], [0.0, 200.0, -200.0]], dtype)

        def total(z, y):
            if name == "lwf":
                return losses.lwf_distillation(z, jnp.flip(z, -1)).sum()
            if name == "entropy":
                return losses.entropy(z).sum()
            return _call(name, z, y).sum()

        value_and_grad = self.variant(jax.value_and_grad(total))
        for logits in (huge, confident):
            n = logits.shape[0]
            for labels in (jnp.zeros(n, jnp.int32), jnp.full((n,), 2, jnp.int32)):
                value, grad = value_and_grad(logits, labels)
                chex.assert_tree_all_finite((value, grad))
                chex.assert_type(grad, dtype)
                chex.assert_type(value, jnp.float32)

    @parameterized.parameters(0.25, 0.5, 1.0, 2.0)
    def test_focal_gradient_finite_at_certainty(self, gamma):
        # p_y == 1 in float32: (1 - p_y)^(gamma - 1) would be inf for gamma < 1.
        logits = jnp.array([[60.0, -60.0, -60.0]])
        grad = jax.grad(lambda z: losses.focal(z, jnp.array([0]), gamma).sum())(logits)
        chex.assert_tree_all_finite(grad)
        np.testing.assert_allclose(grad, 0.0, atol=1e-20)

    def test_confident_wrong_prediction_has_large_ce_and_small_epg_gradient(self):
        logits = jnp.array([[30.0, 0.0, 0.0]])
        y = jnp.array([1])
        g_ce = jax.grad(lambda z: losses.cross_entropy(z, y).sum())(logits)
        g_epg = jax.grad(lambda z: losses.epg(z, y).sum())(logits)
        np.testing.assert_allclose(losses.cross_entropy(logits, y), 30.0, rtol=1e-5)
        self.assertGreater(float(jnp.abs(g_ce).max()), 0.9)
        self.assertLess(float(jnp.abs(g_epg).max()), 1e-12)


class RegistryTest(parameterized.TestCase):
    def test_every_spec_name_is_registered(self):
        expected = {
            "ce",
            "epg",
            "aepg",
            "focal",
            "label_smoothing",
            "confidence_penalty",
            "entropy_penalty",
            "mix",
        }
        self.assertEqual(set(losses.LOSSES), expected)

    def test_defaults_follow_spec(self):
        self.assertEqual(losses.loss_hyperparameters("focal"), {"gamma": 1.0})
        self.assertEqual(losses.loss_hyperparameters("label_smoothing"), {"smoothing": 0.05})
        self.assertEqual(losses.loss_hyperparameters("confidence_penalty"), {"beta": 0.1})
        self.assertEqual(losses.loss_hyperparameters("entropy_penalty"), {"beta": 1.0})
        self.assertTrue(losses.is_annealed("aepg"))
        self.assertFalse(losses.is_annealed("mix"))

    def test_hyperparameters_are_bound(self):
        logits, labels = _batch()
        np.testing.assert_allclose(
            losses.get_loss("focal", gamma=2.0)(logits, labels),
            losses.focal(logits, labels, 2.0),
        )
        np.testing.assert_allclose(
            losses.get_loss("mix", alpha=0.2)(logits, labels),
            losses.aepg(logits, labels, 0.2),
        )

    def test_unknown_name_lists_valid_names(self):
        with pytest.raises(ValueError, match=r"Unknown loss 'cross_entropy'.*aepg.*focal"):
            losses.get_loss("cross_entropy")

    def test_unknown_hyperparameter_lists_valid_ones(self):
        with pytest.raises(ValueError, match=r"unknown hyperparameter\(s\) beta; valid: gamma"):
            losses.get_loss("focal", beta=1.0)
        with pytest.raises(ValueError, match=r"valid: none.*schedule"):
            losses.get_loss("aepg", tau=6.0)

    @parameterized.parameters(
        ("mix", {"alpha": 1.5}),
        ("label_smoothing", {"smoothing": -0.1}),
        ("focal", {"gamma": -1.0}),
        ("entropy_penalty", {"beta": "1"}),
    )
    def test_out_of_range_values_are_rejected(self, name, hyper):
        with pytest.raises(ValueError, match=r"is invalid; expected a number"):
            losses.get_loss(name, **hyper)

    def test_float_labels_are_rejected(self):
        with pytest.raises(AssertionError):
            losses.cross_entropy(jnp.zeros((2, 3)), jnp.zeros(2, jnp.float32))
