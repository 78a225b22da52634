"""The class-statistics module: Gaussian statistics against numpy's float64 covariance, the
sampler's affine map, and classifier alignment against a hand-written SGD loop."""

import jax
import jax.numpy as jnp
import numpy as np

from aepg_jax.methods import class_gaussians as cg


def test_statistics_match_float64_covariance_over_batches():
    rng = np.random.default_rng(0)
    c, d = 4, 6
    feats = (rng.normal(size=(50, d)) * 3 + 40).astype(np.float32)  # large mean: cancellation
    labels = rng.integers(0, 3, size=50)  # class 3 never seen
    mask = np.ones(50, bool)
    mask[-5:] = False
    stats = cg.ClassGaussians.zeros(c, d)
    for lo in range(0, 50, 16):  # uneven batches, padding rows masked
        sl = slice(lo, lo + 16)
        stats = stats.add(jnp.asarray(feats[sl]), jnp.asarray(labels[sl]), jnp.asarray(mask[sl]))
    covs = np.asarray(stats.covariances(1e-4))
    for k in range(3):
        rows = feats[:45][labels[:45] == k].astype(np.float64)
        np.testing.assert_allclose(np.asarray(stats.means())[k], rows.mean(0), rtol=1e-6)
        ref = np.cov(rows.T) + 1e-4 * np.eye(d)
        np.testing.assert_allclose(covs[k], ref, rtol=2e-4, atol=2e-5)
    np.testing.assert_allclose(covs[3], 1e-4 * np.eye(d))
    assert float(stats.counts.sum()) == 45.0


def test_sample_is_mean_plus_cholesky_times_normal():
    rng = np.random.default_rng(1)
    a = rng.normal(size=(2, 3, 3))
    covs = jnp.asarray(a @ a.transpose(0, 2, 1) + np.eye(3), jnp.float32)
    means = jnp.asarray(rng.normal(size=(2, 3)), jnp.float32)
    key = jax.random.key(0)
    draws = cg.sample(means, covs, 5, key)
    eps = jax.random.normal(key, (2, 5, 3))
    want = np.asarray(means)[:, None] + np.einsum(
        "cde,cne->cnd", np.linalg.cholesky(np.asarray(covs)), np.asarray(eps)
    )
    np.testing.assert_allclose(np.asarray(draws), want, rtol=1e-5, atol=1e-5)
    feats, labs = cg.shuffled_batches(draws, jnp.asarray(1), jax.random.key(1))
    assert feats.shape == (2, 5, 3) and set(np.asarray(labs[0]).tolist()) == {0}


def test_cholesky_factors_one_matrix_per_lapack_call():
    """A batched CPU factorization splits its batch over XLA's intra-op pool and blocks a pool
    thread on it: as many at once as the pool has threads (a replicated program on that many
    devices of one process) deadlock. The sampler's program factors one matrix per call."""
    rng = np.random.default_rng(2)
    a = rng.normal(size=(5, 4, 4))
    covs = jnp.asarray(a @ a.transpose(0, 2, 1) + np.eye(4), jnp.float32)
    factors = cg.cholesky_factors(covs)
    want = np.linalg.cholesky(np.asarray(covs))
    np.testing.assert_allclose(np.asarray(factors), want, rtol=1e-5, atol=1e-6)
    program = jax.jit(cg.sample, static_argnums=2).lower(covs[:, 0], covs, 3, jax.random.key(0))
    calls = [line for line in program.as_text().splitlines() if "potrf" in line]
    assert calls and all('num_batch_dims = "0"' in line for line in calls), calls
    # The path that names a class whose covariance cannot be factored: the same one per call.
    calls = [line for line in cg.factorable.lower(covs).as_text().splitlines() if "potrf" in line]
    assert calls and all('num_batch_dims = "0"' in line for line in calls), calls
    bad = covs.at[3].set(-jnp.eye(4))
    assert np.asarray(cg.factorable(bad)).tolist() == [True, True, True, False, True]


def _reference_align(w, b, feats, labels, steps, seen, lr, mom, wd):
    """Plain loop: torch's SGD with momentum and coupled weight decay, cosine lr per epoch."""
    epochs = feats.shape[0]
    params, buf = (w, b), None
    cols = np.arange(b.shape[0]) < seen

    def loss(p, x, y):
        logits = jnp.where(cols, x @ p[0] + p[1], -1e30)
        return -jnp.mean(jax.nn.log_softmax(logits)[jnp.arange(len(y)), y])

    for e in range(epochs):
        lr_e = lr * 0.5 * (1 + np.cos(np.pi * e / epochs))
        for s in range(steps):
            g = jax.grad(loss)(params, feats[e, s], labels[e, s])
            g = jax.tree.map(lambda gr, p: gr + wd * p, g, params)
            buf = g if buf is None else jax.tree.map(lambda u, gr: mom * u + gr, buf, g)
            new = jax.tree.map(lambda p, u, r=lr_e: p - r * u, params, buf)
            params = (jnp.where(cols, new[0], params[0]), jnp.where(cols, new[1], params[1]))
    return params


def test_align_classifier_is_sgd_with_momentum_over_the_live_steps():
    rng = np.random.default_rng(2)
    d, c = 5, 4
    w = jnp.asarray(rng.normal(size=(d, c)) * 0.1, jnp.float32)
    b = jnp.zeros((c,), jnp.float32)
    feats = jnp.asarray(rng.normal(size=(2, 4, 6, d)), jnp.float32)
    labels = jnp.asarray(rng.integers(0, 3, size=(2, 4, 6)))
    kw = dict(head_sizes=(3, 1), learning_rate=0.1, momentum=0.9, weight_decay=5e-4)
    w2, b2, losses = jax.jit(cg.align_classifier, static_argnames=tuple(kw))(
        w, b, feats, labels, jnp.asarray(3), jnp.asarray(3), jnp.asarray(1), **kw
    )
    rw, rb = _reference_align(w, b, feats, labels, 3, 3, 0.1, 0.9, 5e-4)
    np.testing.assert_allclose(np.asarray(w2), np.asarray(rw), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(np.asarray(b2), np.asarray(rb), rtol=1e-5, atol=1e-6)
    np.testing.assert_array_equal(np.asarray(w2)[:, 3], np.asarray(w)[:, 3])  # unseen column
    assert np.all(np.asarray(losses)[:, 3] == 0) and np.all(np.asarray(losses)[:, :3] > 0)
