"""SLCA (methods/slca.py): the slow learner's per-label learning rate, the multistep schedule,
the config checks, end-to-end runs with both losses and two vmapped seeds, and resume. The
official-code comparison is tests/test_official_slca.py."""

import json
import pathlib

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from resume import assert_resumes_after_a_crash_in_end_task
from tiny import tiny_config

from aepg_jax.continual import steps, trainer
from aepg_jax.methods import slca
from aepg_jax.models import partition


def _config(tmp_path, **overrides):
    base = {"method.name": "slca", "data.num_tasks": 2, "optim.peft_freeze_epochs": 0,
            "method.slca_ca_samples": 16, "method.slca_ca_epochs": 2}  # fmt: skip
    return tiny_config(tmp_path / "cache", **{**base, **overrides})


def test_backbone_copy_trains_at_its_scaled_rate_and_multistep_decays():
    cfg = _config(pathlib.Path("/nonexistent"))
    cfg.optim.update(dict(optimizer="sgd", momentum=0.0, learning_rate=0.5,
                          lr_schedule="multistep", lr_milestones=(1,), lr_decay=0.1))  # fmt: skip
    method = slca.SLCA(cfg)
    assert method.lr_scales == {partition.FINETUNED: 0.01}
    tree = {"head": {"task_0": {"kernel": jnp.ones((2, 2))}},
            partition.FINETUNED: {"Transformer": {"w": jnp.ones((2,))}}}  # fmt: skip
    tx = steps.optimizer(cfg, tree, steps_per_epoch=2, lr_scales=method.lr_scales)
    state = tx.init(tree)
    grads = jax.tree.map(jnp.ones_like, tree)
    lrs = []
    for _ in range(3):  # epochs 0, 0, 1: lr, lr, lr / 10
        rates = steps.applied_rates(state, steps.learning_rate(cfg, 2), method.lr_scales)
        lrs.append((float(rates["head"]), float(rates[partition.FINETUNED])))
        updates, state = tx.update(grads, state, tree)
    np.testing.assert_allclose(lrs, [(0.5, 0.005), (0.5, 0.005), (0.05, 0.0005)], rtol=1e-6)
    np.testing.assert_allclose(updates["head"]["task_0"]["kernel"], -0.05, rtol=1e-6)
    np.testing.assert_allclose(updates[partition.FINETUNED]["Transformer"]["w"], -5e-4, rtol=1e-6)


def test_check_names_the_field():
    cfg = _config(pathlib.Path("/nonexistent"), **{"method.slca_backbone_lr_scale": 0.0})
    assert "method.slca_backbone_lr_scale" in slca.SLCA.check(cfg)[0]
    cfg = _config(pathlib.Path("/nonexistent"), **{"data.scenario": "domain"})
    assert "data.scenario=class" in slca.SLCA.check(cfg)[0]


def _record(monkeypatch):
    seen = []
    end_task = slca.SLCA.end_task

    def recorded(self, task, trainable, state, ctx):
        out = end_task(self, task, trainable, state, ctx)
        seen.append((jax.tree.map(np.asarray, trainable), jax.tree.map(np.asarray, out)))
        return out

    monkeypatch.setattr(slca.SLCA, "end_task", recorded)
    return seen


@pytest.mark.slow
@pytest.mark.parametrize("loss", ["aepg", "ce"])
def test_runs_end_to_end_fine_tuning_the_backbone_and_aligning(tmp_path, monkeypatch, loss):
    seen = _record(monkeypatch)
    cfg = _config(tmp_path, **{"loss.name": loss, "max_steps_per_task": 3})
    results = trainer.run(cfg, str(tmp_path / "run"))
    assert np.isfinite(results["A_T"]) and len(results["accuracy_matrix"]) == 2
    (tr0, s0), (tr1, s1) = seen
    # The backbone copy moved, the statistics cover the seen classes, task 1's alignment
    # changed the classifier, and task 0's head kept for alignment is its trained one.
    moved = jax.tree.map(lambda a, b: np.abs(a - b).max(), tr0[partition.FINETUNED],
                         tr1[partition.FINETUNED])  # fmt: skip
    assert max(jax.tree.leaves(moved)) > 0
    counts = s1["stats"]["counts"]
    assert np.all(counts[: len(counts)] > 0)
    assert not np.allclose(s1["aligned"]["kernel"], s1["heads"]["kernel"])
    np.testing.assert_array_equal(s0["aligned"]["kernel"], s0["heads"]["kernel"])
    np.testing.assert_array_equal(s1["heads"]["kernel"][:, :2], s0["heads"]["kernel"][:, :2])


@pytest.mark.slow
def test_two_vmapped_seeds_run(tmp_path):
    cfg = _config(tmp_path, **{"num_seeds": 2, "max_steps_per_task": 2})
    trainer.run(cfg, str(tmp_path / "run"))
    per_seed = sorted((tmp_path / "run").glob("seed_*/results.json"))
    assert len(per_seed) == 2
    matrices = [json.loads(p.read_text())["accuracy_matrix"] for p in per_seed]
    assert all(len(m) == 2 for m in matrices)


@pytest.mark.slow  # three runs
def test_interrupted_alignment_resumes_to_the_same_results(tmp_path, monkeypatch):
    cfg = _config(tmp_path, max_steps_per_task=3)
    straight = trainer.run(cfg, str(tmp_path / "straight"))
    assert_resumes_after_a_crash_in_end_task(
        slca.SLCA, cfg, tmp_path / "killed", straight, monkeypatch
    )
