"""Tests of the CIFAR ResNet (models/resnet.py), its augmentation and its SGD step
(docs/algorithm.md §9, §16): parameter counts, BatchNorm state, torch inits, lr milestones."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from aepg_jax import losses, schedules
from aepg_jax.data import augment
from aepg_jax.models import resnet
from aepg_jax.scratch import train_step as ts

TINY = resnet.ResNetSpec("bottleneck", (1, 2), 4)  # the same shapes everywhere: eager op cache
CLASSES = 7


@pytest.fixture(scope="module")
def tiny():
    model = resnet.build(TINY, CLASSES)
    variables = resnet.init_seeds(model, jax.random.PRNGKey(0)[None], 8)
    return model, jax.tree.map(lambda x: x[0], variables)


@pytest.mark.parametrize("classes,expected", [(100, 23_705_252), (10, 23_520_842)])
def test_resnet50_parameter_counts(classes, expected):
    """torchvision ResNet-50 with the CIFAR stem; batch statistics not counted (eval_shape)."""
    assert resnet.count_params(resnet.preset("resnet50"), classes) == expected


def test_resnet18_parameter_count():
    assert resnet.count_params(resnet.preset("resnet18"), 10) == 11_173_962


@pytest.mark.parametrize("block", resnet.BLOCKS)
def test_shapes_and_structure(block, tiny):
    spec = resnet.ResNetSpec(block, (1, 2), 4)
    model = resnet.build(spec, CLASSES)
    if block == TINY.block:
        variables = tiny[1]
        out = jax.jit(model.apply)(variables, jnp.ones((3, 8, 8, 3)))
        assert out.shape == (3, CLASSES) and out.dtype == jnp.float32
    else:
        variables = jax.eval_shape(
            functools.partial(resnet.init_variables, model, image_size=8), jax.random.PRNGKey(0)
        )
    params = variables["params"]
    assert params["stem_conv"]["kernel"].shape == (3, 3, 3, 4)  # 3x3 stride-1 CIFAR stem
    assert "bias" not in params["stem_conv"]
    expansion = 4 if block == "bottleneck" else 1
    assert params["head"]["kernel"].shape == (8 * expansion, CLASSES)
    assert "proj_conv" in params["stage1_block0"]  # stride 2: projection shortcut
    assert "proj_conv" not in params["stage1_block1"]  # same shape: identity
    assert set(variables) == {"params", "batch_stats"}


def test_batch_stats_change_in_train_mode_only(tiny):
    model, variables = tiny
    x = jax.random.normal(jax.random.PRNGKey(1), (6, 8, 8, 3)) * 3 + 1
    train = jax.jit(lambda v, x: model.apply(v, x, train=True, mutable=["batch_stats"]))
    test = jax.jit(lambda v, x: model.apply(v, x, train=False, mutable=["batch_stats"]))
    _, updated = train(variables, x)
    before = variables["batch_stats"]["BatchNorm_0"]
    after = updated["batch_stats"]["BatchNorm_0"]
    assert not np.allclose(before["mean"], after["mean"])
    # Eval mode leaves them unchanged and does not depend on the rest of the batch.
    out, same = test(variables, x)
    jax.tree.map(np.testing.assert_array_equal, same["batch_stats"], variables["batch_stats"])
    alone, _ = test(variables, x[:2])
    np.testing.assert_allclose(alone, out[:2], rtol=1e-5, atol=1e-6)
    train_out = train(variables, x)[0]
    train_alone = train(variables, x[:2])[0]
    assert not np.allclose(train_alone, train_out[:2])  # train mode: batch statistics


def test_bn_momentum_is_torch_01():
    x = jax.random.normal(jax.random.PRNGKey(1), (16, 4, 4, 2)) + 2.0
    bn = resnet._norm(train=True)
    variables = bn.init(jax.random.PRNGKey(0), x)
    _, updated = bn.apply(variables, x, mutable=["batch_stats"])
    np.testing.assert_allclose(
        updated["batch_stats"]["mean"], 0.1 * np.mean(np.asarray(x), axis=(0, 1, 2)), rtol=1e-5
    )
    assert bn.epsilon == 1e-5 and bn.momentum == 0.9


def test_torch_default_inits(tiny):
    key = jax.random.PRNGKey(0)
    kernel = np.asarray(resnet.conv_init(key, (3, 3, 128, 128)))
    expected = np.sqrt(2.0 / (3 * 3 * 128))  # kaiming_normal_, fan_out, relu
    assert abs(kernel.std() / expected - 1) < 0.03 and abs(kernel.mean()) < 0.01 * expected
    assert np.abs(kernel).max() > 3.5 * expected  # a normal, not a truncated normal
    bound = 1 / np.sqrt(128)  # nn.Linear: U(-1/sqrt(in), 1/sqrt(in)) for kernel and bias
    dense = np.asarray(resnet.dense_kernel_init(key, (128, 1000)))
    bias = np.asarray(resnet.torch_dense_bias_init(128)(key, (1000,)))
    for w in (dense, bias):
        assert np.abs(w).max() <= bound and np.abs(w).max() > 0.99 * bound
        assert abs(w.std() / (bound / np.sqrt(3)) - 1) < 0.05  # uniform
    # The model uses them: conv kernels fan-out normal, head uniform, BN scale 1 / bias 0.
    params = tiny[1]["params"]
    head = np.asarray(params["head"]["kernel"])
    assert np.abs(head).max() <= 1 / np.sqrt(head.shape[0])
    assert np.abs(params["head"]["bias"]).max() <= 1 / np.sqrt(head.shape[0])
    bn = params["stage1_block0"]["BatchNorm_0"]
    np.testing.assert_array_equal(bn["scale"], 1.0)
    np.testing.assert_array_equal(bn["bias"], 0.0)


def test_random_crop_padded_is_a_shifted_window_of_the_zero_padded_image():
    images = jnp.arange(2 * 5 * 5 * 1, dtype=jnp.int32).reshape(2, 5, 5, 1) + 1
    key = jax.random.PRNGKey(3)
    out = np.asarray(augment.random_crop_padded(key, images, 2))
    offsets = np.asarray(jax.random.randint(key, (2, 2), 0, 5))
    padded = np.pad(np.asarray(images), ((0, 0), (2, 2), (2, 2), (0, 0)))
    for b, (dy, dx) in enumerate(offsets):
        np.testing.assert_array_equal(out[b], padded[b, dy : dy + 5, dx : dx + 5])
    np.testing.assert_array_equal(augment.random_crop_padded(key, images, 0), images)
    many = augment.random_crop_padded(key, jnp.ones((400, 4, 4, 1)), 1)
    assert 0 < float(jnp.mean(many == 0)) < 0.5  # some shifts bring in zero padding


def test_standardize_per_channel():
    x = jnp.full((1, 2, 2, 3), 255, jnp.uint8)
    out = augment.standardize(x, (0.5, 0.0, 1.0), (0.5, 1.0, 2.0))
    np.testing.assert_allclose(out[0, 0, 0], [1.0, 1.0, 0.0])
    with pytest.raises(ValueError, match="one per channel"):
        augment.standardize(x, (0.5,), (0.5,))


def test_lr_drops_tenfold_at_the_epoch_milestones():
    _, lr = ts.make_optimizer(0.1, 0.9, False, 0.0, (150, 225), 0.1, steps_per_epoch=195)
    for step, want in [(0, 0.1), (150 * 195 - 1, 0.1), (150 * 195, 0.01), (225 * 195 - 1, 0.01)]:
        assert float(lr(step)) == pytest.approx(want)
    assert float(lr(225 * 195)) == pytest.approx(0.001)
    assert float(lr(350 * 195)) == pytest.approx(0.001)


def test_sgd_is_torch_sgd_with_momentum_and_weight_decay():
    """torch: g' = g + wd p; v = m v + g'; p -= lr v (v_1 = g'_1)."""
    tx, _ = ts.make_optimizer(0.1, 0.9, False, 0.01, (1,), 0.1, steps_per_epoch=2)
    p, v = np.array([1.0, -2.0]), np.zeros(2)
    params = jnp.asarray(p)
    state = tx.init(params)
    for t, g in enumerate([np.array([0.5, 1.0]), np.array([-1.0, 0.25]), np.array([2.0, 0.0])]):
        lr = 0.1 if t < 2 else 0.01
        g_wd = g + 0.01 * p
        v = 0.9 * v + g_wd
        p = p - lr * v
        updates, state = tx.update(jnp.asarray(g), state, params)
        params = optax.apply_updates(params, updates)
        np.testing.assert_allclose(params, p, rtol=1e-6)


def test_train_step_updates_batch_stats_and_reports_sums(tiny):
    model, variables = tiny
    tx, lr = ts.make_optimizer(0.1, 0.9, False, 0.0, (1,), 0.1, steps_per_epoch=4)
    state = ts.TrainState(
        variables["params"],
        variables["batch_stats"],
        tx.init(variables["params"]),
        jnp.zeros([], jnp.int32),
        jax.random.PRNGKey(1),
    )
    step = ts.make_train_step(
        model.apply,
        losses.get_loss("mix", alpha=0.2),
        False,
        schedules.constant(1.0),
        tx,
        lr,
        ts.AugmentConfig(pad=1, flip_prob=0.5, mean=(0.5,) * 3, std=(0.25,) * 3),
    )
    batch = {
        "image": jax.random.randint(jax.random.PRNGKey(2), (6, 8, 8, 3), 0, 256).astype(jnp.uint8),
        "label": jnp.array([0, 1, 2, 3, 4, 6], jnp.int32),
    }
    new, metrics = jax.jit(step)(state, batch)
    assert int(new.step) == 1 and float(metrics["lr"]) == pytest.approx(0.1)
    assert 0 <= int(metrics["correct"]) <= 6
    assert 0 < float(metrics["entropy_sum"]) <= 6 * np.log(CLASSES) + 1e-4
    changed = jax.tree.map(lambda a, b: not np.allclose(a, b), state.batch_stats, new.batch_stats)
    assert all(jax.tree.leaves(changed))
