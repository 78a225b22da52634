"""Tests for configs/*.py and aepg_jax.config.arguments: every advertised run builds and validates,
the paper settings match docs/algorithm.md §6-§8, user inputs are required, parse_arg types and
errors."""

from __future__ import annotations

import functools
import importlib.util
import inspect
import itertools
import pathlib
import re

import layout_npz
import pytest

from aepg_jax import losses, main, methods, schedules
from aepg_jax.config import arguments, schema

ROOT = pathlib.Path(__file__).resolve().parents[1]
CONFIG_DIR = ROOT / "configs"
CONFIG_FILES = sorted(p.name for p in CONFIG_DIR.glob("*.py"))
DUMMY_CHECKPOINT = layout_npz.paper_layout()  # keys and shapes only: what validation reads
DUMMY_DATA_DIR = "/dummy/data"

# The paper configs: TFDS name or folder label, default and advertised task counts, classes.
PAPER = {
    "imagenet_r.py": dict(source="tfds", name="imagenet_r", tasks=10, classes=200),
    "food101.py": dict(source="tfds", name="food101", tasks=10, classes=101),
    "cub200.py": dict(source="tfds", name="caltech_birds2011", tasks=10, classes=200),
    "clrs25.py": dict(source="folder", name="clrs25", tasks=5, classes=25),
}
# Train-from-scratch configs (trainer=scratch, their own schema: aepg_jax/scratch/config.py).
SCRATCH = {"cifar_scratch.py", "scratch_default.py"}
TASKS = {"imagenet_r.py": (5, 10, 20), "food101.py": (10,), "cub200.py": (10,), "clrs25.py": (5,)}

# The LaTeX \label of every experiment table and figure: configs/README.md must map each one.
PAPER_LABELS = (
    "tab:sota tab:lae tab:focal_all tab:label_noise tab:tau tab:train-from-scratch "
    "fig:epg_entropy fig:focal_imagenet-r fig:alpha fig:train_scratch fig:focal_food101 "
    "fig:focal_entropy_strength"
).split()

# Every value the paper uses for each shared argument, and the config field it must reach.
ARG_VALUES = {
    "peft": ["lora", "adapter", "prefix"],
    "method": list(methods.NAMES),
    "loss": sorted(losses.LOSSES),
    "seed": [0, 1, 2, 3, 4],
    "schedule": sorted(schedules.SCHEDULES),
    "tau": [4.0, 6.0, 8.0],
    "alpha": [0.0, 0.2, 0.5, 1.0],
    "gamma": [0.5, 1.0, 2.0],
    "smoothing": [0.01, 0.05, 0.1],
    "beta": [0.1, 0.2, 1.0],
    "noise": [0.0, 0.2],
    "settings": ["reference", "common"],
}
FIELD = {
    "peft": "model.peft.kind",
    "method": "method.name",
    "loss": "loss.name",
    "seed": "seed",
    "schedule": "schedule.name",
    "tau": "schedule.tau",
    "alpha": "loss.alpha",
    "gamma": "loss.gamma",
    "smoothing": "loss.smoothing",
    "beta": "loss.beta",
    "noise": "data.label_noise",
    "tasks": "data.num_tasks",
    "settings": None,  # several optim.* fields (tests/test_prompts.py checks them)
}


