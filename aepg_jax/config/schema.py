"""The run configuration: every field, its default beside what it means, and its validation.

Config files in `configs/` start from `base_config()` and override fields; the driver locks
the result, applies `--config.a.b=value` overrides and calls `validate` before anything runs.
Where each default comes from: docs/algorithm.md §1-§7 and §10-§15. `describe()` lists every
field with its default and meaning: `python -m aepg_jax.main --help` prints it and
configs/README.md holds it as a table (`describe(markdown=True)`).
"""

from __future__ import annotations

import importlib.util
import os
from typing import Any

import ml_collections
from ml_collections import config_dict

from aepg_jax import losses, methods, schedules
from aepg_jax.config import input_files, validation
from aepg_jax.models import head, vit

# (field, default, meaning) of every field `base_config` sets; a type as the default: unset
# (None), of that type. The other model.* fields are the preset's (`vit.model_config`), the
# other method.* fields each method's own (its module's `defaults`).
FIELDS: tuple[tuple[str, Any, str], ...] = (
    ("trainer", "continual", "continual (this schema) | scratch (train from scratch: "
     "scratch/config.py)"),
    ("seed", 0, "every random choice of the run (PEFT and head init, data order, augmentation, "
     "a random backbone) derives from it"),
    ("num_seeds", 1, "S > 1: seeds seed..seed+S-1 as one program (jax.vmap); per seed in "
     "<workdir>/seed_<s>/, mean +- std in results_seeds.json"),
    ("data.source", "digits", "digits | digits_domains | fashion_mnist | folder | tfds "
     "(data/datasets.py)"),
    ("data.name", str, "TFDS name, or a label for a folder dataset's cache"),
    ("data.data_dir", str, "TFDS data dir, image-folder root, or Fashion-MNIST IDX dir"),
    ("data.split_seed", 0, "stratified 80/20 train/test split of digits and plain folders"),
    ("data.split_file", str, "source=folder: JSON train/test lists of <class>/<file> paths "
     "fixing the split and its order (ImageNet-R: what `python -m aepg_jax.prepare` writes)"),
    ("data.cache_dir", "~/.cache/aepg_jax", "where decoded uint8 caches live"),
    ("data.store_size", 256, "cache resolution (side of the stored square images)"),
    ("data.verify_cache", False, "re-hash cached images on load"),
    ("data.num_tasks", 5, "tasks the classes are cut into (np.array_split); scenario=domain: "
     "the dataset's number of domains"),
    ("data.scenario", "class", "class: each task new classes (docs/algorithm.md §4) | domain: "
     "task t = domain t, all classes, one head (§17; InfLoRA refused)"),
    ("data.class_order_seed", int, "None: identity class order; int: a permutation from it"),
    ("data.class_order_rng", "default", "default (np.random.default_rng) | numpy_legacy "
     "(np.random.seed; permutation: PyCIL's and PILOT's, seed 1993)"),
    ("data.label_noise", 0.0, "symmetric within-task label noise rate on training labels"),
    ("data.noise_seed", 0, "seed of the label noise"),
    ("data.crop_scale", (0.05, 1.0), "RandomResizedCrop's scale range"),
    ("data.crop_ratio", (3 / 4, 4 / 3), "RandomResizedCrop's aspect-ratio range"),
    ("data.flip_prob", 0.5, "horizontal flip probability"),
    ("input.normalize", "minus_one_one", "minus_one_one ([-1, 1], augreg) | none ([0, 1], "
     "LAE's) | imagenet | clip (mean and std: data/augment.py MEAN_STD)"),
    ("model.preset", "vit_b16", "the preset the model fields came from (informational)"),
    ("model.init", "random", "random | augreg (load model.checkpoint) | pretrained "
     "(pretrain.*)"),
    ("model.checkpoint", str, "pretrained weights: an augreg .npz, a timm .safetensors file "
     "or hf-hub:<repo> from the local Hugging Face cache (docs/data.md); keys and shapes "
     "checked at validation"),
    ("model.weights", str, "a published backbone by name (checkpoints/catalog.py WEIGHTS), "
     "never downloaded; results.json records its name and sha256"),
    ("pretrain.dataset", "fashion_mnist", "source pretraining a small backbone "
     "(model.init=pretrained)"),
    ("pretrain.data_dir", str, "the pretraining source's data_dir"),
    ("pretrain.epochs", 2, "pretraining epochs"),
    ("pretrain.batch_size", 128, "pretraining batch"),
    ("pretrain.learning_rate", 1e-3, "pretraining learning rate"),
    ("pretrain.seed", 0, "seed of pretraining: one backbone for every run seed"),
    ("pretrain.cache_dir", "~/.cache/aepg_jax/pretrained", "trained backbones, reused across "
     "runs"),
    ("pretrain.shipped", True, "use the package's backbone when one was shipped for these "
     "settings (fingerprint checked); False pretrains locally"),
    ("loss.name", "aepg", "ce | epg | aepg | mix | focal | label_smoothing | "
     "confidence_penalty | entropy_penalty (losses.py)"),
    ("loss.gamma", 1.0, "focal's gamma"),
    ("loss.smoothing", 0.05, "label_smoothing's rate"),
    ("loss.beta", float, "the penalty losses' weight (None: the loss's default)"),
    ("loss.alpha", 0.5, "mix's weight"),
    ("schedule.name", "sigmoid", "sigmoid | linear | cosine | constant: alpha_t of aepg"),
    ("schedule.tau", 6.0, "the sigmoid's temperature"),
    ("schedule.alpha", 1.0, "constant's alpha"),
    ("optim.learning_rate", 5e-4, "peak learning rate"),
    ("optim.b1", 0.9, "Adam's b1"),
    ("optim.b2", 0.999, "Adam's b2"),
    ("optim.eps", 1e-8, "Adam's eps"),
    ("optim.batch_size", 256, "global batch (a multiple of the device count)"),
    ("optim.epochs", 50, "epochs per task"),
    ("optim.peft_freeze_epochs", 30, "head-only epochs at the start of tasks >= 1"),
    ("optim.lr_schedule", "constant", "constant | cosine_annealing (torch's CosineAnnealingLR "
     "per epoch) | cosine_epochs (lr cos(99 pi k / (200 (E - 1))), k = max(e - 1, 0): CODA-P's "
     "and InfLoRA's) | multistep (torch's MultiStepLR per epoch)"),
    ("optim.clip_norm", 0.0, "> 0: clip the gradient's global norm to this (torch's "
     "clip_grad_norm_); 0: off"),
    ("optim.steps_per_call", 1, "> 1: the task's data on the device, this many steps as one "
     "jitted lax.scan"),
    ("optim.optimizer", "adam", "adam | sgd (torch's, with optim.momentum)"),
    ("optim.momentum", 0.9, "SGD's momentum"),
    ("optim.weight_decay", 0.0, "> 0: wd * param added to every trainable gradient (torch's "
     "coupled weight_decay)"),
    ("optim.lr_milestones", (), "multistep's epochs"),
    ("optim.lr_decay", 0.1, "multistep's factor"),
    ("method.name", "plain", "the continual method (methods/, one module each: "
     "docs/registries.md)"),
    ("method.head_init", methods.OFFICIAL_HEAD_INIT, "how every method's task heads start: "
     "official (each method's code's, docs/algorithm.md §18) | normal | uniform | linear | "
     "trunc_normal"),
    ("eval.batch_size", 256, "evaluation batch"),
    ("log_every_steps", 50, "steps between train records in metrics.jsonl"),
    ("checkpoint_every_steps", 0, "steps between checkpoints (0: only after each task)"),
    ("checkpoint_every_minutes", 30.0, "also a checkpoint inside a task after this much wall "
     "time (0: off; signals checkpoint at once: docs/running.md)"),
    ("tensorboard", True, "also write TensorBoard event files in the workdir"),
    ("max_steps_per_task", int, "cap on steps per task (smoke tests)"),
    ("distributed", False, "call jax.distributed.initialize() (multi-host)"),
    ("compile_cache", "~/.cache/aepg_jax/xla", "JAX's persistent compilation cache (\"\": "
     "off; AEPG_COMPILE_CACHE overrides it; docs/performance.md)"),
)  # fmt: skip


