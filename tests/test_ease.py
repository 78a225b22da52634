"""EASE (methods/ease.py): its prototype completion and subspace scoring against direct
transcriptions of the official loops, the AdaptFormer adapter's placement, its config checks,
end-to-end runs with either loss and a resume that equals an uninterrupted run.

The whole method against the official code's outputs: tests/test_official_ease.py."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from resume import assert_resumes_after_a_crash_in_end_task
from tiny import tiny_config

from aepg_jax.config import schema
from aepg_jax.continual import trainer
from aepg_jax.methods import ease
from aepg_jax.models import peft as peft_lib
from aepg_jax.models import vit


def _cos(a, b):
    return float(a @ b / max(np.linalg.norm(a) * np.linalg.norm(b), 1e-8))


def _softmax(x):
    e = np.exp(x - x.max())
    return e / e.sum()


def _solve_sim_reset(w, cur, init_cls, inc, total, ptm, d):
    """models/ease.py `solve_sim_reset` (recalc_sim), on a (C, S*D) numpy fc weight."""
    w = w.copy()
    for task_id in range(cur):
        dims = range(task_id + 2, cur + 2) if ptm else range(task_id + 1, cur + 1)
        for dim_id in dims:
            start_cls = 0 if task_id == 0 else init_cls + (task_id - 1) * inc
            end_cls = init_cls if task_id == 0 else start_cls + inc
            sd, ed = dim_id * d, (dim_id + 1) * d
            so = init_cls + (dim_id - (2 if ptm else 1)) * inc
            sdo, edo = (task_id + ptm) * d, (task_id + 1 + ptm) * d
            a, b, a_hat = w[so:total, sdo:edo], w[so:total, sd:ed], w[start_cls:end_cls, sdo:edo]
            sim = np.array([[_cos(x, y) for y in a] for x in a_hat])
            sim = np.stack([_softmax(row) for row in sim])
            w[start_cls:end_cls, sd:ed] = sim @ b
    return w


_complete = jax.jit(ease.complete, static_argnums=(3,))  # one compilation per ptm
_scores = jax.jit(ease.subspace_logits, static_argnums=(4, 5, 6, 7))


@pytest.mark.parametrize("ptm", [0, 1])
def test_completion_equals_the_official_loops(ptm):
    rng = np.random.default_rng(ptm)
    tasks, per, d = 4, 3, 5
    owner = np.repeat(np.arange(tasks), per)
    slots = tasks + ptm
    real = rng.normal(size=(tasks * per, slots, d)).astype(np.float32)
    for cur in range(tasks):
        # The real prototypes after task `cur`: class c in slots <= own(c), seen classes only.
        protos = (
            real
            * ((np.arange(slots)[None, :] <= owner[:, None] + ptm) & (owner <= cur)[:, None])[
                ..., None
            ]
        )
        ours = np.asarray(_complete(jnp.asarray(protos), jnp.asarray(owner), cur, ptm))
        total = (cur + 1) * per
        w = protos[:total, : cur + 1 + ptm].reshape(total, -1)
        theirs = _solve_sim_reset(w, cur, per, per, total, ptm, d)
        np.testing.assert_allclose(
            ours[:total, : cur + 1 + ptm].reshape(total, -1), theirs, atol=1e-5
        )
        assert not np.any(ours[total:]) and not np.any(ours[:, cur + 1 + ptm :])
        if cur:  # every old class got a prototype in every later subspace
            assert np.all(np.abs(ours[:total, : cur + 1 + ptm]).sum(-1) > 0)


def _forward_reweight(x, w, cur, alpha, beta, init_cls, inc, d, ptm):
    """backbone/linears.py `CosineLinear.forward_reweight` in numpy (sigma 1)."""
    unit = lambda v: v / np.maximum(np.linalg.norm(v, axis=1, keepdims=True), 1e-12)
    blocks = []
    for i in range(cur + 1):
        s = 0 if i == 0 else init_cls + (i - 1) * inc
        e = init_cls if i == 0 else s + inc
        out = 0.0
        for j in range(w.shape[1] // d):
            cos = unit(x[:, j * d : (j + 1) * d]) @ unit(w[s:e, j * d : (j + 1) * d]).T
            if ptm and j == 0:
                out = out + beta * cos
            elif j != i + ptm:
                out = out + alpha * cos / cur
            else:
                out = out + cos
        blocks.append(out)
    return np.concatenate(blocks, 1)


@pytest.mark.parametrize("ptm", [0, 1])
def test_subspace_scores_equal_the_official_classifier(ptm):
    rng = np.random.default_rng(3)
    tasks, per, d, batch = 3, 2, 4, 5
    owner = np.repeat(np.arange(tasks), per)
    slots = tasks + ptm
    feats = rng.normal(size=(slots, batch, d)).astype(np.float32)
    protos = rng.normal(size=(tasks * per, slots, d)).astype(np.float32)
    for cur in range(tasks):
        total, live = (cur + 1) * per, cur + 1 + ptm
        x = feats[:live].transpose(1, 0, 2).reshape(batch, -1)
        w = protos[:total, :live].reshape(total, -1)
        args = (jnp.asarray(feats), jnp.asarray(protos), jnp.asarray(owner), cur, ptm, 0.3, 0.7)
        ours = np.asarray(_scores(*args, True))[:, :total]
        theirs = _forward_reweight(x, w, cur, 0.3, 0.7, per, per, d, ptm)
        np.testing.assert_allclose(ours, theirs, atol=1e-5)
        # Without reweighting: the cosine of the concatenations (CosineLinear.forward).
        ours = np.asarray(_scores(*args, False))[:, :total]
        unit = lambda v: v / np.linalg.norm(v, axis=1, keepdims=True)
        np.testing.assert_allclose(ours, unit(x) @ unit(w).T, atol=1e-5)


def test_the_adaptformer_adapter_sits_beside_the_mlp():
    """`h + MLP(LN h) + 0.1 Up(ReLU(Down h))`, h = x + Attn(LN x): the block with the adapter
    minus the block without it is exactly the adapter of h."""
    peft = peft_lib.PeftConfig(kind="adapter", blocks=(0,), adapter_dim=3, adapter_style="ffn")
    block = vit.Encoder1DBlock(num_heads=2, mlp_dim=16, block_index=0, peft=peft)
    x = jax.random.normal(jax.random.key(0), (2, 5, 8))
    params = jax.jit(block.init)(jax.random.key(1), x)["params"]
    assert "scale" not in params["adapter"]  # a fixed 0.1, not learned
    plain = vit.Encoder1DBlock(2, 16, 0, peft_lib.PeftConfig(kind="none"))

    @jax.jit  # one compilation for the whole comparison
    def outputs(params):
        without = {k: v for k, v in params.items() if k != "adapter"}
        mlp_zero = jax.tree.map(jnp.zeros_like, params["MlpBlock_0"])
        h = plain.apply({"params": {**without, "MlpBlock_0": mlp_zero}}, x)  # no MLP branch
        return block.apply({"params": params}, x), plain.apply({"params": without}, x), h

    out, without, _ = outputs(params)
    np.testing.assert_array_equal(out, without)  # Up starts at zero: the identity
    a = params["adapter"]
    a["up"] = {
        "kernel": jax.random.normal(jax.random.key(2), a["up"]["kernel"].shape),
        "bias": jnp.full(a["up"]["bias"].shape, 0.5),
    }
    out, without, h = outputs(params)
    down = jax.nn.relu(h @ a["down"]["kernel"] + a["down"]["bias"])
    ref = 0.1 * (down @ a["up"]["kernel"] + a["up"]["bias"])
    np.testing.assert_allclose(out - without, ref, atol=1e-5)


def test_checks_name_the_field_in_one_line():
    cfg = schema.base_config("vit_tiny")
    cfg.method.name = "ease"
    cfg.method.ease_ffn_num = 0
    cfg.method.ease_alpha = -1.0
    cfg.data.scenario = "domain"
    problems = ease.Ease.check(cfg)
    assert len(problems) == 3 and all("\n" not in p for p in problems)
    assert problems[0].startswith("method.ease_ffn_num=0")
    assert problems[1].startswith("method.ease_alpha=-1.0")
    assert "data.scenario=domain" in problems[2]


def _config(tmp_path, **overrides):
    base = {
        "method.name": "ease",
        "method.ease_ffn_num": 4,
        "data.num_tasks": 2,
        "optim.peft_freeze_epochs": 0,
        "max_steps_per_task": 3,
    }
    return tiny_config(tmp_path / "cache", **{**base, **overrides})


@pytest.mark.slow  # ~30 s on 2 cores: three programs compiled per run
@pytest.mark.parametrize("loss, ptm", [("aepg", False), ("ce", True)])
def test_runs_end_to_end_with_earlier_adapters_frozen(tmp_path, monkeypatch, loss, ptm):
    ends = []
    end_task = ease.Ease.end_task

    def recorded(self, task, trainable, state, ctx):
        out = end_task(self, task, trainable, state, ctx)
        ends.append(jax.tree.map(np.asarray, out))
        return out

    monkeypatch.setattr(ease.Ease, "end_task", recorded)
    cfg = _config(tmp_path, **{"loss.name": loss, "method.ease_use_init_ptm": ptm})
    results = trainer.run(cfg, str(tmp_path / "run"))
    assert np.isfinite(results["A_T"]) and len(results["accuracy_matrix"]) == 2
    first, last = ends
    # Task 0's adapter is kept as trained; task 1's is new and trained (Up starts at zero).
    for a, b in zip(*(jax.tree.leaves(e["adapters"]) for e in ends), strict=True):
        np.testing.assert_array_equal(a[0], b[0])
    assert np.any(last["adapters"]["up"]["kernel"][1])
    assert not np.any(first["adapters"]["up"]["kernel"][1])
    # Task 0's classes keep their real prototypes and got one in task 1's subspace.
    p0 = first["prototypes"]
    np.testing.assert_array_equal(last["prototypes"][:2, : 1 + ptm], p0[:2, : 1 + ptm])
    assert np.all(np.abs(last["prototypes"][:2, 1 + ptm]).sum(-1) > 0)


@pytest.mark.slow  # three runs
def test_interrupted_prototype_pass_resumes_to_the_same_results(tmp_path, monkeypatch):
    """A run stopped in task 1's prototype pass restarts from task 0's checkpoint and ends
    exactly as an uninterrupted run."""
    cfg = _config(tmp_path)
    straight = trainer.run(cfg, str(tmp_path / "straight"))
    assert_resumes_after_a_crash_in_end_task(
        ease.Ease, cfg, tmp_path / "killed", straight, monkeypatch
    )
