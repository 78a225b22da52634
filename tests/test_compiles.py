"""One compilation per program per run: the number of compilations of a run does not grow with
its number of tasks, for the default config and the LAE, CODA-P and InfLoRA test configs; the
fit check compiles nothing that training does not; the initial state is built by a few
programs, not op by op; the count is in results.json."""

from __future__ import annotations

import importlib.util
import json
import math
import pathlib

import jax
import pytest
from tiny import apply_overrides, tiny_config

from aepg_jax.continual import trainer

ROOT = pathlib.Path(__file__).resolve().parents[1]
PROGRAMS = ("jit(step)", "jit(multi_step)", "jit(eval_step)", "jit(_covariance_sums)")
PROGRAMS += ("jit(class_statistics)", "jit(slca_alignment)")


def default_config(cache, **overrides):
    spec = importlib.util.spec_from_file_location("default_cfg", ROOT / "configs" / "default.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    c = mod.get_config()
    c.data.cache_dir = str(cache)
    return apply_overrides(c, overrides)


def _compilations(make, tmp_path, fresh_cache, tasks: int, **overrides) -> dict:
    jax.clear_caches()  # each run compiles its programs anew, as a fresh process would,
    fresh_cache()  # with an empty persistent cache
    cfg = make(
        tmp_path / "cache",
        **{"data.num_tasks": tasks, "max_steps_per_task": 3, "log_every_steps": 1, **overrides},
    )
    workdir = tmp_path / f"run{tasks}"
    results = trainer.run(cfg, str(workdir))
    on_disk = json.loads((workdir / "results.json").read_text())["compilations"]
    assert on_disk == results["compilations"]
    assert results["compilations"]["cached"] == 0  # a first run: every program compiled
    return results["compilations"]


def _same_count(make, tmp_path, fresh_cache, **overrides) -> dict:
    """The 5-task run's compilations, after checking them against the 2-task run's."""
    two = _compilations(make, tmp_path, fresh_cache, 2, **overrides)
    five = _compilations(make, tmp_path, fresh_cache, 5, **overrides)
    # The run's programs (the train step, the evaluation, a method's own) compile once each.
    run_programs = {k: v["count"] for k, v in two["programs"].items() if k in PROGRAMS}
    assert run_programs.get("jit(step)") == 1 and run_programs.get("jit(eval_step)") == 1
    assert {k: v["count"] for k, v in five["programs"].items() if k in PROGRAMS} == run_programs
    # Small eager ops (parameter initialisation, host-side copies) compile once per shape: a
    # few more or fewer with other head sizes, never more with more tasks.
    assert 0 < five["count"] <= two["count"], (two["programs"], five["programs"])
    return five


def test_default_config_compiles_as_often_with_5_tasks_as_with_2(
    tmp_path, monkeypatch, fresh_compile_cache
):
    monkeypatch.setenv("AEPG_FIT_CHECK", "1")  # the check measures the programs training runs
    programs = _same_count(default_config, tmp_path, fresh_compile_cache)
    # Each heavy program once (the fit check's included), and at most 20 programs in all: the
    # initial state is one program per kind of tree (PEFT, heads, method state, train state).
    assert programs["count"] <= 20, programs["programs"]
    assert all(v["count"] == 1 for v in programs["programs"].values()), programs["programs"]


@pytest.mark.slow
@pytest.mark.parametrize(
    "overrides",
    [
        {"method.name": "lae"},
        {"method.name": "coda_prompt", "method.coda_blocks": (0, 1), "method.coda_pool_size": 10},
        {"method.name": "inflora", "method.inflora_blocks": (0, 1)},
        {"method.name": "sd_lora", "method.sd_lora_blocks": (0, 1)},
        {"method.name": "slca", "optim.peft_freeze_epochs": 0, "method.slca_ca_samples": 16},
        {"method.name": "hide_prompt", "method.hide_prompt_blocks": (0, 1)},
    ],
)
def test_method_test_configs_compile_as_often_with_5_tasks_as_with_2(
    tmp_path, fresh_compile_cache, overrides
):
    _same_count(tiny_config, tmp_path, fresh_compile_cache, **overrides)


@pytest.mark.slow  # ten tasks of EASE, 19 steps each: ~2 min on 2 cores
def test_ease_trains_tasks_of_different_epoch_lengths_with_one_train_program(
    tmp_path, fresh_compile_cache
):
    """EASE's per-epoch cosine annealing (its reference's schedule) over 10 one-class tasks of
    139-146 images, 17 or 18 batches of 8 per epoch: one train program for all of them, and
    each task's learning rate steps down at its own epoch boundary (the position is traced)."""
    overrides = {
        "method.name": "ease",
        "data.num_tasks": 10,
        "optim.batch_size": 8,
        "optim.optimizer": "sgd",
        "optim.lr_schedule": "cosine_annealing",
        "optim.peft_freeze_epochs": 0,
        "max_steps_per_task": 19,
        "log_every_steps": 1,
    }
    jax.clear_caches()
    fresh_compile_cache()
    cfg = tiny_config(tmp_path / "cache", **overrides)
    results = trainer.run(cfg, str(tmp_path / "run"))
    assert results["compilations"]["programs"]["jit(step)"]["count"] == 1
    with open(tmp_path / "run" / "metrics.jsonl") as f:
        train = [r for r in map(json.loads, f) if r["type"] == "train"]
    lr, epochs = cfg.optim.learning_rate, cfg.optim.epochs
    for r in train:  # `epoch`: the host's (step - 1) // steps_per_epoch of the record's task
        expected = lr * 0.5 * (1.0 + math.cos(math.pi * min(r["epoch"], epochs - 1) / epochs))
        assert r["lr"] == pytest.approx(expected, rel=1e-6), r
    # Epoch 1 starts after 17 steps in some tasks and after 18 in others: records 18 and 19.
    crossings = {
        t: min(r["task_step"] for r in train if r["task"] == t and r["epoch"] == 1)
        for t in range(10)
    }
    assert set(crossings.values()) == {18, 19}, crossings
