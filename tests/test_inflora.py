"""InfLoRA (docs/algorithm.md §15): the DualGPM memory, the down-projections, the
frozen A and earlier B, the ViT-B/16 parameter count, end-to-end runs, resume and seeds."""

import json
import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from test_driver import REPO, _run_subprocess, tiny_config
from test_multiseed import _assert_same_run

from aepg_jax import methods
from aepg_jax.config import schema
from aepg_jax.continual import trainer
from aepg_jax.methods import dualgpm, inflora
from aepg_jax.models import partition, vit
from aepg_jax.runs import records


def _orthonormal(rng, d, k):
    return np.linalg.qr(rng.normal(size=(d, k)))[0]


def _cov(rng, d, n=200):
    x = rng.normal(size=(n, d)) * np.linspace(3.0, 0.1, d)
    return x.T @ x / n


# ------------------------------------------------------------------------- DualGPM, numpy


def test_threshold_rule_on_a_toy_diagonal_covariance():
    """§7 item 9: S^2 ratios [.5, .3, .15, .05], th .99 -> 3 directions kept, 'remove'."""
    s = np.sqrt([0.5, 0.3, 0.15, 0.05, 0, 0, 0, 0])  # the covariance's singular values
    mem = dualgpm.update(np.diag(s), dualgpm.Memory.empty(8), 0.99, "dualgpm")
    assert mem.basis.shape == (8, 3) and not mem.retain
    np.testing.assert_allclose(np.abs(mem.basis), np.eye(8)[:, :3], atol=1e-12)
    assert dualgpm.update(np.diag(s), dualgpm.Memory.empty(8), 0.9, "dualgpm").basis.shape[1] == 2
    assert dualgpm.threshold(0.99, 1.0, 0, 10) == 0.99
    assert dualgpm.threshold(0.99, 1.0, 5, 10) == pytest.approx(0.995)


@pytest.mark.parametrize("retain", [False, True])
def test_down_projection_avoids_or_stays_in_the_memory(retain):
    """§7 item 8: 'remove': F^T A^T = 0; 'retain': A^T = F F^T A^T; A A^T = I / 3."""
    rng = np.random.default_rng(0)
    mem = dualgpm.Memory(_orthonormal(rng, 16, 6), retain)
    a = dualgpm.down_projection(_cov(rng, 16), mem, rank=3)
    assert a.shape == (3, 16)
    np.testing.assert_allclose(3.0 * a @ a.T, np.eye(3), atol=1e-10)
    if retain:
        assert np.linalg.norm(a.T - mem.projector() @ a.T) < 1e-10
    else:
        assert np.linalg.norm(mem.basis.T @ a.T) < 1e-10


def test_a_new_task_leaves_inputs_of_the_memorised_subspace_unchanged():
    """§7 item 8: task-0 inputs inside the memory give x A_1^T = 0, so B_1 cannot move them.
    (The threshold rule keeps the directions before the one that crosses th, so a memory
    built from the data holds all but a < 1 - th share of it; here F is given.)"""
    rng = np.random.default_rng(4)
    span = _orthonormal(rng, 16, 4)
    x0 = rng.normal(size=(300, 4)) @ span.T  # task 0's inputs: rank 4, inside F
    a1 = dualgpm.down_projection(_cov(rng, 16), dualgpm.Memory(span), rank=3)
    b1 = rng.normal(size=(16, 3))
    assert np.abs(x0 @ a1.T @ b1.T).max() < 1e-10


def test_a_wide_remove_basis_becomes_its_retained_complement():
    rng = np.random.default_rng(1)
    cov = _cov(rng, 8)
    wide = dualgpm.update(cov, dualgpm.Memory.empty(8), 0.9999, "dualgpm")
    assert wide.retain and 1 <= wide.basis.shape[1] < 4
    kept = dualgpm.update(cov, dualgpm.Memory.empty(8), 0.9999, "gpm")  # b5's code: no switch
    assert not kept.retain and kept.basis.shape[1] > 4
    # The complement is orthogonal to the protected directions.
    assert np.linalg.norm(kept.basis.T @ wide.basis) < 1e-10
    # Later tasks: 'retain' shrinks the complement, 'remove' grows the basis; both orthonormal.
    cov2 = _cov(np.random.default_rng(2), 8)
    for mem in (
        dualgpm.update(cov2, wide, 0.9999, "dualgpm"),
        dualgpm.update(cov2, kept, 0.9, "gpm"),
    ):
        np.testing.assert_allclose(mem.basis.T @ mem.basis, np.eye(mem.basis.shape[1]), atol=1e-10)
    assert dualgpm.update(cov2, wide, 0.9999, "dualgpm").basis.shape[1] <= wide.basis.shape[1]