@functools.cache
def load(filename):
    path = CONFIG_DIR / filename
    spec = importlib.util.spec_from_file_location(f"configs_{path.stem}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def build(filename, arg=None):
    get_config = load(filename).get_config
    if not inspect.signature(get_config).parameters:
        assert arg is None, f"{filename} takes no argument"
        return get_config()
    return get_config(arg)


def validate(cfg):
    """The validation `aepg_jax.main` applies: that of the config's trainer."""
    main.select_trainer(cfg)[0](cfg)


def fill_user_inputs(cfg):
    """Sets what the user supplies on the command line: checkpoint, folder root."""
    if cfg.trainer != "continual":
        return cfg
    if cfg.model.init == "augreg" and not cfg.model.checkpoint:
        cfg.model.checkpoint = DUMMY_CHECKPOINT
    if cfg.data.source == "folder" and not cfg.data.data_dir:
        cfg.data.data_dir = DUMMY_DATA_DIR
    return cfg


def get(cfg, dotted):
    for part in dotted.split("."):
        cfg = cfg[part]
    return cfg


def expand(arg_text, loops):
    """One argument string per combination of the `$var` values in `arg_text`."""
    names = sorted(set(re.findall(r"\$\{?(\w+)\}?", arg_text)))
    missing = [n for n in names if n not in loops]
    assert not missing, f"{arg_text!r}: no `for {missing[0]} in ...` loop defines ${missing[0]}"
    for values in itertools.product(*(loops[n] for n in names)):
        text = arg_text
        for name, value in zip(names, values, strict=True):
            text = re.sub(rf"\$\{{?{name}\}}?(?!\w)", value, text)
        yield text


def docstring_runs(filename):
    """(file, arg) of every `--config=configs/FILE.py:ARG` in a config's docstring, with the
    shell loops of its paragraph expanded."""
    runs = []
    for block in re.split(r"\n\s*\n", load(filename).__doc__ or ""):
        loops = {v: vals.split() for v, vals in re.findall(r"for (\w+) in ([^;]+); do", block)}
        for target, arg in re.findall(r"--config=configs/(\w+\.py)(?::([^\s\\]+))?", block):
            runs += [(target, a) for a in expand(arg, loops)] if arg else [(target, None)]
    return runs


def readme_runs():
    """(file, arg) of every `configs/FILE.py:ARG` code span of configs/README.md, with
    `key=a/b/c` expanded to one run per value."""
    runs = []
    text = (CONFIG_DIR / "README.md").read_text()
    for target, arg in re.findall(r"`configs/(\w+\.py):([^`]+)`", text):
        keys, choices = zip(*(pair.split("=", 1) for pair in arg.split(",")), strict=True)
        for values in itertools.product(*(c.split("/") for c in choices)):
            runs.append((target, ",".join(map("=".join, zip(keys, values, strict=True)))))
    return runs


def assert_args_applied(cfg, arg):
    """Each `key=value` of `arg` reached its config field (FIELD)."""
    for pair in filter(None, (arg or "").split(",")):
        key, value = pair.split("=")
        if FIELD[key] is None:
            continue
        got = get(cfg, FIELD[key])
        assert got == value if isinstance(got, str) else got == float(value), (pair, got)


def _runs_of(filename):
    return [run for run in docstring_runs(filename) if run[0] == filename] or [(filename, None)]


ALL_DOC_RUNS = sorted({run for f in CONFIG_FILES for run in _runs_of(f)}, key=str)


# ----------------------------------------------------------------------------- default.py


def test_default_config_validates_as_is():
    cfg = build("default.py")
    schema.validate(cfg)
    schema.validate_against_dataset(cfg, num_classes=10)  # digits


# ----------------------------------------------------------------------- every config file


def test_the_paper_configs_exist():
    assert set(PAPER) <= set(CONFIG_FILES), CONFIG_FILES


@pytest.mark.parametrize("filename", CONFIG_FILES)
def test_builds_with_defaults_and_validates_once_inputs_are_filled(filename):
    cfg = fill_user_inputs(build(filename))
    validate(cfg)
    assert (cfg.trainer == "scratch") == (filename in SCRATCH)
    assert filename in SCRATCH or cfg.model.init != "random" or filename == "default.py"


@pytest.mark.parametrize("filename", CONFIG_FILES)
def test_docstring_has_a_run_command(filename):
    doc = load(filename).__doc__ or ""
    assert "python -m aepg_jax.main" in doc and f"--config=configs/{filename}" in doc


@pytest.mark.parametrize("filename", sorted(PAPER))
def test_missing_checkpoint_is_named(filename):
    cfg = build(filename)
    if PAPER[filename]["source"] == "folder":
        cfg.data.data_dir = DUMMY_DATA_DIR
    with pytest.raises(ValueError, match=r"model\.checkpoint"):
        schema.validate(cfg)


def test_clrs25_requires_its_data_dir():
    cfg = build("clrs25.py")
    cfg.model.checkpoint = DUMMY_CHECKPOINT
    assert cfg.data.data_dir is None
    with pytest.raises(ValueError, match=r"data\.data_dir"):
        schema.validate(cfg)


def validate_documented_run(filename, arg):
    """Builds and validates one advertised run; a paper config's arguments reach their fields."""
    cfg = fill_user_inputs(build(filename, arg))
    validate(cfg)
    if filename in PAPER:
        schema.validate_against_dataset(cfg, PAPER[filename]["classes"])
        assert_args_applied(cfg, arg)


def test_every_documented_run_builds_and_validates():
    """The run commands of the config docstrings (the paper's runs, which the docstrings list
    with `aepg_jax.sweep --list`, are checked in tests/test_paper.py)."""
    assert {f for f, _ in ALL_DOC_RUNS} == set(CONFIG_FILES)
    for filename, arg in ALL_DOC_RUNS:
        validate_documented_run(filename, arg)


def test_readme_runs_build_and_validate_and_cover_every_paper_config():
    runs = readme_runs()
    assert {f for f, _ in runs} == set(PAPER) | {"cifar_scratch.py"}
    for filename, arg in runs:
        validate_documented_run(filename, arg)
    text = (CONFIG_DIR / "README.md").read_text()
    for label in PAPER_LABELS:
        assert f"`{label}`" in text, label


def test_every_paper_argument_is_tested():
    assert set(ARG_VALUES) == set(arguments.PAPER_ARGS)
    assert set(FIELD) == {*arguments.PAPER_ARGS, "tasks"}


@pytest.mark.parametrize("filename", sorted(PAPER))
@pytest.mark.parametrize("key", sorted(ARG_VALUES))
def test_every_value_of_every_argument_reaches_its_field(filename, key):
    for value in ARG_VALUES[key]:
        cfg = fill_user_inputs(build(filename, f"{key}={value}"))
        schema.validate(cfg)
        assert FIELD[key] is None or get(cfg, FIELD[key]) == value
        if key == "seed":
            assert cfg.data.noise_seed == value
        if key == "alpha":
            assert cfg.schedule.alpha == value


@pytest.mark.parametrize("filename", sorted(PAPER))
def test_datasets_and_task_counts_follow_spec_section_8(filename):
    want = PAPER[filename]
    cfg = build(filename)
    assert (cfg.data.source, cfg.data.name) == (want["source"], want["name"])
    assert cfg.data.num_tasks == want["tasks"]
    for tasks in TASKS[filename]:
        cfg = fill_user_inputs(build(filename, f"tasks={tasks}"))
        assert cfg.data.num_tasks == tasks
        schema.validate(cfg)
        schema.validate_against_dataset(cfg, want["classes"])


def test_imagenet_r_task_splits():
    for tasks in (5, 10, 20):
        cfg = build("imagenet_r.py", f"tasks={tasks},peft=lora,loss=aepg,method=lae")
        assert cfg.data.num_tasks == tasks


@pytest.mark.parametrize("filename", sorted(PAPER))
def test_training_settings_follow_spec_section_6_and_7(filename):
    c = build(filename)
    m = c.model
    assert (m.preset, m.init) == ("vit_b16", "augreg")
    assert (m.hidden_size, m.depth, m.patch_size, m.image_size) == (768, 12, 16, 224)
    assert m.checkpoint is None  # given on the command line
    assert tuple(m.peft.blocks) == (0, 1, 2, 3, 4)
    assert (m.peft.lora_rank, m.peft.adapter_dim, m.peft.prefix_length) == (4, 5, 10)
    o = c.optim
    assert (o.learning_rate, o.b1, o.b2, o.eps) == (5e-4, 0.9, 0.999, 1e-8)
    assert (o.batch_size, o.epochs, o.peft_freeze_epochs) == (256, 50, 30)
    assert c.eval.batch_size == 256
    assert c.method.ema_decay == 0.999
    assert (c.method.lwf_weight, c.method.lwf_temperature) == (1.0, 1.0)
    assert (c.schedule.name, c.schedule.tau) == ("sigmoid", 6.0)
    assert (c.model.peft.kind, c.method.name, c.loss.name) == ("lora", "lae", "aepg")
    assert c.data.crop_scale == (0.05, 1.0)
    assert c.data.crop_ratio == pytest.approx((3 / 4, 4 / 3))
    assert (c.data.flip_prob, c.input.normalize, c.data.store_size) == (0.5, "minus_one_one", 256)
    assert c.data.label_noise == 0.0 and c.data.class_order_seed is None


@pytest.mark.parametrize("filename", sorted(PAPER))
def test_unknown_argument_lists_the_valid_ones(filename):
    with pytest.raises(ValueError, match=r"Unknown config argument 'taks'.*tasks=\d+ \(int\)"):
        build(filename, "taks=10")


def test_beta_unset_leaves_the_losses_own_default():
    cfg = build("imagenet_r.py", "loss=entropy_penalty")
    assert cfg.loss.beta is None
    assert schema.loss_kwargs(cfg) == {}
    cfg = build("imagenet_r.py", "loss=confidence_penalty,beta=0.2")
    assert schema.loss_kwargs(cfg) == {"beta": 0.2}


# ------------------------------------------------------------------------------ parse_arg


def test_parse_arg_defaults_when_no_argument():
    for arg in (None, "", "  "):
        a = arguments.parse_arg(arg, tasks=10, peft="lora", noise=0.0, flag=False)
        assert a.to_dict() == {"tasks": 10, "peft": "lora", "noise": 0.0, "flag": False}


def test_parse_arg_converts_to_the_defaults_types():
    a = arguments.parse_arg(
        " tasks=20 , peft=prefix,noise=0.2,lr=1e-3,scale=2,flag=true,off=0,seed=3,",
        tasks=10,
        peft="lora",
        noise=0.0,
        lr=5e-4,
        scale=1.0,
        flag=False,
        off=True,
        seed=0,
        other="kept",
    )
    assert a.tasks == 20 and type(a.tasks) is int
    assert a.peft == "prefix"
    assert a.noise == 0.2 and a.lr == 1e-3
    assert a.scale == 2.0 and type(a.scale) is float
    assert a.flag is True and a.off is False
    assert a.seed == 3 and a.other == "kept"


@pytest.mark.parametrize(
    ("text", "want"),
    [("true", True), ("TRUE", True), ("1", True), ("false", False), ("False", False), ("0", False)],
)
def test_parse_arg_bools(text, want):
    assert arguments.parse_arg(f"flag={text}", flag=not want).flag is want


def test_parse_arg_optional_pair_default():
    assert arguments.parse_arg(None, beta=(None, float)).beta is None
    assert arguments.parse_arg("beta=0.2", beta=(None, float)).beta == 0.2
    assert arguments.parse_arg("beta=none", beta=(1.0, float)).beta is None


def test_parse_arg_unknown_key_lists_valid_keys_and_defaults():
    with pytest.raises(ValueError, match="Unknown config argument 'taks'") as err:
        arguments.parse_arg("taks=10", tasks=10, peft="lora", beta=(None, float))
    message = str(err.value)
    for piece in ("tasks=10 (int)", "peft='lora' (str)", "beta=None (float)"):
        assert piece in message


@pytest.mark.parametrize("arg", ["tasks", "tasks10,peft=lora", "=5", "tasks:10"])
def test_parse_arg_malformed_pair(arg):
    with pytest.raises(ValueError, match=r"Malformed config argument.*tasks=10 \(int\)"):
        arguments.parse_arg(arg, tasks=10, peft="lora")


@pytest.mark.parametrize(
    ("arg", "kind"),
    [("tasks=ten", "int"), ("tasks=1.5", "int"), ("noise=high", "float"), ("flag=yes", "bool")],
)
def test_parse_arg_bad_value(arg, kind):
    with pytest.raises(ValueError, match=rf"not a valid {kind}.*Valid keys"):
        arguments.parse_arg(arg, tasks=10, noise=0.0, flag=False)


def test_parse_arg_repeated_key():
    with pytest.raises(ValueError, match="given twice"):
        arguments.parse_arg("tasks=5,tasks=10", tasks=10)


def test_parse_arg_rejects_untyped_defaults():
    with pytest.raises(TypeError, match="int, float, bool, str"):
        arguments.parse_arg(None, blocks=[0, 1])
    with pytest.raises(TypeError, match="default value, converter"):
        arguments.parse_arg(None, beta=(None, 1.0))


# ----------------------------------------------------------------- train from scratch (Table 4)


def test_cifar_scratch_follows_spec_section_9():
    cfg = build("cifar_scratch.py")
    assert (cfg.trainer, cfg.data.source, cfg.data.name) == ("scratch", "tfds", "cifar100")
    assert (cfg.model.block, tuple(cfg.model.stage_sizes), cfg.model.width) == (
        "bottleneck",
        (3, 4, 6, 3),
        64,
    )
    o = cfg.optim
    assert (o.learning_rate, o.momentum, o.nesterov, o.weight_decay) == (0.1, 0.9, False, 0.0)
    assert (tuple(o.milestones), o.lr_decay, o.batch_size, o.epochs) == ((150, 225), 0.1, 256, 350)
    assert (cfg.data.image_size, cfg.data.pad, cfg.data.flip_prob) == (32, 4, 0.5)
    assert cfg.data.mean is None and cfg.data.std is None  # per-channel, from the train split
    assert (cfg.loss.name, cfg.loss.alpha) == ("mix", 0.2)


def test_table4_runs_reach_their_fields():
    """Both datasets x alpha 0 / 0.2 / 0.5 / 1 x 3 seeds, from the README (= the module's runs:
    tests/test_paper.py)."""
    readme = {arg for f, arg in readme_runs() if f == "cifar_scratch.py"}
    assert len(readme) == 24
    for arg in readme:
        cfg = build("cifar_scratch.py", arg)
        validate(cfg)
        values = dict(pair.split("=") for pair in arg.split(","))
        assert cfg.data.name == values["dataset"] and cfg.seed == int(values["seed"])
        assert cfg.loss.alpha == float(values["alpha"])


def test_cifar_scratch_rejects_other_datasets():
    with pytest.raises(ValueError, match=r"dataset='mnist': use one of cifar10, cifar100"):
        build("cifar_scratch.py", "dataset=mnist")


def test_every_field_is_described_once_beside_its_default():
    """`schema.FIELDS` names each field of `base_config` once, but the preset's model fields and
    the methods' own; its defaults are `base_config`'s."""
    from aepg_jax.models import vit

    def leaves(d, prefix=""):
        for k, v in d.items():
            yield from leaves(v, f"{prefix}{k}.") if hasattr(v, "items") else [(f"{prefix}{k}", v)]

    base = dict(leaves(schema.base_config()))
    own = {f"model.{k}" for k, _ in leaves(vit.model_config())} | {
        f"method.{k}" for k in methods.defaults()
    }
    names = [name for name, _, _ in schema.FIELDS]
    assert len(names) == len(set(names))
    assert set(names) == set(base) - own
    for name, default, _ in schema.FIELDS:
        assert base[name] == (None if isinstance(default, type) else default), name
