"""Arguments of config files, and the settings every paper-experiment config shares.

big_vision style: `--config=configs/imagenet_r.py:tasks=10,peft=lora` reaches the config file
as `get_config("tasks=10,peft=lora")`; the file turns that string into typed values with
`parse_arg`:

    def get_config(arg=None):
        a = arguments.parse_arg(arg, tasks=10, peft="lora", noise=0.0)
        ...                                    # a.tasks == 10 (int), a.noise == 0.0 (float)

The paper configs (`configs/imagenet_r.py`, `food101.py`, `cub200.py`, `clrs25.py`) share the
arguments in `PAPER_ARGS` and build their config with `paper_config`; each only adds its data
fields. `configs/README.md` maps the paper's tables and figures onto them.
"""

from __future__ import annotations

import importlib.util
import pathlib
from collections.abc import Callable
from typing import Any

import ml_collections

from aepg_jax import methods
from aepg_jax.checkpoints import catalog
from aepg_jax.config import schema

_TRUE, _FALSE = ("true", "1"), ("false", "0")


def sibling_config(config_file: str, name: str, arg: str | None = None):
    """`get_config(arg)` of the config file `name` in the folder of `config_file` (a config
    built on another: configs/demo.py on configs/default.py)."""
    path = pathlib.Path(config_file).with_name(name)
    spec = importlib.util.spec_from_file_location(f"configs_{path.stem}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.get_config() if arg is None else module.get_config(arg)


def _parse_bool(text: str) -> bool:
    lowered = text.lower()
    if lowered in _TRUE:
        return True
    if lowered in _FALSE:
        return False
    raise ValueError("expected true, false, 1 or 0")


def _optional(convert: Callable[[str], Any]) -> Callable[[str], Any]:
    return lambda text: None if text.lower() == "none" else convert(text)


def _spec(key: str, default: Any) -> tuple[Any, Callable[[str], Any], str]:
    """(default value, string converter, type name) of one `parse_arg` default."""
    if isinstance(default, tuple):
        if len(default) != 2 or not callable(default[1]):
            raise TypeError(
                f"parse_arg default {key}={default!r}: a tuple must be "
                "(default value, converter), e.g. (None, float)."
            )
        value, convert = default
        return value, _optional(convert), getattr(convert, "__name__", "value")
    # bool before int: bool is a subclass of int.
    for kind, convert in ((bool, _parse_bool), (int, int), (float, float), (str, str)):
        if isinstance(default, kind):
            return default, convert, kind.__name__
    raise TypeError(
        f"parse_arg default {key}={default!r} has type {type(default).__name__}; "
        "use int, float, bool, str or a (default value, converter) pair."
    )


def parse_arg(arg: str | None, **defaults: Any) -> ml_collections.ConfigDict:
    """Parses a config file's argument string `"key=value,key=value"` against typed defaults.

    Args:
      arg: what follows `:` in `--config=path.py:arg`; None or "" gives the defaults.
      **defaults: every accepted key with its default. The default's type converts the given
        text: `int` (`"10"`), `float` (`"5e-4"`, `"1"`), `bool` (`true`/`false`/`1`/`0`, any
        case), `str` (as written). A default may also be a pair `(value, converter)`, e.g.
        `beta=(None, float)`: the default `value` (None allowed), text converted with
        `converter`, and `none` giving None.

    Returns:
      A ConfigDict with one field per key of `defaults`: the given value, converted, or the
      default. Whitespace around keys and values is stripped; empty pieces (a trailing comma)
      are skipped.

    Raises:
      ValueError: a piece is not `key=value`, a key is unknown or repeated, or a value does not
        convert to its default's type. The message lists the valid keys with their defaults.
      TypeError: a default has a type other than those above (a mistake in the config file).
    """
    specs = {key: _spec(key, default) for key, default in defaults.items()}
    valid = ", ".join(f"{k}={v!r} ({name})" for k, (v, _, name) in specs.items()) or "none"
    values = {key: value for key, (value, _, _) in specs.items()}
    given: set[str] = set()
    for piece in (arg or "").split(","):
        if not piece.strip():
            continue
        key, sep, text = (part.strip() for part in piece.partition("="))
        if not sep or not key:
            raise ValueError(
                f"Malformed config argument {piece.strip()!r} in {arg!r}: expected "
                f"key=value pairs separated by commas. Valid keys (default): "
                f"{valid}."
            )
        if key not in specs:
            raise ValueError(
                f"Unknown config argument {key!r} in {arg!r}. Valid keys (default): {valid}."
            )
        if key in given:
            raise ValueError(f"Config argument {key!r} is given twice in {arg!r}.")
        given.add(key)
        _, convert, name = specs[key]
        try:
            values[key] = convert(text)
        except (TypeError, ValueError) as err:
            raise ValueError(
                f"Config argument {key}={text!r}: not a valid {name} ({err}). "
                f"Valid keys (default): {valid}."
            ) from None
    return ml_collections.ConfigDict(values)


# Arguments every paper-experiment config takes (each config adds `tasks`). The defaults give
# the paper's method, LoRA + aEPG + LAE; each argument sets the config fields named here.
PAPER_ARGS: dict[str, Any] = {
    "peft": "lora",  # model.peft.kind: lora | adapter | prefix
    "method": "lae",  # method.name: any of methods.NAMES (plain, lwf, lae, l2p, ...)
    "loss": "aepg",  # loss.name: ce | epg | aepg | mix | focal | label_smoothing | ...
    "seed": 0,  # seed and data.noise_seed (the label noise is fixed once per seed)
    "schedule": "sigmoid",  # schedule.name: sigmoid | linear | cosine | constant (loss=aepg)
    "tau": 6.0,  # schedule.tau (sigmoid)
    "alpha": 0.5,  # loss.alpha (loss=mix) and schedule.alpha (schedule=constant)
    "gamma": 1.0,  # loss.gamma (focal)
    "smoothing": 0.05,  # loss.smoothing (label_smoothing)
    "beta": (None, float),  # loss.beta; None: the loss's own (confidence 0.1, entropy 1.0)
    "noise": 0.0,  # data.label_noise: symmetric within-task noise on training labels
    # reference: the method's reference-implementation optim.* settings
    # (`Method.reference_settings`; the paper's own methods have none, so Table 5's); common:
    # Table 5's settings for every method (Adam 5e-4, batch 256, 30 head-only epochs, ...).
    "settings": "reference",
}
SETTINGS = ("reference", "common")


def paper_data_config(
    args: ml_collections.ConfigDict, source: str, name: str, num_tasks: int
) -> ml_collections.ConfigDict:
    """`paper_config(args)` on the dataset `name` of `source` cut into `num_tasks` tasks, with
    the published backbone `args.weights` when it is given, and DualPrompt's pool (10, the
    reference's) grown to a slot per task, since it trains slot t in task t."""
    c = paper_config(args)
    if args.get("weights") is not None:
        use_weights(c, args.weights)
    c.data.source = source
    c.data.name = name
    c.data.num_tasks = num_tasks
    c.method.dualprompt_pool_size = max(c.method.dualprompt_pool_size, num_tasks)
    return c


def use_weights(c: ml_collections.ConfigDict, name: str) -> None:
    """`c` set to load the published backbone `name` (`checkpoints/catalog.py`): model.weights,
    the family, patch size and image normalisation it needs; an unknown name is refused."""
    w = catalog.get(name)
    c.model.weights = name
    c.model.family = w.family
    c.model.patch_size = w.patch_size
    c.input.normalize = w.normalize


def paper_config(args: ml_collections.ConfigDict) -> ml_collections.ConfigDict:
    """ViT-B/16 augreg, the paper's training settings (Table 5, docs/algorithm.md §6-§7), `args`.

    `args` is `parse_arg(arg, **PAPER_ARGS)` (plus the config's own keys). The caller sets the
    data fields (`data.source`, `data.name`, `data.num_tasks`, `data.data_dir`). With
    `settings=reference` the method's `reference_settings` (its reference implementation's
    optim.* values; none for plain, lwf, lae) replace Table 5's; a method that brings its own
    parameters (`uses_model_peft` False: the prompt methods) gets `model.peft.kind=none`.
    `model.checkpoint` stays unset: the user passes the downloaded augreg `.npz` with
    `--config.model.checkpoint=PATH`, and `schema.validate` rejects the config without it.
    """
    c = schema.base_config("vit_b16")
    c.seed = args.seed
    c.data.label_noise = args.noise
    c.data.noise_seed = args.seed
    c.data.store_size = 256  # Resize(256) + CenterCrop(224) at test time
    c.model.init = "augreg"
    c.model.peft.kind = args.peft  # blocks 0-4; LoRA rank 4, adapter 5, prefix 10 (defaults)
    c.loss.name = args.loss
    c.loss.alpha = args.alpha
    c.loss.gamma = args.gamma
    c.loss.smoothing = args.smoothing
    if args.beta is not None:
        c.loss.beta = args.beta
    c.schedule.name = args.schedule
    c.schedule.tau = args.tau
    c.schedule.alpha = args.alpha
    c.optim.learning_rate = 5e-4  # Adam(.9, .999, 1e-8), constant, no weight decay
    c.optim.batch_size = 256
    c.optim.epochs = 50
    c.optim.peft_freeze_epochs = 30  # tasks >= 1: head only for 30 epochs, then PEFT + head
    c.method.name = args.method
    method = methods.get(args.method)
    if not method.uses_model_peft:  # e.g. the prompt methods bring their own parameters
        c.model.peft.kind = "none"
    if args.settings not in SETTINGS:
        raise ValueError(f"settings={args.settings!r} is unknown; use one of {SETTINGS}.")
    if args.settings == "reference":
        for dotted, value in method.reference_settings.items():
            section, field = dotted.split(".")
            c[section][field] = value
    c.method.ema_decay = 0.999  # LAE offline PEFT (the paper's, not LAE's 0.9999)
    c.method.lwf_weight = 1.0
    c.method.lwf_temperature = 1.0
    c.eval.batch_size = 256
    return c