# ----------------------------------------------------------------- the method's hooks, tiny


def _tiny_method(lamb):
    cfg = tiny_config_like()
    cfg.method.inflora_lamb = lamb
    return inflora.InfLoRA(cfg), cfg


def tiny_config_like():
    cfg = schema.base_config("vit_tiny")
    cfg.model.update(dict(patch_size=4, hidden_size=32, depth=2, num_heads=2, mlp_dim=64))
    cfg.model.image_size = 16
    cfg.method.name = "inflora"
    cfg.method.inflora_rank = 3
    cfg.data.num_tasks = 3
    return cfg


def _context(method, cfg, seed):
    params = vit.init_params(method.net.model_cfg, jax.random.PRNGKey(0))
    rng = np.random.default_rng(seed)
    images = rng.integers(0, 256, size=(3, 16, 16, 16, 3), dtype=np.uint8)

    def batches():
        for imgs in images:
            yield {"image": jnp.asarray(imgs), "mask": jnp.ones(16, bool)}

    return methods.TaskContext(method.net, params, batches)


@pytest.mark.parametrize("lamb,retain", [(0.6, False), (0.9999, True)])
def test_hooks_give_a_frozen_orthogonal_a_per_task(lamb, retain):
    method, cfg = _tiny_method(lamb)
    state, trainable = {}, {}
    for t in range(2):
        spec = methods.TaskSpec(t, 2 * t, 2, 0, (2,) * (t + 1))
        trainable, state = method.begin_task(spec, trainable, state, _context(method, cfg, t))
        trainable = method.grow(t, trainable, jax.random.PRNGKey(t))
        a = np.asarray(state["A"][t], np.float64)  # (blocks, r, D)
        for i in range(len(method.blocks)):
            np.testing.assert_allclose(3.0 * a[i] @ a[i].T, np.eye(3), atol=1e-5)
            if t == 1:  # against the memory stored after task 0
                f = np.asarray(state["basis"][i])[:, : int(state["basis_dim"][i])]
                assert bool(state["retain"][i]) == retain
                if retain:  # rows beyond the complement's width are unconstrained (as ref.)
                    inside = a[i][: min(3, f.shape[1])].T
                    assert np.linalg.norm(inside - f @ f.T @ inside) < 1e-5
                else:
                    assert np.linalg.norm(f.T @ a[i].T) < 1e-5
        lora = trainable[inflora.KEY]["lora"]  # "training": some B_t
        step = 0.1 * (t + 1)
        trainable[inflora.KEY]["lora"] = jax.tree.map(lambda b, s=step: b + s, lora)
        state = method.end_task(spec, trainable, state, _context(method, cfg, t))


def test_trainable_count_for_vit_b16_rank5_blocks_0_to_4():
    """7,680 r per task, heads excluded (A frozen in the state); 12 blocks: 18,432 r."""
    cfg = schema.base_config("vit_b16")
    cfg.method.name, cfg.data.num_tasks = "inflora", 10
    for blocks, rank, want in (((0, 1, 2, 3, 4), 5, 7_680 * 5), (tuple(range(12)), 10, 184_320)):
        cfg.method.inflora_blocks, cfg.method.inflora_rank = blocks, rank
        method = inflora.InfLoRA(cfg)
        shapes = jax.eval_shape(lambda m=method: m.grow(3, {}, jax.random.PRNGKey(0)))
        labels = partition.label_params(shapes)
        assert set(jax.tree.leaves(labels)) == {partition.PEFT}
        assert partition.count(shapes)["total"] == want
        state = jax.eval_shape(method.initial_state)
        assert state["A"].shape == (10, len(blocks), rank, 768)
        assert state["basis"].shape == (len(blocks), 768, 768)


