"""HiDe-Prompt (docs/algorithm.md §25): its contrastive term, prompt momentum, task inference
and merged statistics against direct formulas; end-to-end runs under both losses, two seeds
vmapped, and resume. The official-code comparison is tests/test_official_hide_prompt.py."""

import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from resume import assert_resumes_after_a_crash_in_end_task
from tiny import tiny_config

from aepg_jax.continual import trainer
from aepg_jax.methods import TaskSpec, task_identity
from aepg_jax.methods import class_gaussians as cg
from aepg_jax.methods import hide_prompt as hp
from aepg_jax.runs import records


def _config(tmp_path, **overrides):
    base = {
        "method.name": "hide_prompt",
        "data.num_tasks": 2,
        "method.hide_prompt_tii_epochs": 2,
        "method.hide_prompt_ca_epochs": 2,
        "method.hide_prompt_tap_batch": 8,
        "method.hide_prompt_tii_ca_batch": 8,
        "optim.peft_freeze_epochs": 0,
    }
    return tiny_config(tmp_path / "cache", **{**base, **overrides})


def test_contrastive_term_equals_the_official_orth_loss():
    """`orth_loss`: M = [learned means; features], CE(M M^T / 0.8, arange) over M's rows."""
    rng = np.random.default_rng(0)
    means, feats = rng.normal(size=(5, 4)), rng.normal(size=(3, 4))
    learned = np.array([True, True, False, False, False])
    m = np.concatenate([means[learned], feats])
    sim = m @ m.T / 0.8
    logp = sim - np.log(np.exp(sim).sum(1, keepdims=True))
    ref = -np.mean(np.diag(logp))
    got = jax.jit(hp.contrastive)(feats, means, learned)
    np.testing.assert_allclose(got, ref, rtol=1e-5)


def test_training_prompt_has_momentum_from_task_1_and_task_maps_from_classes(tmp_path):
    cfg = _config(tmp_path)
    method = hp.HiDePrompt(cfg)
    e = np.random.default_rng(0).normal(size=(2, 2, 4, 3, 5)).astype(np.float32)
    prompt = jax.jit(method.train_prompt)  # one program, the task traced
    np.testing.assert_allclose(prompt(e, 0), e[:, :, 0])
    want = 0.99 * e[:, :, 2] + 0.01 * (e[:, :, 0] + e[:, :, 1]) / 2
    np.testing.assert_allclose(prompt(e, 2), want, rtol=1e-6, atol=1e-6)
    # The TII classifier's most likely seen class names the task: classes 0-1 task 0, 2-4
    # task 1, 5 task 2 (unseen after task 1: never picked).
    d, c = 4, 6
    q = np.random.default_rng(1).normal(size=(64, d)).astype(np.float32)
    task = TaskSpec(1, 2, 3, 0, (2, 3, 1))

    @jax.jit
    def infer(key, q):
        tii = task_identity.init(key, d, 2, c)
        return task_identity.logits(tii, q), hp.HiDePrompt.infer_task(tii, q, task.traced())

    logits, got = infer(jax.random.key(1), q)
    cls = np.argmax(np.where(np.arange(c) < 5, logits, -np.inf), 1)
    np.testing.assert_array_equal(got, np.array([0, 0, 1, 1, 1, 2])[cls])


def test_combined_statistics_equal_those_of_all_the_features():
    rng = np.random.default_rng(0)
    f = rng.normal(3.0, 1.0, size=(40, 3)).astype(np.float32)
    y = rng.integers(0, 2, 40)

    @jax.jit
    def moments(f, y):
        z = cg.ClassGaussians.zeros(2, 3)
        a = z.add(f[:25], y[:25], jnp.ones(25, bool))
        b = z.add(f[25:], y[25:], jnp.ones(15, bool))
        both = a.combined(b)
        return both.means(), both.covariances()

    means, covs = moments(f, y)
    for k in range(2):
        np.testing.assert_allclose(covs[k], np.cov(f[y == k].T), atol=1e-5)
        np.testing.assert_allclose(means[k], f[y == k].mean(0), atol=1e-5)


