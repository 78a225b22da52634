"""SD-LoRA (docs/algorithm.md §23): the stacked LoRA against its formula, the magnitudes'
gradients, rank reduction, the ViT-B/16 parameter count, config checks, end-to-end runs,
resume and vmapped seeds. The comparison with the official code: test_official_sd_lora.py."""

import json
import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from resume import assert_resumes_after_a_crash_in_end_task
from test_driver import REPO, tiny_config
from test_multiseed import _assert_same_run

from aepg_jax.config import schema
from aepg_jax.continual import trainer
from aepg_jax.methods import TaskSpec, sd_lora
from aepg_jax.models import partition, vit
from aepg_jax.runs import records

T, N, D, R = 3, 2, 32, 4


def _tiny_cfg(**method):
    cfg = schema.base_config("vit_tiny")
    cfg.model.update(dict(patch_size=4, hidden_size=D, depth=2, num_heads=2, mlp_dim=64))
    cfg.model.update(dict(image_size=16))
    cfg.data.num_tasks = T
    cfg.method.name = "sd_lora"
    cfg.method.sd_lora_rank = R
    cfg.method.update(method)
    return cfg


def _trained(method, task, seed=0):
    """A trainable tree of task `task` and a state of tasks < task, with random entries."""
    rng = np.random.default_rng(seed)
    state = method.initial_state()
    for k in ("A_q", "A_v", "B_q", "B_v"):
        x = rng.normal(size=state[k].shape).astype(np.float32)
        x[task:] = 0
        state[k] = jnp.asarray(x)
    tr = method.grow(task, {}, jax.random.key(seed))
    lora = tr[sd_lora.KEY]["lora"]
    lora["B_q"] = jnp.asarray(rng.normal(size=lora["B_q"].shape), jnp.float32)
    lora["B_v"] = jnp.asarray(rng.normal(size=lora["B_v"].shape), jnp.float32)
    lora["alpha_prev"] = jnp.asarray(rng.uniform(0.5, 1.5, T), jnp.float32)
    return tr, state


def test_the_stacked_lora_equals_the_formula_per_block():
    """The network's rank-T r LoRA of block b, applied to x: alpha_t x A_t^T B_t^T + sum_{s<t}
    alpha'_s x A_s^T B_s^T / (||B_s|| ||A_s||), for Q and V."""
    method = sd_lora.SDLoRA(_tiny_cfg())
    tr, state = _trained(method, 2)
    lora = tr[sd_lora.KEY]["lora"]
    params = jax.jit(method.params, static_argnums=3)(tr, {}, state, 2)
    x = np.random.default_rng(1).normal(size=(5, D)).astype(np.float32)
    for i, blk in enumerate(method.blocks):
        got = params["Transformer"][f"encoderblock_{blk}"]["MultiHeadDotProductAttention_0"]
        for a_name, b_name, target in sd_lora._PAIRS:
            a, b = np.asarray(got["lora"][f"{target}_A"]), np.asarray(got["lora"][f"{target}_B"])
            want = (
                float(lora["alpha"])
                * x
                @ np.asarray(lora[a_name][i]).T
                @ np.asarray(lora[b_name][i]).T
            )
            for s in range(2):
                a_s, b_s = np.asarray(state[a_name][s, i]), np.asarray(state[b_name][s, i])
                norm = np.linalg.norm(a_s) * np.linalg.norm(b_s)
                want += float(lora["alpha_prev"][s]) * x @ a_s.T @ b_s.T / norm
            np.testing.assert_allclose(x @ a.T @ b.T, want, rtol=1e-4, atol=1e-4)
        assert "key_A" not in got["lora"]


