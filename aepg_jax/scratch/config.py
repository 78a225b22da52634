"""The config of a train-from-scratch run (paper Table 4, docs/algorithm.md §9): fields,
defaults, checks.

Fields (defaults in brackets; docs/algorithm.md §9, §16):

  trainer [scratch]            selects this trainer in `aepg_jax.main`
  seed [0] / num_seeds [1]     S > 1: seeds seed..seed+S-1 as one vmapped program; per seed
                               results in <workdir>/seed_<s>/, mean +- std in results_seeds.json
  data.source [tfds]           tfds | fashion_mnist | digits (data/datasets.py)
  data.name [cifar100]         TFDS name (cifar10 | cifar100 | fashion_mnist)
  data.data_dir [None]         TFDS data dir, or the Fashion-MNIST IDX dir
  data.split_seed [0]          digits' 80/20 split
  data.cache_dir [~/.cache/aepg_jax] / data.verify_cache [False]
  data.image_size [32]         stored and model input side (images are not rescaled by the
                               augmentation: RandomCrop keeps the size)
  data.pad [4]                 RandomCrop(image_size, padding=pad), zero padding
  data.flip_prob [0.5]         horizontal flip probability
  data.mean / data.std [None]  per-channel normalisation in [0, 1] units; None: computed from
                               the training split (CIFAR-10: .4914 .4822 .4465 / .2470 .2435 .2616)
  data.max_train_examples [None]  use only the first N training examples (CPU demos)
  model.preset [resnet50]      resnet50 | resnet18 | resnet_small (models/resnet.py); the
  model.block / model.stage_sizes / model.width   fields it sets (override for tiny tests)
  loss.*                       as config.schema: name [mix], alpha [0.2], gamma, smoothing, beta
  schedule.*                   alpha_t of `aepg` over the whole run (name [sigmoid], tau, alpha)
  optim.learning_rate [0.1] / optim.momentum [0.9] / optim.nesterov [False]
  optim.weight_decay [0.0]     L2 added to the gradient before momentum (torch SGD)
  optim.milestones [(150, 225)]  epochs after which lr is multiplied by optim.lr_decay [0.1]
  optim.batch_size [256]       global batch; the last partial batch of an epoch is dropped
  optim.epochs [350]
  eval.batch_size [1000]
  log_every_steps [50] / checkpoint_every_epochs [10] (and always after the last epoch)
  checkpoint_every_minutes [30.0]  also a checkpoint inside an epoch once this much wall time has
                               passed since the last (what a SIGKILL without warning can lose;
                               Ctrl-C, SIGTERM, SIGUSR1 checkpoint at once); 0: off
  tensorboard [True]           also write metrics.jsonl's numbers and the config as TensorBoard
                               event files in the workdir; False: metrics.jsonl only
  max_steps_per_epoch [None]   cap on steps per epoch (smoke tests)
  distributed [False]          call jax.distributed.initialize() (multi-host)
  compile_cache [~/.cache/aepg_jax/xla]  JAX's persistent compilation cache ("" turns it
                               off; AEPG_COMPILE_CACHE overrides it): as the continual schema's
"""

from __future__ import annotations

import ml_collections
from ml_collections import config_dict

from aepg_jax import losses, schedules
from aepg_jax.config import schema, validation
from aepg_jax.config.validation import check
from aepg_jax.data import datasets
from aepg_jax.models import resnet


def base_config(preset: str = "resnet50") -> ml_collections.ConfigDict:
    """Every field with its default (see the module docstring)."""
    c = ml_collections.ConfigDict()
    c.trainer = "scratch"
    c.seed = 0
    c.num_seeds = 1
    c.data = dict(
        source="tfds",
        name="cifar100",
        data_dir=config_dict.placeholder(str),
        split_seed=0,
        cache_dir="~/.cache/aepg_jax",
        verify_cache=False,
        image_size=32,
        pad=4,
        flip_prob=0.5,
        mean=config_dict.placeholder(tuple),
        std=config_dict.placeholder(tuple),
        max_train_examples=config_dict.placeholder(int),
    )
    spec = resnet.preset(preset)
    c.model = dict(preset=preset, block=spec.block, stage_sizes=spec.stage_sizes, width=spec.width)
    c.loss = dict(
        name="mix", gamma=1.0, smoothing=0.05, beta=config_dict.placeholder(float), alpha=0.2
    )
    c.schedule = dict(name="sigmoid", tau=6.0, alpha=1.0)
    c.optim = dict(
        learning_rate=0.1,
        momentum=0.9,
        nesterov=False,
        weight_decay=0.0,
        milestones=(150, 225),
        lr_decay=0.1,
        batch_size=256,
        epochs=350,
    )
    c.eval = dict(batch_size=1000)
    c.log_every_steps = 50
    c.checkpoint_every_epochs = 10
    c.checkpoint_every_minutes = 30.0
    c.tensorboard = True
    c.max_steps_per_epoch = config_dict.placeholder(int)
    c.distributed = False
    c.compile_cache = "~/.cache/aepg_jax/xla"  # system/xla_cache.py DEFAULT
    return c


