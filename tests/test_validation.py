"""Every numeric and enumerated config field is validated: one line naming the field."""

from __future__ import annotations

import pytest

from aepg_jax import config_lib

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
    cfg = config_lib.base_config("vit_tiny")
    cfg.model.update(dict(patch_size=4, hidden_size=32, depth=2, num_heads=2, mlp_dim=64))
    cfg.model.update(dict(image_size=16))
    cfg.model.peft.blocks = (0, 1)
    cfg.data.store_size = 16
    return cfg


def test_the_tiny_config_is_valid():
    config_lib.validate(_tiny())


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
        config_lib.validate(cfg)
    message = str(err.value)
    assert "\n" not in message and message.startswith("Invalid config: "), message
    assert named in message, message
