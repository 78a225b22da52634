"""The checks behind `schema.validate`: each appends one line per impossible value, naming
the field and what to change, to the list `p` it is given. (Imports nothing of schema,
which imports this module.)"""

from __future__ import annotations

import math

import ml_collections
import numpy as np

from aepg_jax import losses, schedules
from aepg_jax.checkpoints import catalog
from aepg_jax.data import augment, datasets, splits
from aepg_jax.models import peft as peft_lib
from aepg_jax.models import vit

MODEL_INITS = ("random", "augreg", "pretrained")
NORMALIZE = augment.NORMALIZE_MODES
LR_SCHEDULES = ("constant", "cosine_epochs", "cosine_annealing", "multistep")
OPTIMIZERS = ("adam", "sgd")


def trains_model_peft(cfg: ml_collections.ConfigDict) -> bool:
    """Whether the run trains `model.peft` modules (a PEFT kind, and a method that uses them)."""
    from aepg_jax import methods

    method = methods.REGISTRY.get(cfg.method.name)
    return cfg.model.peft.kind != "none" and method is not None and method.uses_model_peft


def joined(problems: list[str]) -> str:
    """`Invalid config: <problem>; <problem>.`: the problems in one line, one full stop."""
    return "Invalid config: " + "; ".join(q.rstrip(" .") for q in problems) + "."


def check(condition: bool, message: str, problems: list[str]) -> None:
    if not condition:
        problems.append(message)


def is_int(x) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)


# The parameters and losses are float32: a float field beyond this overflows when cast.
FLOAT32_MAX = float(np.finfo(np.float32).max)


def float_problems(cfg: ml_collections.ConfigDict, p: list[str], prefix: str = "") -> None:
    """Every float field (and float in a tuple field) must be finite and within float32's
    range: inf or nan would pass the range checks below (`inf > 0`) and surface later as a
    NaN stop that names another field."""
    for key, value in cfg.items():
        name = f"{prefix}{key}"
        if isinstance(value, ml_collections.ConfigDict):
            float_problems(value, p, f"{name}.")
            continue
        items = value if isinstance(value, tuple | list) else (value,)
        bad = [
            x
            for x in items
            if isinstance(x, float) and not (math.isfinite(x) and abs(x) <= FLOAT32_MAX)
        ]
        check(
            not bad,
            f"{name}={value!r} must be finite and at most {FLOAT32_MAX:.3g} in size (float32).",
            p,
        )


def positive_ints(fields: dict[str, object], p: list[str]) -> None:
    for name, value in fields.items():
        check(is_int(value) and value >= 1, f"{name}={value!r} must be an integer >= 1.", p)


def seeds(fields: dict[str, object], p: list[str]) -> None:
    for name, value in fields.items():
        check(
            value is None or (is_int(value) and value >= 0),
            f"{name}={value!r} must be an integer >= 0.",
            p,
        )


def data_problems(cfg: ml_collections.ConfigDict, p: list[str]) -> None:
    d = cfg.data
    p.extend(datasets.config_problems(d))
    positive_ints({"num_seeds": cfg.num_seeds, "data.num_tasks": d.num_tasks}, p)
    positive_ints({"data.store_size": d.store_size}, p)
    seeds(
        {
            "seed": cfg.seed,
            "data.split_seed": d.split_seed,
            "data.class_order_seed": d.class_order_seed,
            "data.noise_seed": d.noise_seed,
        },
        p,
    )
    check(0.0 <= d.label_noise < 1.0, f"data.label_noise={d.label_noise} must be in [0, 1).", p)
    check(
        d.scenario in splits.SCENARIOS,
        f"data.scenario={d.scenario!r} is unknown; use one of {', '.join(splits.SCENARIOS)}.",
        p,
    )
    check(
        d.class_order_rng in splits.CLASS_ORDER_RNGS,
        f"data.class_order_rng={d.class_order_rng!r} is unknown; use one of "
        f"{', '.join(splits.CLASS_ORDER_RNGS)}.",
        p,
    )
    check(
        cfg.input.normalize in NORMALIZE,
        f"input.normalize={cfg.input.normalize!r}: use one of {NORMALIZE}.",
        p,
    )
    check(
        d.store_size >= cfg.model.image_size,
        f"data.store_size={d.store_size} must be >= model.image_size={cfg.model.image_size}.",
        p,
    )
    for name in ("crop_scale", "crop_ratio"):
        lo, hi = d[name]
        check(0 < lo <= hi, f"data.{name}={tuple(d[name])} must satisfy 0 < lo <= hi.", p)
    check(d.crop_scale[1] <= 1.0, f"data.crop_scale={tuple(d.crop_scale)}: hi must be <= 1.", p)
    check(0.0 <= d.flip_prob <= 1.0, f"data.flip_prob={d.flip_prob} must be in [0, 1].", p)


