"""RanPAC (methods/ranpac.py): the ridge machinery against a numpy reference, the first-session
adaptation (task 0 only), end-to-end runs and resume. The official-code comparison is
tests/test_official_ranpac.py."""

import pathlib
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from resume import assert_resumes_after_a_crash_in_end_task
from tiny import tiny_config

from aepg_jax.continual import trainer
from aepg_jax.methods import ranpac
from aepg_jax.methods.base import peft_of
from aepg_jax.models import head

REPO = pathlib.Path(__file__).resolve().parents[1]


def _numpy_reference(h, y, num_classes, n_fit):
    """RanPAC.py L116-150 in float64 numpy: lambda by the held-out MSE, then the readout."""
    onehot = np.eye(num_classes)[y]
    g_fit, q_fit = h[:n_fit].T @ h[:n_fit], h[:n_fit].T @ onehot[:n_fit]
    losses = []
    for lam in ranpac.RIDGES:
        w = np.linalg.solve(g_fit + lam * np.eye(len(g_fit)), q_fit).T
        losses.append(np.mean((h[n_fit:] @ w.T - onehot[n_fit:]) ** 2))
    lam = ranpac.RIDGES[int(np.argmin(losses))]
    return lam, np.linalg.solve(h.T @ h + lam * np.eye(h.shape[1]), h.T @ onehot).T


def _method(m):
    cfg = tiny_config(
        pathlib.Path("/nonexistent"), **{"method.name": "ranpac", "method.ranpac_m": m}
    )
    return ranpac.RanPAC(cfg)


# M = 24 < 40 fit rows: the primal search and the device solve (the dual ones: the test below,
# and tests/test_official_ranpac.py's M = 128 over 48 rows a task).
@pytest.mark.parametrize("m", [pytest.param(0, marks=pytest.mark.slow), 24])
def test_update_equals_the_official_formulas_for_any_chunking(m):
    rng = np.random.default_rng(0)
    num_classes, n, width = 4, 50, 8
    centers = rng.normal(0, 1, (num_classes, width))
    y = rng.integers(0, 3, n).astype(np.int32)  # class 3 unseen
    feats = (centers[y] + rng.normal(0, 1.5, (n, width))).astype(np.float32)
    method = _method(m)
    method.width, method.dim = width, (m or width)
    state = method.initial_state(num_classes)
    if m:
        state["w_rand"] = ranpac.draw_projection(jax.random.key(1), width, m)
    out = [method.update(state, feats, y, chunk) for chunk in (7, 64)]
    h = np.asarray(ranpac.project(jnp.asarray(feats), state.get("w_rand")), np.float64)
    lam, readout = _numpy_reference(h, y, num_classes, int(0.8 * n))
    for o in out:
        assert float(o["ridge"]) == lam
        np.testing.assert_allclose(o["gram"], h.T @ h, rtol=1e-5, atol=1e-4)
        np.testing.assert_allclose(o["readout"], readout, atol=2e-4 * np.abs(readout).max())
        np.testing.assert_array_equal(o["sums"].counts, np.bincount(y, minlength=num_classes))
    # Another task adds to G and Q: two tasks equal one of their concatenation.
    second = method.update(out[0], feats[::-1], y[::-1], 7)
    np.testing.assert_allclose(second["gram"], 2 * h.T @ h, rtol=1e-5, atol=1e-4)


@pytest.mark.parametrize("n, m", [(30, 200), (60, 20)])  # dual (24 fit rows < M), primal
def test_ridge_search_and_dual_readout_equal_float64_solves(n, m):
    """The 17 candidates' errors from one eigendecomposition equal those of 17 float64 linear
    solves of `G_fit + lam I` (also at M >> N, where G_fit has rank 24), and the dual readout
    equals the primal solve."""
    rng = np.random.default_rng(1)
    num_classes, width = 5, 6
    y = rng.integers(0, 4, n).astype(np.int32)
    feats = (rng.normal(0, 1, (num_classes, width))[y] + rng.normal(0, 1, (n, width))).astype(
        np.float32
    )
    w_rand = rng.normal(0, 1, (width, m)).astype(np.float32)
    h, onehot = ranpac.project_rows(feats, w_rand), np.eye(num_classes)[y]
    n_fit = int(0.8 * n)
    g, q = h[:n_fit].T @ h[:n_fit], h[:n_fit].T @ onehot[:n_fit]
    expected = []
    for lam in ranpac.RIDGES:
        pred = h[n_fit:] @ np.linalg.solve(g + lam * np.eye(m), q)
        expected.append(np.sum((pred - onehot[n_fit:]) ** 2))
    fit, val = (feats[:n_fit], y[:n_fit]), (feats[n_fit:], y[n_fit:])
    errors = ranpac.ridge_errors(fit, val, w_rand, num_classes, chunk=7)
    # 1e-5: float64 LU itself is off by ~2e-6 at lam = 1e-8 on the rank-24 G_fit (M = 200).
    np.testing.assert_allclose(errors, expected, rtol=1e-5)
    assert ranpac.choose_ridge(errors) == ranpac.choose_ridge(np.asarray(expected))
    if n < m:
        primal = np.linalg.solve(h.T @ h + 1e-3 * np.eye(m), h.T @ onehot).T
        dual = ranpac.dual_readout(feats, y, w_rand, num_classes, 1e-3)
        np.testing.assert_allclose(dual, primal, rtol=0, atol=1e-6 * np.abs(primal).max())


