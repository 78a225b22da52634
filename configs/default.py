"""Embedded default: runs offline on a 2-core CPU in a few minutes.

A tiny ViT (patch 7, width 64, depth 4, 28 px), pretrained on Fashion-MNIST by
`aepg_jax/pretraining/pretrain.py` (the backbone ships with the package, fingerprint checked:
nothing is pretrained; `scripts/make_shipped_backbone.py` regenerates it,
`pretrain.shipped=False` pretrains locally), learns scikit-learn's digits class-incrementally
(5 tasks x 2 classes) with LoRA + aEPG + LAE, and prints A_T and the accuracy matrix. Changing
a `model.*` architecture, `pretrain.*` or `input.normalize` field means another backbone,
pretrained locally (needs Fashion-MNIST).

    .venv/bin/python -m aepg_jax.main --config=configs/default.py --workdir=runs/default
"""

from aepg_jax.config import schema


def get_config():
    c = schema.base_config("vit_tiny")
    c.data.source = "digits"
    c.data.num_tasks = 5
    c.data.store_size = 28
    c.data.crop_scale = (0.8, 1.0)  # 8x8 digits upsampled to 28 px: keep most of the digit
    c.data.flip_prob = 0.0  # mirrored digits are other digits
    c.model.init = "pretrained"
    c.model.peft.kind = "lora"
    c.pretrain.dataset = "fashion_mnist"
    c.pretrain.epochs = 2
    c.loss.name = "aepg"
    c.method.name = "lae"
    c.optim.batch_size = 32
    c.optim.learning_rate = 1e-3
    c.optim.epochs = 20
    c.optim.peft_freeze_epochs = 8
    c.eval.batch_size = 128
    c.log_every_steps = 10
    return c