def model_problems(cfg: ml_collections.ConfigDict, p: list[str]) -> None:
    m = cfg.model
    positive_ints(
        {f"model.{k}": m[k] for k in vit.ARCH_FIELDS},
        p,
    )
    if is_int(m.hidden_size) and is_int(m.num_heads) and m.num_heads >= 1:
        check(
            m.hidden_size % m.num_heads == 0,
            f"model.hidden_size={m.hidden_size} must be a multiple of "
            f"model.num_heads={m.num_heads}.",
            p,
        )
    if is_int(m.image_size) and is_int(m.patch_size) and m.patch_size >= 1:
        check(
            m.image_size % m.patch_size == 0,
            f"model.image_size={m.image_size} must be a multiple of "
            f"model.patch_size={m.patch_size}.",
            p,
        )
    check(m.num_channels == 3, f"model.num_channels={m.num_channels}: images are RGB, use 3.", p)
    check(
        m.peft.kind in peft_lib.PEFT_KINDS,
        f"model.peft.kind={m.peft.kind!r}: use one of {peft_lib.PEFT_KINDS}.",
        p,
    )
    positive_ints(
        {f"model.peft.{k}": m.peft[k] for k in ("lora_rank", "adapter_dim", "prefix_length")}, p
    )
    check(
        m.peft.get("adapter_style", "attn") in peft_lib.ADAPTER_STYLES,
        f"model.peft.adapter_style={m.peft.get('adapter_style')!r}: use one of "
        f"{peft_lib.ADAPTER_STYLES}.",
        p,
    )
    bad_blocks = [b for b in m.peft.blocks if not (is_int(b) and 0 <= b < m.depth)]
    check(
        not bad_blocks,
        f"model.peft.blocks={tuple(m.peft.blocks)}: blocks must be in [0, model.depth={m.depth}).",
        p,
    )
    check(
        m.dtype in vit.COMPUTE_DTYPES,
        f"model.dtype={m.dtype!r}: use one of {tuple(vit.COMPUTE_DTYPES)}.",
        p,
    )
    check(m.init in MODEL_INITS, f"model.init={m.init!r}: use one of {MODEL_INITS}.", p)
    check(
        not (m.checkpoint and m.init in ("random", "pretrained")),
        f"model.checkpoint={m.checkpoint} is set but model.init={m.init!r} does not load it; "
        "add --config.model.init=augreg to start from those weights, or drop model.checkpoint.",
        p,
    )
    family = m.family
    check(
        family in vit.FAMILIES,
        f"model.family={family!r}: use one of {tuple(vit.FAMILIES)}.",
        p,
    )
    name = m.weights
    if name is None:
        return
    if name not in catalog.WEIGHTS:
        p.append(f"model.weights={name!r} is unknown; use one of {', '.join(catalog.WEIGHTS)}.")
        return
    w = catalog.WEIGHTS[name]
    check(
        family == w.family,
        f"model.weights={name} is a {w.family}-family backbone, model.family={family}: set "
        f"model.family={w.family}.",
        p,
    )
    check(
        m.init == "augreg",
        f"model.weights={name} is loaded with model.init=augreg (model.init={m.init}).",
        p,
    )