def test_vit_b16_forward_and_covariance_shapes():
    """At full size (abstractly): the merged 12-head K/V kernels, logits, covariance sums."""
    cfg = schema.base_config("vit_b16")
    cfg.method.name, cfg.data.num_tasks = "inflora", 10
    method = inflora.InfLoRA(cfg)
    key = jax.random.PRNGKey(0)
    frozen = jax.eval_shape(lambda: vit.init_params(method.net.model_cfg, key))
    trainable = jax.eval_shape(lambda: method.grow(1, {}, key))
    state = jax.eval_shape(method.initial_state)
    images = jax.ShapeDtypeStruct((2, 224, 224, 3), jnp.float32)
    spec = methods.TaskSpec(1, 20, 20, 0, ())
    logits, extra = jax.eval_shape(
        lambda tr, fr, st, im: method.forward(method.net, tr, fr, st, im, spec),
        trainable,
        frozen,
        state,
        images,
    )
    assert logits.shape == (2, 0) and extra is None
    batch = {
        "image": jax.ShapeDtypeStruct((2, 256, 256, 3), jnp.uint8),
        "mask": jax.ShapeDtypeStruct((2,), bool),
    }
    sums, count = jax.eval_shape(
        method._covariance_sums, frozen, state, trainable[inflora.KEY]["lora"], batch, 1
    )
    assert sums.shape == (5, 768, 768) and count.shape == ()