def validate(cfg: ml_collections.ConfigDict, num_devices: int = 1) -> None:
    """Raises ValueError listing every impossible value, each naming its field and a fix."""
    p: list[str] = []
    d, m, o = cfg.data, cfg.model, cfg.optim
    check(cfg.trainer == "scratch", f"trainer={cfg.trainer!r}: this config is 'scratch'.", p)
    check(cfg.num_seeds >= 1, f"num_seeds={cfg.num_seeds} must be >= 1.", p)
    validation.float_problems(cfg, p)
    p.extend(datasets.config_problems(d, "scratch"))
    check(d.image_size >= 1, f"data.image_size={d.image_size} must be >= 1.", p)
    check(d.pad >= 0, f"data.pad={d.pad} must be >= 0 (0: no random crop).", p)
    check(0.0 <= d.flip_prob <= 1.0, f"data.flip_prob={d.flip_prob} must be in [0, 1].", p)
    for name in ("mean", "std"):
        v = d[name]
        check(
            v is None or len(v) == 3,
            f"data.{name}={v} must be unset (computed from the data) or 3 per-channel values.",
            p,
        )
    check(d.std is None or all(s > 0 for s in d.std), f"data.std={d.std} must be > 0.", p)
    check(
        d.max_train_examples is None or d.max_train_examples >= 1,
        "data.max_train_examples must be unset or >= 1.",
        p,
    )
    check(m.block in resnet.BLOCKS, f"model.block={m.block!r}: use one of {resnet.BLOCKS}.", p)
    check(
        len(m.stage_sizes) >= 1 and all(n >= 1 for n in m.stage_sizes),
        f"model.stage_sizes={tuple(m.stage_sizes)} must be one or more block counts >= 1.",
        p,
    )
    check(m.width >= 1, f"model.width={m.width} must be >= 1.", p)
    try:
        losses.get_loss(cfg.loss.name, **schema.loss_kwargs(cfg))
    except ValueError as err:
        p.append(f"loss: {err}")
    try:
        schedules.get_schedule(cfg.schedule.name, 1, **schema.schedule_kwargs(cfg))
    except (ValueError, TypeError) as err:
        p.append(f"schedule: {err}")
    check(o.learning_rate > 0, f"optim.learning_rate={o.learning_rate} must be > 0.", p)
    check(0.0 <= o.momentum < 1.0, f"optim.momentum={o.momentum} must be in [0, 1).", p)
    check(o.weight_decay >= 0, f"optim.weight_decay={o.weight_decay} must be >= 0.", p)
    check(0 < o.lr_decay <= 1, f"optim.lr_decay={o.lr_decay} must be in (0, 1].", p)
    check(o.epochs >= 1, f"optim.epochs={o.epochs} must be >= 1.", p)
    ms = tuple(o.milestones)
    check(
        all(isinstance(e, int) and e >= 1 for e in ms) and list(ms) == sorted(set(ms)),
        f"optim.milestones={ms} must be increasing epochs >= 1, e.g. (150, 225).",
        p,
    )
    for name, batch in (
        ("optim.batch_size", o.batch_size),
        ("eval.batch_size", cfg.eval.batch_size),
    ):
        check(
            batch > 0 and batch % num_devices == 0,
            f"{name}={batch} must be a positive multiple of the {num_devices} device(s).",
            p,
        )
    check(cfg.log_every_steps >= 1, f"log_every_steps={cfg.log_every_steps} must be >= 1.", p)
    check(
        cfg.checkpoint_every_epochs >= 1,
        f"checkpoint_every_epochs={cfg.checkpoint_every_epochs} must be >= 1.",
        p,
    )
    check(
        cfg.checkpoint_every_minutes >= 0,
        f"checkpoint_every_minutes={cfg.checkpoint_every_minutes} must be >= 0 (0: off).",
        p,
    )
    check(
        cfg.max_steps_per_epoch is None or cfg.max_steps_per_epoch >= 1,
        "max_steps_per_epoch must be unset or >= 1.",
        p,
    )
    if p:
        raise ValueError(validation.joined(p))


def resnet_spec(cfg: ml_collections.ConfigDict) -> resnet.ResNetSpec:
    m = cfg.model
    return resnet.ResNetSpec(m.block, tuple(m.stage_sizes), m.width)