def pretrain_problems(cfg: ml_collections.ConfigDict, p: list[str]) -> None:
    t = cfg.pretrain
    check(
        t.dataset in datasets.SOURCES,
        f"pretrain.dataset={t.dataset!r} is unknown; use one of {', '.join(datasets.SOURCES)}.",
        p,
    )
    positive_ints({"pretrain.epochs": t.epochs, "pretrain.batch_size": t.batch_size}, p)
    check(t.learning_rate > 0, f"pretrain.learning_rate={t.learning_rate} must be > 0.", p)
    seeds({"pretrain.seed": t.seed}, p)


def training_problems(cfg: ml_collections.ConfigDict, num_devices: int, p: list[str]) -> None:
    o = cfg.optim
    try:
        losses.get_loss(cfg.loss.name, **losses.config_hyperparameters(cfg.loss))
    except ValueError as err:
        p.append(f"loss: {err}")
    check(0.0 <= cfg.loss.alpha <= 1.0, f"loss.alpha={cfg.loss.alpha} must be in [0, 1].", p)
    check(cfg.loss.gamma >= 0, f"loss.gamma={cfg.loss.gamma} must be >= 0.", p)
    check(
        0.0 <= cfg.loss.smoothing < 1.0,
        f"loss.smoothing={cfg.loss.smoothing} must be in [0, 1).",
        p,
    )
    check(cfg.schedule.tau > 0, f"schedule.tau={cfg.schedule.tau} must be > 0.", p)
    try:
        if cfg.schedule.tau > 0:  # else named above
            schedules.get_schedule(
                cfg.schedule.name, 1, **schedules.config_hyperparameters(cfg.schedule)
            )
    except (ValueError, TypeError) as err:
        p.append(f"schedule: {err}")
    check(o.learning_rate > 0, f"optim.learning_rate={o.learning_rate} must be > 0.", p)
    for name in ("b1", "b2"):
        check(0.0 <= o[name] < 1.0, f"optim.{name}={o[name]} must be in [0, 1).", p)
    check(o.eps > 0, f"optim.eps={o.eps} must be > 0.", p)
    check(
        o.lr_schedule in LR_SCHEDULES,
        f"optim.lr_schedule={o.lr_schedule!r} is unknown; use one of {', '.join(LR_SCHEDULES)}.",
        p,
    )
    check(
        o.get("optimizer", "adam") in OPTIMIZERS,
        f"optim.optimizer={o.optimizer!r} is unknown; use one of {', '.join(OPTIMIZERS)}.",
        p,
    )
    check(
        0.0 <= o.get("momentum", 0.9) < 1.0,
        f"optim.momentum={o.get('momentum')} must be in [0, 1).",
        p,
    )
    check(
        o.get("weight_decay", 0.0) >= 0,
        f"optim.weight_decay={o.get('weight_decay')} must be >= 0.",
        p,
    )
    check(o.clip_norm >= 0, f"optim.clip_norm={o.clip_norm} must be >= 0 (0: no clipping).", p)
    positive_ints({"optim.epochs": o.epochs, "optim.steps_per_call": o.steps_per_call}, p)
    check(
        0 <= o.peft_freeze_epochs <= o.epochs,
        f"optim.peft_freeze_epochs={o.peft_freeze_epochs} must be in [0, optim.epochs].",
        p,
    )
    if 0 < o.epochs <= o.peft_freeze_epochs and trains_model_peft(cfg) and cfg.data.num_tasks > 1:
        p.append(
            f"optim.peft_freeze_epochs={o.peft_freeze_epochs} >= optim.epochs={o.epochs}: "
            f"tasks 2..{cfg.data.num_tasks} would train only the head (the model.peft modules "
            f"never train after task 1); set optim.peft_freeze_epochs below {o.epochs} "
            "(0: no head-only epochs)"
        )
    for name, batch in (
        ("optim.batch_size", o.batch_size),
        ("eval.batch_size", cfg.eval.batch_size),
    ):
        check(
            is_int(batch) and batch > 0 and batch % num_devices == 0,
            f"{name}={batch} must be a positive multiple of the {num_devices} device(s).",
            p,
        )
