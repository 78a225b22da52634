"""Every numeric and enumerated config field is validated: one line naming the field."""

from __future__ import annotations

import pytest

from aepg_jax.config import schema

BAD = [
    ("seed", -1, "seed=-1"),
    ("num_seeds", 0, "num_seeds=0"),
    ("data.label_noise", 1.0, "data.label_noise=1.0"),
    ("data.flip_prob", 1.5, "data.flip_prob=1.5"),
    ("data.crop_scale", (0.8, 0.2), "data.crop_scale=(0.8, 0.2)"),
    ("model.hidden_size", 33, "model.hidden_size=33 must be a multiple of model.num_heads"),
    ("model.image_size", 30, "model.image_size=30 must be a multiple of model.patch_size"),
    ("model.depth", 0, "model.depth=0"),
    ("model.num_channels", 1, "model.num_channels=1"),
    ("model.peft.kind", "ia3", "model.peft.kind='ia3'"),
    ("model.peft.lora_rank", 0, "model.peft.lora_rank=0"),
    ("model.peft.blocks", (0, 9), "model.peft.blocks=(0, 9)"),
    ("model.init", "imagenet", "model.init='imagenet'"),
    ("pretrain.learning_rate", -1.0, "pretrain.learning_rate=-1.0 must be > 0"),
    ("pretrain.epochs", 0, "pretrain.epochs=0"),
    ("pretrain.seed", -3, "pretrain.seed=-3"),
    ("pretrain.dataset", "mnist10", "pretrain.dataset='mnist10'"),
    ("loss.alpha", 1.5, "loss.alpha=1.5"),
    ("loss.gamma", -1.0, "loss.gamma=-1.0"),
    ("loss.smoothing", 1.0, "loss.smoothing=1.0"),
    ("schedule.tau", 0.0, "schedule.tau=0.0"),
    ("optim.learning_rate", 0.0, "optim.learning_rate=0.0"),
    ("optim.b1", 1.0, "optim.b1=1.0 must be in [0, 1)"),
    ("optim.b2", -0.1, "optim.b2=-0.1"),
    ("optim.eps", 0.0, "optim.eps=0.0"),
    ("optim.epochs", 0, "optim.epochs=0"),
    ("optim.peft_freeze_epochs", 99, "optim.peft_freeze_epochs=99"),
    ("optim.lr_schedule", "step", "optim.lr_schedule='step'"),
    ("optim.clip_norm", -1.0, "optim.clip_norm=-1.0"),
    ("optim.batch_size", 0, "optim.batch_size=0"),
    ("eval.batch_size", -8, "eval.batch_size=-8"),
    ("method.name", "ewc", "method.name='ewc'"),
    ("method.lwf_weight", -1.0, "method.lwf_weight=-1.0"),
    ("method.ema_decay", 1.0, "method.ema_decay=1.0"),
]


def _tiny():
    cfg = schema.base_config("vit_tiny")
    cfg.model.update(dict(patch_size=4, hidden_size=32, depth=2, num_heads=2, mlp_dim=64))
    cfg.model.update(dict(image_size=16))
    cfg.model.peft.blocks = (0, 1)
    cfg.data.store_size = 16
    return cfg


def test_the_tiny_config_is_valid():
    schema.validate(_tiny())


@pytest.mark.parametrize("field,value,named", BAD, ids=[b[0] for b in BAD])
def test_a_bad_value_is_one_line_naming_the_field(field, value, named):
    cfg = _tiny()
    *parents, leaf = field.split(".")
    target = cfg
    for p in parents:
        target = target[p]
    target[leaf] = value
    if field.startswith("method.") and field != "method.name":
        cfg.method.name = {"lwf_weight": "lwf", "ema_decay": "lae"}[leaf]
    with pytest.raises(ValueError) as err:
        schema.validate(cfg)
    message = str(err.value)
    assert "\n" not in message and message.startswith("Invalid config: "), message
    assert named in message, message


