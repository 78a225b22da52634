"""SimpleCIL and APER (methods/simplecil.py, methods/aper.py) end to end on the tiny config, the
AdaptFormer-style adapter (`model.peft.adapter_style=ffn`) and the SGD / cosine-annealing
optimiser they run with. The comparison with the official code: tests/test_official_aper.py."""

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import optax
import pytest
from resume import assert_resumes_after_a_crash_in_end_task
from tiny import tiny_config

from aepg_jax.continual import steps, trainer
from aepg_jax.methods import aper, base, simplecil
from aepg_jax.models import partition, peft, vit


def _config(tmp_path, method, **overrides):
    base = {"method.name": method, "max_steps_per_task": 3, "tensorboard": False}
    return tiny_config(tmp_path / "cache", **{**base, **overrides})


@pytest.mark.slow
def test_simplecil_does_not_depend_on_the_task_split_or_the_loss(tmp_path):
    """Its prototypes are per-class means: after 5 tasks the accuracy over every class is a
    1-task run's, and the loss changes nothing (no task trains)."""
    five = trainer.run(_config(tmp_path, "simplecil", **{"data.num_tasks": 5}), str(tmp_path / "5"))
    one = trainer.run(
        _config(tmp_path, "simplecil", **{"data.num_tasks": 1, "loss.name": "ce"}),
        str(tmp_path / "1"),
    )
    assert five["acc_pooled_T"] == one["A_T"] == one["acc_pooled_T"]
    assert 10.0 < one["A_T"] < 100.0  # a real classifier: better than chance, not trivial
    ce = trainer.run(
        _config(tmp_path, "simplecil", **{"data.num_tasks": 5, "loss.name": "ce"}),
        str(tmp_path / "5ce"),
    )
    assert ce["accuracy_matrix"] == five["accuracy_matrix"]
    assert ce["predictions"]["sha256"] == five["predictions"]["sha256"]  # the same scores


@pytest.mark.slow
def test_aper_adapts_on_task_0_only_and_a_resumed_run_equals_an_uninterrupted_one(
    tmp_path, monkeypatch
):
    """The PEFT leaves move in task 0 and stay after it; a run stopped in task 1's prototype
    pass restarts from task 0's checkpoint and ends exactly as an uninterrupted run."""
    cfg = _config(
        tmp_path,
        "aper",
        **{"data.num_tasks": 3, "optim.peft_freeze_epochs": 0, "model.peft.kind": "adapter",
           "model.peft.adapter_style": "ffn"},
    )  # fmt: skip
    seen = []
    end_task = simplecil.Prototypes.end_task

    def record(self, task, trainable, state, ctx):
        seen.append(jax.tree.map(np.asarray, partition.split(
            trainable, partition.label_params(trainable), (partition.PEFT,))[0]))  # fmt: skip
        return end_task(self, task, trainable, state, ctx)

    monkeypatch.setattr(simplecil.Prototypes, "end_task", record)
    straight = trainer.run(cfg, str(tmp_path / "straight"))
    up = lambda tree: tree["Transformer"]["encoderblock_0"]["adapter"]["up"]["kernel"]
    assert np.any(up(seen[0]))  # adapted in task 0 (the up projection starts at zero)
    for later in seen[1:]:
        assert jax.tree.all(jax.tree.map(np.array_equal, later, seen[0]))
    monkeypatch.undo()

    assert_resumes_after_a_crash_in_end_task(
        simplecil.Prototypes, cfg, tmp_path / "killed", straight, monkeypatch
    )


def test_aper_refuses_a_run_without_a_peft_module():
    cfg = ml_collections.ConfigDict(
        {"method": {"name": "aper"}, "model": {"peft": {"kind": "none"}}}
    )
    (problem,) = aper.Aper.check(cfg)
    assert "model.peft.kind=none" in problem and "\n" not in problem