def base_config(preset: str = "vit_b16") -> ml_collections.ConfigDict:
    """All fields with their defaults: `FIELDS`, the preset's model and every method's own."""
    c = ml_collections.ConfigDict()
    for name, default, _ in FIELDS:  # in FIELDS' order, which to_json keeps
        section, _, leaf = name.rpartition(".")
        if section and section not in c:
            c[section] = vit.model_config(preset) if section == "model" else {}
        value = config_dict.placeholder(default) if isinstance(default, type) else default
        (c[section] if section else c)[leaf] = value
    c.model.preset = preset
    c.method.update(methods.defaults())
    return c


def _shown(value: Any) -> str:
    return "None" if isinstance(value, type) else repr(value)


def describe(markdown: bool = False) -> str:
    """Every field with its default and meaning (`FIELDS`) and the model's fields with their
    defaults; the plain text (`--help`) also each method's own, the table points to them."""
    base = base_config()
    rows = [(name, _shown(default), meaning) for name, default, meaning in FIELDS]
    named = {name for name, _, _ in FIELDS}
    shown = ", ".join(
        f"{k}={v!r}" for k, v in base.model.items() if k != "peft" and f"model.{k}" not in named
    )
    peft = ", ".join(f"{k}={v!r}" for k, v in base.model.peft.items())
    rows.append(("model.*", "vit_b16's", f"{shown}; peft: {peft} (models/vit.py)"))
    if markdown:
        own = "each method's own fields: its module's `defaults` (`--help` lists them)"
        rows.append(("method.*", "", own))
        cells = [[cell.replace("|", "\\|") for cell in row] for row in rows]
        table = [f"| `{n}` | {d} | {m} |" for n, d, m in cells]
        return "\n".join(["| field | default | meaning |", "|---|---|---|", *table])
    for name, method in methods.REGISTRY.items():
        if method.defaults:
            own = ", ".join(f"{k}={v!r}" for k, v in method.defaults.items())
            module = method.__module__.replace(".", "/").removeprefix("aepg_jax/")
            rows.append((f"method.* ({name})", "", f"{own} ({module}.py)"))
    return "\n".join(f"  {n} [{d}]  {m}" if d else f"  {n}  {m}" for n, d, m in rows)