def test_gradients_reach_the_current_pair_and_earlier_magnitudes_only():
    method = sd_lora.SDLoRA(_tiny_cfg())
    tr, state = _trained(method, 1)

    def loss(lora):
        p = method.params({sd_lora.KEY: {"lora": lora}}, {}, state, 1)
        blocks = p["Transformer"]
        return sum(
            jnp.sum(jnp.sin(blk["MultiHeadDotProductAttention_0"]["lora"][f"{t}_B"]))
            + jnp.sum(jnp.cos(blk["MultiHeadDotProductAttention_0"]["lora"][f"{t}_A"]))
            for blk in blocks.values()
            for t in ("query", "value")
        )

    g = jax.jit(jax.grad(loss))(tr[sd_lora.KEY]["lora"])
    assert float(g["alpha_prev"][0]) != 0.0
    np.testing.assert_array_equal(g["alpha_prev"][1:], 0.0)  # tasks >= t: unused
    assert float(g["alpha"]) != 0.0 and np.any(g["A_q"]) and np.any(g["B_v"])


def test_rank_reduction_zeroes_the_unused_rows_and_keeps_them_at_zero():
    method = sd_lora.SDLoRA(_tiny_cfg(sd_lora_rank_steps=((1, 3), (2, 2))))
    assert method.ranks == (4, 3, 2)
    lora = method.grow(2, {}, jax.random.key(0))[sd_lora.KEY]["lora"]
    assert np.all(np.asarray(lora["A_q"])[:, 2:] == 0) and np.all(np.asarray(lora["A_q"])[:, :2])
    tr, state = _trained(method, 2)

    def loss(lora):
        p = method.params({sd_lora.KEY: {"lora": lora}}, {}, state, 2)
        return sum(jnp.sum(jnp.sin(x)) for x in jax.tree.leaves(p))

    g = jax.jit(jax.grad(loss))(tr[sd_lora.KEY]["lora"])
    np.testing.assert_array_equal(np.asarray(g["A_q"])[:, 2:], 0.0)
    np.testing.assert_array_equal(np.asarray(g["B_v"])[:, :, 2:], 0.0)


def test_end_task_stores_the_pair_and_the_magnitudes():
    method = sd_lora.SDLoRA(_tiny_cfg())
    tr, state = _trained(method, 1)
    spec = TaskSpec(1, 2, 2, 0, (2,) * T)
    out = method.end_task(spec, tr, state, None)
    lora = tr[sd_lora.KEY]["lora"]
    np.testing.assert_array_equal(out["B_q"][1], lora["B_q"])
    np.testing.assert_array_equal(out["A_v"][0], state["A_v"][0])
    np.testing.assert_allclose(
        out["magnitudes"][1], [lora["alpha_prev"][0], lora["alpha"], 0.0], rtol=0
    )


def test_trainable_count_for_vit_b16_rank10_all_blocks():
    """Per task 4 r D per block (A and B of Q and V) + T + 1 magnitudes, heads excluded."""
    cfg = schema.base_config("vit_b16")
    cfg.method.name, cfg.data.num_tasks = "sd_lora", 10
    method = sd_lora.SDLoRA(cfg)
    shapes = jax.eval_shape(lambda: method.grow(3, {}, jax.random.key(0)))
    assert set(jax.tree.leaves(partition.label_params(shapes))) == {partition.PEFT}
    assert partition.count(shapes)["total"] == 12 * 4 * 10 * 768 + 11
    state = jax.eval_shape(method.initial_state)
    assert state["A_q"].shape == (10, 12, 10, 768)
    # The network at full size: rank-100 LoRA leaves on Q and V of every block.
    init = jax.eval_shape(lambda: vit.init_params(method.net.model_cfg, jax.random.key(0), (10,)))
    lora = init["Transformer"]["encoderblock_11"]["MultiHeadDotProductAttention_0"]["lora"]
    assert lora["query_A"].shape == (100, 768) and "key_A" not in lora


def test_config_checks_name_each_field():
    for field, bad in (
        ("sd_lora_rank", 0),
        ("sd_lora_blocks", (1, 1)),
        ("sd_lora_magnitude_init", 0.0),
        ("sd_lora_rank_steps", ((4, 20),)),
    ):
        c = schema.base_config("vit_tiny")
        c.method[field] = bad
        with pytest.raises(ValueError, match=rf"method\.{field}="):
            schema.validate(c)
    c = schema.base_config("vit_tiny")
    c.method.name, c.method.sd_lora_blocks = "sd_lora", (7, 8)
    with pytest.raises(ValueError, match=r"method\.sd_lora_blocks=\(7, 8\) has no block below"):
        schema.validate(c)