def test_ffn_adapter_sits_beside_the_mlp_with_relu_and_a_fixed_scale():
    """A block with `adapter_style=ffn` returns `x' + MLP(LN x') + s Up(ReLU(Down x'))`, x' the
    post-attention stream, s = adapter_scale, no scale leaf: the identity at initialisation."""
    cfg = peft.PeftConfig("adapter", (0,), adapter_dim=3, adapter_style="ffn", adapter_scale=0.1)
    block = vit.Encoder1DBlock(2, 32, 0, cfg)
    x = jax.random.normal(jax.random.key(0), (2, 5, 16))
    params = jax.jit(block.init)(jax.random.key(1), x)["params"]
    adapter = params["adapter"]
    assert set(adapter) == {"down", "up"}
    assert sum(a.size for a in jax.tree.leaves(adapter)) == peft.num_params(cfg, 16)

    @jax.jit
    def apply(p):
        out, inter = block.apply(
            {"params": p}, x, capture_intermediates=lambda m, _: m.name == "MlpBlock_0",
            mutable=["intermediates"],
        )  # fmt: skip
        return out, inter["intermediates"]["MlpBlock_0"]["__call__"][0]

    out0, mlp0 = apply(params)
    plain = {k: v for k, v in params.items() if k != "adapter"}
    plain_out = jax.jit(vit.Encoder1DBlock(2, 32, 0, peft.PeftConfig()).apply)({"params": plain}, x)
    np.testing.assert_allclose(out0, plain_out, atol=1e-5)  # Up = 0: the identity
    up = jax.random.normal(jax.random.key(2), (3, 16))
    moved = {**params, "adapter": {**adapter, "up": {**adapter["up"], "kernel": up}}}
    out1, _ = apply(moved)
    x_post = out0 - mlp0  # x' (the block adds MLP(LN x') to it)
    down = adapter["down"]
    expected = 0.1 * jnp.maximum(x_post @ down["kernel"] + down["bias"], 0.0) @ up
    np.testing.assert_allclose(out1 - out0, expected, rtol=1e-4, atol=1e-5)


def test_sgd_is_torch_sgd_with_momentum_and_coupled_weight_decay():
    """Two steps of `optim.optimizer=sgd` against torch.optim.SGD's update written out:
    g' = g + wd p; buf = g' (first), m buf + g' (then); p -= lr buf."""
    cfg = ml_collections.ConfigDict({"optim": dict(
        optimizer="sgd", learning_rate=0.1, momentum=0.9, weight_decay=0.01, b1=0.9, b2=0.999,
        eps=1e-8, lr_schedule="constant", clip_norm=0.0, epochs=2)})  # fmt: skip
    p = {"head": {"task_0": {"kernel": jnp.asarray([[1.0, -2.0]])}}}
    tx = steps.optimizer(cfg, p)
    state = tx.init(p)
    g1, g2 = jnp.asarray([[0.5, 0.25]]), jnp.asarray([[-1.0, 2.0]])
    w, buf = np.asarray([[1.0, -2.0]]), None
    for g in (g1, g2):
        grads = {"head": {"task_0": {"kernel": g}}}
        updates, state = tx.update(grads, state, p)
        p = optax.apply_updates(p, updates)
        d = np.asarray(g) + 0.01 * w
        buf = d if buf is None else 0.9 * buf + d
        w = w - 0.1 * buf
        np.testing.assert_allclose(p["head"]["task_0"]["kernel"], w, rtol=1e-6)


def test_cosine_annealing_is_torchs_per_epoch_schedule():
    rate = steps.cosine_annealing(0.01, 4, steps_per_epoch=3)
    got = [float(rate(jnp.asarray(k))) for k in range(12)]
    want = [0.01 * 0.5 * (1 + np.cos(np.pi * (k // 3) / 4)) for k in range(12)]
    np.testing.assert_allclose(got, want, rtol=1e-6)
    assert got[0] == pytest.approx(0.01) and got[-1] == pytest.approx(
        0.01 * 0.5 * (1 + np.cos(3 * np.pi / 4))
    )


@pytest.mark.slow
def test_prototype_sums_of_a_split_equal_those_of_the_whole(tmp_path):
    """SimpleCIL's end_task over two tasks' batches gives the means of one pass over all of
    them: the prototypes do not depend on how the classes are cut into tasks."""
    cfg = _config(tmp_path, "simplecil")
    cfg.model.update(dict(patch_size=8, image_size=16, depth=1, hidden_size=8, num_heads=2))
    method = simplecil.SimpleCIL(cfg)
    params = vit.init_params(simplecil.plain_model_cfg(cfg.model), jax.random.key(0), (6,))
    frozen = {k: v for k, v in params.items() if k != "head"}
    trainable = {"head": params["head"]}
    rng = np.random.default_rng(0)
    batches = [
        {"image": rng.integers(0, 255, (4, 16, 16, 3), np.uint8),
         "label": jnp.asarray(labels), "mask": jnp.asarray([True, True, True, False])}
        for labels in ([0, 1, 0, 5], [2, 3, 2, 3], [4, 5, 5, 4])
    ]  # fmt: skip
    spec = lambda t: base.TaskSpec(t, 2 * t, 2, 0, (6,))
    ctx = lambda bs: base.TaskContext(None, frozen, lambda: iter(bs))
    state = method.init_state(trainable)
    assert state["proto_sums"].shape == (6, 8)
    split = method.end_task(spec(0), trainable, state, ctx(batches[:1]))
    split = method.end_task(spec(1), trainable, split, ctx(batches[1:]))
    whole = method.end_task(spec(0), trainable, state, ctx(batches))
    np.testing.assert_array_equal(split["proto_counts"], [2, 1, 2, 1, 1, 2])
    np.testing.assert_allclose(split["proto_sums"], whole["proto_sums"], rtol=1e-6)