def from_file(path: str, arg: str | None = None) -> ml_collections.ConfigDict:
    """`get_config([arg])` of the config file at `path`, as `--config=path[:arg]` builds it."""
    spec = importlib.util.spec_from_file_location(os.path.splitext(os.path.basename(path))[0], path)
    if spec is None or spec.loader is None:
        raise FileNotFoundError(f"{path} is not a Python config file.")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.get_config(arg) if arg is not None else module.get_config()


def loss_kwargs(cfg: ml_collections.ConfigDict) -> dict[str, float]:
    """The `loss.*` hyperparameters that `cfg.loss.name` accepts (unset beta: its default)."""
    return losses.config_hyperparameters(cfg.loss)


def schedule_kwargs(cfg: ml_collections.ConfigDict) -> dict[str, float]:
    """The `schedule.*` hyperparameters of `cfg.schedule.name`."""
    return schedules.config_hyperparameters(cfg.schedule)


def validate(cfg: ml_collections.ConfigDict, num_devices: int = 1) -> None:
    """Raises ValueError listing every impossible value, each with what to change (every
    float field must also be finite and within float32's range)."""
    p: list[str] = []
    validation.check(
        cfg.trainer == "continual",
        f"trainer={cfg.trainer!r}: this config schema is the continual trainer's.",
        p,
    )
    validation.float_problems(cfg, p)
    validation.data_problems(cfg, p)
    validation.model_problems(cfg, p)
    p.extend(input_files.problems(cfg))  # weights and split files: cheap reads, no arrays
    validation.pretrain_problems(cfg, p)
    validation.training_problems(cfg, num_devices, p)
    validation.check(
        cfg.method.name in methods.REGISTRY,
        f"method.name={cfg.method.name!r}: use one of {tuple(methods.REGISTRY)}.",
        p,
    )
    inits = (methods.OFFICIAL_HEAD_INIT, *head.INITS)
    validation.check(
        cfg.method.head_init in inits,
        f"method.head_init={cfg.method.head_init!r}: use one of {inits}.",
        p,
    )
    for method in methods.REGISTRY.values():  # every method's fields, whichever runs
        p.extend(method.check(cfg))
    validation.positive_ints({"log_every_steps": cfg.log_every_steps}, p)
    validation.check(
        validation.is_int(cfg.checkpoint_every_steps) and cfg.checkpoint_every_steps >= 0,
        f"checkpoint_every_steps={cfg.checkpoint_every_steps} must be >= 0 (0: per task).",
        p,
    )
    validation.check(
        cfg.checkpoint_every_minutes >= 0,
        f"checkpoint_every_minutes={cfg.checkpoint_every_minutes} must be >= 0 (0: off).",
        p,
    )
    validation.check(
        cfg.max_steps_per_task is None or cfg.max_steps_per_task >= 1,
        f"max_steps_per_task={cfg.max_steps_per_task} must be unset or >= 1.",
        p,
    )
    if p:
        raise ValueError(validation.joined(p))


def validate_against_dataset(
    cfg: ml_collections.ConfigDict,
    num_classes: int,
    domain_names: tuple[str, ...] = (),
    dataset: str = "the dataset",
) -> None:
    """Checks that need the dataset: more tasks than classes is impossible (class scenario);
    the domain scenario needs a multi-domain dataset and one task per domain."""
    d = cfg.data
    if d.scenario == "domain":
        if not domain_names:
            raise ValueError(
                "Invalid config: data.scenario=domain needs a dataset with several domains; "
                f"{dataset} has a single domain (no domain id per example); use "
                "data.scenario=class or a multi-domain source (e.g. data.source=digits_domains)."
            )
        if d.num_tasks != len(domain_names):
            raise ValueError(
                f"Invalid config: data.num_tasks={d.num_tasks} with data.scenario=domain, but "
                f"{dataset} has {len(domain_names)} domains ({', '.join(domain_names)}), one "
                f"task each; set data.num_tasks={len(domain_names)}."
            )
        return
    if cfg.data.num_tasks > num_classes:
        raise ValueError(
            f"Invalid config: data.num_tasks={cfg.data.num_tasks} exceeds the dataset's "
            f"{num_classes} classes; use data.num_tasks <= {num_classes}."
        )