def test_check_refuses_domain_and_a_small_pool(tmp_path):
    cfg = _config(tmp_path, **{"data.scenario": "domain"})
    assert any("data.scenario=class" in p for p in hp.HiDePrompt.check(cfg))
    cfg = _config(tmp_path, **{"method.hide_prompt_pool_size": 1})
    assert any("hide_prompt_pool_size=1" in p for p in hp.HiDePrompt.check(cfg))
    cfg = _config(tmp_path, **{"method.hide_prompt_storage": "centroids"})
    assert any("hide_prompt_storage" in p for p in hp.HiDePrompt.check(cfg))


def _record_end_states(monkeypatch):
    seen = []
    end_task = hp.HiDePrompt.end_task

    def recorded(self, task, trainable, state, ctx):
        out = end_task(self, task, trainable, state, ctx)
        seen.append(
            (task.index, jax.tree.map(np.asarray, trainable), jax.tree.map(np.asarray, out))
        )
        return out

    monkeypatch.setattr(hp.HiDePrompt, "end_task", recorded)
    return seen


@pytest.mark.slow
@pytest.mark.parametrize("loss", ["aepg", "ce"])
def test_runs_end_to_end(tmp_path, monkeypatch, loss):
    seen = _record_end_states(monkeypatch)
    results = trainer.run(_config(tmp_path, **{"loss.name": loss}), str(tmp_path / "run"))
    assert np.isfinite(results["A_T"]) and len(results["accuracy_matrix"]) == 2
    (_, tr0, s0), (_, tr1, s1) = seen
    # Statistics of exactly the seen classes; the TII classifier trained; task 1's heads
    # aligned (they differ from the ones the trainer handed over), task 0's kept as trained.
    counts = [int(n) for n in (s1["wtp_stats"]["mean"] != 0).any(1)]
    assert counts == [1] * 10
    assert np.any(s0["tii"]["head"]["kernel"] != 0)
    assert not np.allclose(s1["head"]["task_0"]["kernel"], tr1["head"]["task_0"]["kernel"])
    np.testing.assert_array_equal(s0["head"]["task_0"]["kernel"], tr0["head"]["task_0"]["kernel"])
    # Slot 1 started as slot 0's copy and trained on.
    e = tr1["prompt"]["e"]
    assert not np.allclose(e[:, :, 1], e[:, :, 0])


@pytest.mark.slow  # two runs
def test_seed_1_of_two_vmapped_seeds_equals_its_single_run(tmp_path):
    """The host-side hooks run per seed on the vmapped state: seed 6 of a 2-seed run ends
    with the accuracy matrix of seed 6 run alone."""
    cfg = _config(tmp_path, seed=5, num_seeds=2, max_steps_per_task=4)
    assert trainer.run(cfg, str(tmp_path / "vmapped"))["seeds"] == [5, 6]
    single = trainer.run(_config(tmp_path, seed=6, max_steps_per_task=4), str(tmp_path / "one"))
    per_seed = json.load(open(tmp_path / "vmapped" / "seed_6" / records.RESULTS_FILE))
    np.testing.assert_allclose(
        np.array(per_seed["accuracy_matrix"], float),
        np.array(single["accuracy_matrix"], float),
        atol=1e-6,
    )


@pytest.mark.slow  # three runs
def test_interrupted_statistics_pass_resumes_to_the_same_results(tmp_path, monkeypatch):
    cfg = _config(tmp_path, max_steps_per_task=3)
    straight = trainer.run(cfg, str(tmp_path / "straight"))
    assert_resumes_after_a_crash_in_end_task(
        hp.HiDePrompt, cfg, tmp_path / "killed", straight, monkeypatch
    )
