"""A tiny experiment for the sweep tests: `write(tmp)` writes a config file (tests/tiny.py's
depth-2 ViT on digits, 2 tasks, a few steps, arguments `loss` and `seed`) and an experiment
file defining EXPERIMENT over it; returns the experiment file's path."""

import pathlib
import textwrap

TESTS = pathlib.Path(__file__).resolve().parent

CONFIG = """
import pathlib, sys
sys.path.insert(0, {tests!r})
import tiny
from aepg_jax.config import arguments

def get_config(arg=None):
    a = arguments.parse_arg(arg, loss="ce", seed=0)
    return tiny.tiny_config(pathlib.Path({cache!r}), **{{
        "loss.name": a.loss, "seed": a.seed, "data.num_tasks": 2, "optim.epochs": 2,
        "optim.peft_freeze_epochs": 1, "max_steps_per_task": {steps}, "eval.batch_size": 256,
        "checkpoint_every_steps": {every}}})
"""

EXPERIMENT = """
from aepg_jax.experiments import Column, Experiment, Grid, Row, Table

CFG = {config!r}
EXPERIMENT = Experiment(
    "fake",
    "A tiny sweep",
    [Grid(CFG, "loss=ce/aepg,seed=0/1"), *{extra}],
    [Table("Fake", [Row("CE", {{"loss": "ce"}}, ["10.0±1.0", "-"]),
                    Row("aEPG", {{"loss": "aepg"}}, ["20.0", ""])],
           [Column("A_2", {{}}, "A_T"), Column("Ã_2", {{}}, "avg_inc_acc")])],
)
"""


def write(tmp, steps=3, every=0, failing=False, cache=None):
    tmp = pathlib.Path(tmp)
    tmp.mkdir(parents=True, exist_ok=True)
    config = tmp / "fake_config.py"
    config.write_text(
        CONFIG.format(tests=str(TESTS), cache=str(cache or tmp / "cache"), steps=steps, every=every)
    )
    extra = (
        f"[Grid({str(config)!r}, 'loss=ce,seed=5', overrides=(('data.num_tasks', '11'),))]"
        if failing
        else "[]"
    )
    path = tmp / "fake_experiment.py"
    path.write_text(textwrap.dedent(EXPERIMENT.format(config=str(config), extra=extra)))
    return str(path)