def test_merged_kernels_equal_the_lora_branch():
    """Adding A^T B^T to the (D, H, Dh) kernel == adding x A^T B^T to the key projection."""
    rng = np.random.default_rng(3)
    d, h, r = 8, 2, 3
    kernel = rng.normal(size=(d, h, d // h)).astype(np.float32)
    a, b = rng.normal(size=(1, 1, r, d)), rng.normal(size=(1, 1, d, r))
    x = rng.normal(size=(5, d))
    delta = np.asarray(inflora.lora_delta(jnp.asarray(a, jnp.float32), jnp.asarray(b, jnp.float32)))
    merged = kernel.reshape(d, d) + delta[0]
    np.testing.assert_allclose(
        x @ merged, x @ kernel.reshape(d, d) + x @ a[0, 0].T @ b[0, 0].T, rtol=1e-4, atol=1e-4
    )


def test_the_unmerged_current_pair_equals_merging_it():
    """The step's tree (tasks < t merged, task t's `(x A_t^T) B_t^T` unmerged) gives the logits
    and B_t gradients of merging every task's `A^T B^T` into the K/V kernels (float32)."""
    method, _ = _tiny_method(0.9)
    rng = np.random.default_rng(4)
    full = vit.init_params(method.net.model_cfg, jax.random.PRNGKey(1), (4,))
    frozen = {k: v for k, v in full.items() if k != "head"}
    state = jax.tree.map(
        lambda x: jnp.asarray(rng.normal(size=x.shape), x.dtype), method.initial_state()
    )
    shape = (len(method.blocks), method.width, method.rank)
    lora = {k: jnp.asarray(rng.normal(size=shape), jnp.float32) for k in ("B_k", "B_v")}
    images = jnp.asarray(rng.normal(size=(2, 16, 16, 3)), jnp.float32)
    task = 1

    def ours(lora):
        trainable = {"head": full["head"], inflora.KEY: {"lora": lora}}
        return method.net.apply(method.params(trainable, frozen, state, task), images, (4,))[0]

    def merged(lora):  # every task's pair in the kernels, the branch's B zero
        a, on = state["A"], (jnp.arange(3) < task).astype(jnp.float32)[:, None, None, None]
        delta = {
            n: inflora.lora_delta(a[task][None], lora[n][None])
            + inflora.lora_delta(a, state[n] * on)
            for n in ("B_k", "B_v")
        }
        zero = {"A": a[task], "B_k": 0 * lora["B_k"], "B_v": 0 * lora["B_v"]}
        backbone = inflora.merged_backbone(frozen, method.blocks, delta["B_k"], delta["B_v"], zero)
        return method.net.apply({**backbone, "head": full["head"]}, images, (4,))[0]

    np.testing.assert_allclose(ours(lora), merged(lora), rtol=1e-4, atol=1e-4)
    loss = lambda f: lambda b: jnp.sum(jnp.sin(f(b)))
    g_ours, g_merged = jax.grad(loss(ours))(lora), jax.grad(loss(merged))(lora)
    for k in ("B_k", "B_v"):
        assert float(jnp.max(jnp.abs(g_merged[k]))) > 1e-3  # a real gradient, not zeros
        np.testing.assert_allclose(g_ours[k], g_merged[k], rtol=1e-3, atol=1e-4)


def test_config_checks_name_each_field():
    for field, bad in (
        ("inflora_rank", 0),
        ("inflora_lamb", 1.5),
        ("inflora_lame", 0.0),
        ("inflora_memory", "nope"),
        ("inflora_blocks", (1, 1)),
    ):
        c = schema.base_config("vit_tiny")
        c.method[field] = bad
        with pytest.raises(ValueError, match=rf"method\.{field}="):
            schema.validate(c)
    c = schema.base_config("vit_tiny")
    c.method.name, c.method.inflora_rank = "inflora", 65
    with pytest.raises(ValueError, match=r"method\.inflora_rank=65 must be <= model\.hidden_size"):
        schema.validate(c)
    c.method.inflora_rank, c.method.inflora_blocks = 5, (7, 8)
    with pytest.raises(ValueError, match=r"method\.inflora_blocks=\(7, 8\) has no block below"):
        schema.validate(c)


# ------------------------------------------------------------------------ end to end, tiny


def _record_states(monkeypatch):
    """[(hook, task, method state as numpy)] after every begin_task / end_task."""
    seen = []
    begin, end = inflora.InfLoRA.begin_task, inflora.InfLoRA.end_task

    def recorded_begin(self, task, trainable, state, ctx):
        trainable, state = begin(self, task, trainable, state, ctx)
        seen.append(("begin", task.index, jax.tree.map(np.asarray, state)))
        return trainable, state

    def recorded_end(self, task, trainable, state, ctx):
        state = end(self, task, trainable, state, ctx)
        seen.append(("end", task.index, jax.tree.map(np.asarray, state)))
        return state

    monkeypatch.setattr(inflora.InfLoRA, "begin_task", recorded_begin)
    monkeypatch.setattr(inflora.InfLoRA, "end_task", recorded_end)
    return seen


def _inflora_config(tmp_path, **overrides):
    # tiny_config turns on the model's LoRA: InfLoRA must drop it and bring its own.
    base = {"method.name": "inflora", "data.num_tasks": 3, "max_steps_per_task": 4}
    return tiny_config(tmp_path / "cache", **{**base, **overrides})


@pytest.mark.parametrize("loss", ["aepg", pytest.param("ce", marks=pytest.mark.slow)])
def test_runs_end_to_end_with_a_and_earlier_b_frozen(tmp_path, monkeypatch, loss):
    seen = _record_states(monkeypatch)
    overrides = {"loss.name": loss, "optim.peft_freeze_epochs": 0, "data.num_tasks": 2}
    cfg = _inflora_config(tmp_path, **overrides)
    results = trainer.run(cfg, str(tmp_path / "run"))
    assert np.isfinite(results["A_T"]) and len(results["accuracy_matrix"]) == 2
    begins = {t: s for hook, t, s in seen if hook == "begin"}
    ends = {t: s for hook, t, s in seen if hook == "end"}
    last = ends[1]
    for t in range(2):
        assert np.any(begins[t]["A"][t]) and not np.any(begins[t]["B_k"][t])
        # A_t as set before task t, bit for bit, after training task t and the later ones.
        np.testing.assert_array_equal(last["A"][t], begins[t]["A"][t])
        assert np.any(ends[t]["B_k"][t]) and np.any(ends[t]["B_v"][t])  # B_t trained
        np.testing.assert_array_equal(last["B_k"][t], ends[t]["B_k"][t])
        np.testing.assert_array_equal(last["B_v"][t], ends[t]["B_v"][t])
        assert (ends[t]["basis_dim"] >= 1).all()


@pytest.mark.slow  # three runs
def test_interrupted_covariance_pass_resumes_to_the_same_results(tmp_path, monkeypatch):
    """A run stopped in task 1's covariance pass restarts from task 0's checkpoint, recomputes
    A_1 and ends exactly as an uninterrupted run."""
    cfg = _inflora_config(tmp_path, **{"data.num_tasks": 2, "max_steps_per_task": 3})
    straight = trainer.run(cfg, str(tmp_path / "straight"))
    covariance = inflora.InfLoRA.covariance

    def crash_in_task_1(self, ctx, state, lora, task, desc):
        if task == 1 and lora is None:
            raise RuntimeError("killed in the covariance pass")
        return covariance(self, ctx, state, lora, task, desc)

    monkeypatch.setattr(inflora.InfLoRA, "covariance", crash_in_task_1)
    with pytest.raises(RuntimeError, match="killed"):
        trainer.run(cfg, str(tmp_path / "killed"))
    monkeypatch.undo()
    resumed = trainer.run(cfg, str(tmp_path / "killed"))
    assert resumed["accuracy_matrix"] == straight["accuracy_matrix"]
    assert resumed["entropy"] == pytest.approx(straight["entropy"], rel=1e-6)


# SIGKILL mid-task then resume: tests/test_driver.py runs it for inflora with the other methods.


@pytest.mark.slow
def test_seed_i_of_a_vmapped_run_equals_a_single_run_of_seed_i(tmp_path):
    """num_seeds=2: per-seed covariance passes and SVDs, one vmapped train step."""
    base = {"seed": 5, "data.num_tasks": 2, "max_steps_per_task": 6, "log_every_steps": 1}
    cfg = _inflora_config(tmp_path, **base, num_seeds=2)
    trainer.run(cfg, str(tmp_path / "vmapped"))
    for seed in (5, 6):
        single_cfg = _inflora_config(tmp_path, **base)
        single_cfg.seed = seed
        single = trainer.run(single_cfg, str(tmp_path / f"single_{seed}"))
        seed_dir = tmp_path / "vmapped" / f"seed_{seed}"
        per_seed = json.load(open(seed_dir / records.RESULTS_FILE))
        _assert_same_run(seed_dir, tmp_path / f"single_{seed}", per_seed, single)


@pytest.mark.slow
def test_default_config_runs_with_inflora_alone(tmp_path):
    """`--config.method.name=inflora` on the embedded default (its LoRA is dropped), shortened."""
    cfg = schema.from_file(os.path.join(REPO, "configs", "default.py"))
    cfg.method.name = "inflora"
    cfg.data.cache_dir = str(tmp_path / "cache")
    cfg.pretrain.cache_dir = str(tmp_path / "cache" / "pretrained")
    cfg.pretrain.dataset, cfg.pretrain.epochs = "digits", 1  # Fashion-MNIST may be absent
    cfg.data.num_tasks, cfg.max_steps_per_task = 2, 2
    results = trainer.run(cfg, str(tmp_path / "run"))
    assert results["predictors"] == ["model"] and np.isfinite(results["A_T"])


@pytest.mark.slow
def test_sharded_over_2_devices_matches_one_device(tmp_path):
    """The covariance pass and the steps on batches sharded over a 2-device mesh."""
    overrides = {"method.name": "inflora", "data.num_tasks": 2, "max_steps_per_task": 4}
    results, losses = {}, {}
    for devices in (1, 2):
        env = {
            "XLA_FLAGS": f"--xla_force_host_platform_device_count={devices}",
            "JAX_PLATFORMS": "cpu",
        }
        work = tmp_path / f"d{devices}"
        _run_subprocess(tmp_path / "cache", work, overrides, env=env)
        results[devices] = json.load(open(work / "results.json"))
        losses[devices] = [
            r["loss"] for r in map(json.loads, open(work / "metrics.jsonl")) if r["type"] == "train"
        ]
    assert results[2]["accuracy_matrix"] == results[1]["accuracy_matrix"]
    np.testing.assert_allclose(losses[2], losses[1], rtol=1e-4, atol=1e-5)