# ------------------------------------------------------------------------ end to end, tiny


def _config(tmp_path, **overrides):
    base = {"method.name": "sd_lora", "data.num_tasks": 2, "max_steps_per_task": 4}
    return tiny_config(tmp_path / "cache", **{**base, **overrides})


@pytest.mark.slow  # ~15 s: two tiny runs' compilations
@pytest.mark.parametrize("loss", ["aepg", "ce"])
def test_runs_end_to_end_with_earlier_directions_frozen(tmp_path, monkeypatch, loss):
    seen = []
    end = sd_lora.SDLoRA.end_task

    def recorded(self, task, trainable, state, ctx):
        state = end(self, task, trainable, state, ctx)
        seen.append(jax.tree.map(np.asarray, state))
        return state

    monkeypatch.setattr(sd_lora.SDLoRA, "end_task", recorded)
    cfg = _config(tmp_path, **{"loss.name": loss, "optim.peft_freeze_epochs": 0})
    results = trainer.run(cfg, str(tmp_path / "run"))
    assert np.isfinite(results["A_T"]) and len(results["accuracy_matrix"]) == 2
    first, last = seen
    assert np.any(first["B_q"][0]) and not np.any(first["B_q"][1])
    for k in ("A_q", "A_v", "B_q", "B_v"):
        np.testing.assert_array_equal(last[k][0], first[k][0])  # task 0's direction kept
    assert np.any(last["B_v"][1])
    assert last["magnitudes"][1, 0] != first["magnitudes"][0, 0]  # relearned in task 1


@pytest.mark.slow  # two runs and a crashed one
def test_a_run_killed_at_the_end_of_a_task_resumes_to_the_same_results(tmp_path, monkeypatch):
    cfg = _config(tmp_path, **{"data.num_tasks": 3, "max_steps_per_task": 3})
    straight = trainer.run(cfg, str(tmp_path / "straight"))
    assert_resumes_after_a_crash_in_end_task(
        sd_lora.SDLoRA, cfg, tmp_path / "killed", straight, monkeypatch
    )


@pytest.mark.slow
def test_seed_i_of_a_vmapped_run_equals_a_single_run_of_seed_i(tmp_path):
    base = {"seed": 5, "data.num_tasks": 2, "max_steps_per_task": 6, "log_every_steps": 1}
    trainer.run(_config(tmp_path, **base, num_seeds=2), str(tmp_path / "vmapped"))
    for seed in (5, 6):
        single_cfg = _config(tmp_path, **base)
        single_cfg.seed = seed
        single = trainer.run(single_cfg, str(tmp_path / f"single_{seed}"))
        seed_dir = tmp_path / "vmapped" / f"seed_{seed}"
        per_seed = json.load(open(seed_dir / records.RESULTS_FILE))
        _assert_same_run(seed_dir, tmp_path / f"single_{seed}", per_seed, single)


@pytest.mark.slow
def test_default_config_runs_with_sd_lora(tmp_path):
    """`--config.method.name=sd_lora` on the embedded default (its LoRA dropped), shortened."""
    cfg = schema.from_file(os.path.join(REPO, "configs", "default.py"))
    cfg.method.name = "sd_lora"
    cfg.data.cache_dir = str(tmp_path / "cache")
    cfg.pretrain.cache_dir = str(tmp_path / "cache" / "pretrained")
    cfg.pretrain.dataset, cfg.pretrain.epochs = "digits", 1  # Fashion-MNIST may be absent
    cfg.data.num_tasks, cfg.max_steps_per_task = 2, 2
    results = trainer.run(cfg, str(tmp_path / "run"))
    assert results["predictors"] == ["model"] and np.isfinite(results["A_T"])