@pytest.mark.parametrize(
    "method,field,blocks",
    [
        ("inflora", "inflora_blocks", (0, 9)),
        ("l2p", "l2p_blocks", (1, 2)),
        ("coda_prompt", "coda_blocks", (0, 1, 7)),
        ("dualprompt", "dualprompt_g_blocks", (0, 5)),
    ],
)
def test_an_explicit_block_beyond_the_depth_is_refused(method, field, blocks):
    """A block list the user wrote is not cut silently at model.depth (2 here); the method's
    default list (blocks 0-4) still is."""
    cfg = _tiny()
    cfg.method.name = method
    cfg.method.dualprompt_e_blocks = (1,)  # its default (2, 3, 4) has no block of 2
    schema.validate(cfg)  # the other defaults name blocks up to 4: cut, accepted
    cfg.method[field] = blocks
    with pytest.raises(ValueError) as err:
        schema.validate(cfg)
    beyond = tuple(b for b in blocks if b >= 2)
    assert f"method.{field}={blocks} names block(s) {beyond}" in str(err.value)
    assert "model.depth=2" in str(err.value) and "0..1" in str(err.value)


@pytest.mark.parametrize(
    "field,value",
    [
        ("method.dualprompt_pull_weight", float("inf")),
        ("optim.learning_rate", 1e300),  # finite in float64, inf once cast to float32
        ("loss.gamma", float("nan")),
        ("data.crop_ratio", (0.75, float("inf"))),
    ],
)
def test_every_float_field_must_be_finite(field, value):
    cfg = _tiny()
    section, leaf = field.split(".")
    cfg[section][leaf] = value
    with pytest.raises(ValueError) as err:
        schema.validate(cfg)
    assert f"{field}={value!r} must be finite" in str(err.value), str(err.value)


def test_scratch_float_fields_must_be_finite():
    from aepg_jax.scratch import config as scratch_config

    cfg = scratch_config.base_config("resnet_small")
    cfg.optim.learning_rate = 1e300
    with pytest.raises(ValueError, match=r"optim.learning_rate=1e\+300 must be finite"):
        scratch_config.validate(cfg)


def test_a_freeze_as_long_as_the_task_that_never_trains_peft_is_refused():
    """`optim.epochs=1` on a config with `peft_freeze_epochs=1` would train only the head in
    every task after the first: refused in one line naming both fields (what the demo with
    `--config.optim.epochs=1` gets); a method without model.peft modules is not concerned."""
    cfg = _tiny()
    cfg.model.peft.kind = "lora"
    cfg.optim.update(dict(epochs=1, peft_freeze_epochs=1))
    with pytest.raises(ValueError) as err:
        schema.validate(cfg)
    message = str(err.value)
    assert message == (
        "Invalid config: optim.peft_freeze_epochs=1 >= optim.epochs=1: tasks 2..5 would train "
        "only the head (the model.peft modules never train after task 1); set "
        "optim.peft_freeze_epochs below 1 (0: no head-only epochs)."
    )
    cfg.optim.peft_freeze_epochs = 0
    schema.validate(cfg)
    cfg.optim.peft_freeze_epochs = 1
    cfg.model.peft.kind = "none"  # nothing to freeze: a head-only run is what was asked
    schema.validate(cfg)


def test_several_problems_are_one_line_with_one_full_stop_each_gap():
    cfg = _tiny()
    cfg.optim.eps = 0.0
    cfg.loss.gamma = -1.0
    with pytest.raises(ValueError) as err:
        schema.validate(cfg)
    message = str(err.value)
    assert ".;" not in message and not message.endswith("..") and message.endswith(".")
    assert "loss.gamma=-1.0 must be >= 0; " in message


@pytest.mark.parametrize("init", ["random", "pretrained"])
def test_weights_given_to_a_model_that_does_not_load_them_are_refused(tmp_path, init):
    """`--config.model.checkpoint=FILE` without `model.init=augreg` would train on other
    weights: refused in one line naming both fields, not ignored."""
    weights = tmp_path / "weights.npz"
    weights.write_bytes(b"")
    cfg = _tiny()
    cfg.model.init, cfg.model.checkpoint = init, str(weights)
    with pytest.raises(ValueError) as err:
        schema.validate(cfg)
    message = str(err.value)
    assert "\n" not in message, message
    assert f"model.checkpoint={weights} is set but model.init={init!r} does not load it" in message
    assert "--config.model.init=augreg" in message