def test_first_session_logits_are_a_scaled_cosine_and_the_check_names_the_field():
    f = jnp.asarray([[3.0, 4.0]])
    w = jnp.asarray([[1.0, 0.0], [0.0, 2.0]]).T
    np.testing.assert_allclose(2.0 * head.cosine_logits(f, w.T), [[1.2, 1.6]], rtol=1e-6)
    cfg = tiny_config(
        pathlib.Path("/nonexistent"), **{"method.name": "ranpac", "method.ranpac_m": -1}
    )
    assert "method.ranpac_m" in ranpac.RanPAC.check(cfg)[0]
    assert not ranpac.RanPAC(cfg).trains_task(1) and ranpac.RanPAC(cfg).trains_task(0)


def _config(tmp_path, **overrides):
    base = {"method.name": "ranpac", "method.ranpac_m": 48, "data.num_tasks": 2}
    return tiny_config(tmp_path / "cache", **{**base, **overrides})


def _record_end_states(monkeypatch):
    seen = []
    end_task = ranpac.RanPAC.end_task

    def recorded(self, task, trainable, state, ctx):
        out = end_task(self, task, trainable, state, ctx)
        seen.append((task.index, jax.tree.map(np.asarray, peft_of(trainable)), out))
        return out

    monkeypatch.setattr(ranpac.RanPAC, "end_task", recorded)
    return seen


@pytest.mark.slow
@pytest.mark.parametrize("loss", ["aepg", "ce"])
def test_runs_end_to_end_adapting_on_task_0_only(tmp_path, monkeypatch, loss):
    seen = _record_end_states(monkeypatch)
    results = trainer.run(_config(tmp_path, **{"loss.name": loss}), str(tmp_path / "run"))
    assert np.isfinite(results["A_T"]) and len(results["accuracy_matrix"]) == 2
    (_, peft0, s0), (_, peft1, s1) = seen
    # Task 1 trains nothing: the PEFT is the one task 0 adapted; W is drawn once.
    jax.tree.map(np.testing.assert_array_equal, peft0, peft1)
    np.testing.assert_array_equal(s0["w_rand"], s1["w_rand"])
    assert np.any(s0["w_rand"]) and np.all(np.asarray(s1["sums"].counts) > 0)


@pytest.mark.slow  # three runs
def test_interrupted_statistics_pass_resumes_to_the_same_results(tmp_path, monkeypatch):
    cfg = _config(tmp_path, max_steps_per_task=3)
    straight = trainer.run(cfg, str(tmp_path / "straight"))
    assert_resumes_after_a_crash_in_end_task(
        ranpac.RanPAC, cfg, tmp_path / "killed", straight, monkeypatch
    )


@pytest.mark.slow
def test_domain_scenario_runs(tmp_path):
    domain = {"data.source": "digits_domains", "data.scenario": "domain", "data.num_tasks": 4}
    cfg = _config(tmp_path, **domain, max_steps_per_task=3)
    results = trainer.run(cfg, str(tmp_path / "run"))
    assert np.isfinite(results["A_T"]) and len(results["accuracy_matrix"]) == 4


# Checks `num_seeds=4`, `method.ranpac_m=10000` from the default config with 3 GiB free on
# argv[1] host devices; prints the one line it is refused with ("" when accepted).
SEEDS_ON_DEVICES = """
import os, sys
os.environ["XLA_FLAGS"] = f"--xla_force_host_platform_device_count={sys.argv[1]}"
os.environ["AEPG_FIT_CHECK"] = "1"
sys.path.insert(0, "configs")
import default, jax
from aepg_jax.continual import fit
fit.available = lambda: (3 * 2**30, "host memory available to this process")
cfg = default.get_config()
cfg.method.name, cfg.method.ranpac_m, cfg.num_seeds = "ranpac", 10000, 4
try:
    fit.check_config(cfg, jax.device_count())
    print("")
except fit.DoesNotFit as err:
    print(err)
"""


def test_the_gram_memory_counts_every_seed_on_every_device():
    """The method state's seed axis is replicated: 4 devices hold 4 seeds each, as 1 does."""
    said = []
    for devices in ("1", "4"):
        done = subprocess.run(
            [sys.executable, "-c", SEEDS_ON_DEVICES, devices],
            cwd=REPO, capture_output=True, text=True, timeout=300,
        )  # fmt: skip
        assert done.returncode == 0, done.stderr[-2000:]
        said.append(done.stdout.strip())
    one, four = said
    assert one.startswith("method.ranpac_m=10000 needs") and "\n" not in one, said
    assert "4 seed(s) held" in one and "16 seed(s) held" in four
    assert four.startswith("method.ranpac_m=10000 needs") and "\n" not in four, said


def test_the_gram_memory_advice_is_accepted_and_counts_the_runs_own():
    cfg = tiny_config(pathlib.Path("/nonexistent"), **{"method.name": "ranpac"})
    cfg.method.ranpac_m = 10000
    left = 2 * 2**30
    (line,) = ranpac.RanPAC.memory_problems(cfg, left, "host memory", 1)
    fits = int(line.split("set method.ranpac_m <= ")[1].split()[0])
    assert fits == 8000 and "7 x M^2 float32" in line
    cfg.method.ranpac_m = fits
    assert ranpac.RanPAC.memory_problems(cfg, left, "host memory", 1) == []
    cfg.method.ranpac_m = fits + 1000
    assert ranpac.RanPAC.memory_problems(cfg, left, "host memory", 1)
    cfg.method.ranpac_m = 100
    (line,) = ranpac.RanPAC.memory_problems(cfg, 100, "host memory", 1)  # not one M
    assert line.endswith("set method.ranpac_m=0 (no projection) (the reference's: 10000).")
