"""The baselines' and the field's experiments (aepg_jax/experiments/baselines.py,
field_methods.py) and their configs (cifar100.py, domainnet.py, pilot.py): every run builds and
validates with its overrides in place, every table cell selects runs, `aepg_jax.sweep --list`
lists each experiment, the configs' arguments reach their fields and bad ones are one line;
slow: a demo run through `aepg_jax.sweep` and `aepg_jax.tables`."""

from __future__ import annotations

import itertools
import re

import pytest
from test_configs import build, fill_user_inputs, get, load, validate

from aepg_jax import experiments
from aepg_jax.config import schema
from aepg_jax.experiments import baselines, field_methods, layout, registry
from aepg_jax.sweep import preflight, sweep
from aepg_jax.tables import tables

NAMES = ("coda_prompt", "inflora", "pilot", "coda_prompt_demo", "inflora_demo", "pilot_demo")
CONFIGS = ("cifar100.py", "domainnet.py", "pilot.py")


@pytest.mark.parametrize("name", NAMES)
def test_list_prints_every_run_with_its_command(name, tmp_path, capsys):
    runs = registry.get(name).runs()
    assert sweep.main([f"--experiment={name}", f"--workdir={tmp_path}", "--list"]) == 0
    out = capsys.readouterr().out.splitlines()
    heads = [line for line in out if line.startswith("[")]
    commands = [line for line in out if " -m aepg_jax.main --config=configs/" in line]
    assert len(heads) == len(commands) == len(runs) > 0
    assert len({c.split("--workdir=")[1] for c in commands}) == len(runs)
    for run, command in zip(runs, commands, strict=True):
        assert f"--config={run.config}:{run.arg}" in command
        assert all(f"--config.{k}={v}" in command for k, v in run.overrides)


def _typed(value):
    try:
        return float(value)
    except ValueError:
        return value


def _built(run):
    """`run`'s config, built and validated, with each of its grid overrides in place: a string
    field equal to it, a tuple field equal to it as written (spaces aside), a number equal."""
    unit = layout.Unit((run,))
    cfg = fill_user_inputs(preflight.load_config(unit.config_arg, unit.overrides()))
    validate(cfg)
    for field, value in run.overrides:
        got = get(cfg, field)
        if isinstance(got, str):
            assert got == value, (run, field)
        elif isinstance(got, (tuple, list)):
            assert str(tuple(got)).replace(" ", "") == value.replace(" ", ""), (run, field)
        else:
            assert float(got) == float(value), (run, field)
    return cfg


@pytest.mark.parametrize("name", NAMES[:3])
def test_every_run_builds_and_validates_with_its_overrides(name):
    for run in registry.get(name).runs():
        cfg = _built(run)
        assert cfg.method.name == run.value("method") and cfg.loss.name == "ce"


@pytest.mark.parametrize("name", NAMES)
def test_every_cell_selects_runs_and_published_values_parse(name):
    e = registry.get(name)
    assert e.tables
    for table in e.tables:
        for row, col in itertools.product(table.rows, table.columns):
            assert e.select({**row.where, **col.where}), (name, row.label, col.label)
            published = table.published(row, col)
            assert published is None or 0 < published.mean < 100
            assert published is None or published.pm is None or published.pm >= 0
        assert all(len(r.paper) in (0, len(table.columns)) for r in table.rows)


def test_settings_follow_each_benchmark():
    """CIFAR-100 runs 20 epochs and DomainNet 5 (the papers' code); PILOT's CODA-Prompt runs
    every method in seed 1993's legacy-numpy class order (EASE's table, whose cells it holds)."""
    epochs = {}
    for run in registry.get("coda_prompt").runs() + registry.get("inflora").runs():
        unit = layout.Unit((run,))
        cfg = preflight.load_config(unit.config_arg, unit.overrides())
        epochs.setdefault(run.stem, set()).add(cfg.optim.epochs)
    assert epochs == {"imagenet_r": {50}, "cifar100": {20}, "domainnet": {5}}
    for run in registry.get("pilot").runs():
        cfg = build("pilot.py", run.arg)
        vtab = run.value("dataset") == "vtab"
        assert cfg.data.class_order_seed == (None if vtab else 1993)
        assert cfg.data.class_order_rng == ("default" if vtab else "numpy_legacy")
        assert cfg.data.num_tasks == {"imagenet_a": 10, "objectnet": 20}.get(
            run.value("dataset"), cfg.data.num_tasks
        )


def test_inflora_published_rows_hold_an_average_above_the_final_accuracy():
    """bar-ACC_T (the mean of the accuracies after each task) >= ACC_T in every transcribed
    cell pair: the columns are not swapped."""
    for table in registry.get("inflora").tables:
        for row in table.rows:
            values = [table.published(row, c) for c in table.columns]
            for final, average in zip(values[::2], values[1::2], strict=True):
                assert (final is None) == (average is None)
                assert final is None or average.mean > final.mean, row.label


def test_pilot_published_rows_hold_an_average_at_least_the_final_accuracy():
    """bar-A >= A_B in every published PILOT cell pair (bar-A first), both or neither read."""
    (table,) = registry.get("pilot").tables
    for row in table.rows:
        values = [table.published(row, c) for c in table.columns]
        for average, final in zip(values[::2], values[1::2], strict=True):
            assert (final is None) == (average is None)
            assert final is None or average.mean >= final.mean, row.label


@pytest.mark.parametrize("filename", CONFIGS)
def test_config_builds_validates_and_its_docstring_lists_its_runs(filename):
    cfg = fill_user_inputs(build(filename))
    validate(cfg)
    stem = filename.removesuffix(".py")
    doc = load(filename).__doc__
    commands = re.findall(r"python -m aepg_jax\.sweep --experiment=(\w+) --where=(\S+) --list", doc)
    assert commands
    every = (*baselines.EXPERIMENTS, *field_methods.EXPERIMENTS)
    named = {e.name for e in every if any(r.stem == stem for r in e.runs())}
    assert {n for n, _ in commands} == named
    for name, where in commands:
        runs = experiments.filter_runs(registry.get(name).runs(), where)
        assert runs and all(r.stem == stem for r in runs)


def test_config_arguments_reach_their_fields():
    assert build("cifar100.py").data.store_size == 224
    cls, dom = build("domainnet.py"), build("domainnet.py", "scenario=domain")
    assert (cls.data.scenario, cls.data.num_tasks) == ("class", 5)
    assert (dom.data.scenario, dom.data.num_tasks) == ("domain", 6)
    assert build("domainnet.py", "tasks=3").data.num_tasks == 3
    for dataset, tasks in (("imagenet_a", 10), ("objectnet", 20), ("omnibenchmark", 10),
                           ("vtab", 5)):  # fmt: skip
        cfg = build("pilot.py", f"dataset={dataset}")
        assert (cfg.data.name, cfg.data.num_tasks, cfg.data.source) == (dataset, tasks, "folder")
        assert (cfg.data.class_order_seed, cfg.data.class_order_rng) == (
            (None, "default") if dataset == "vtab" else (1993, "numpy_legacy")
        )
        assert cfg.method.dualprompt_pool_size >= tasks


@pytest.mark.parametrize(
    ("filename", "arg", "field"),
    [("domainnet.py", "scenario=task", "scenario"), ("pilot.py", "dataset=cub", "dataset")],
)
def test_bad_argument_is_one_line_naming_it(filename, arg, field):
    with pytest.raises(ValueError, match=rf"^{field}=.* is unknown; use one of") as err:
        build(filename, arg)
    assert "\n" not in str(err.value)


def test_pilot_without_its_data_dir_is_one_line_naming_it():
    cfg = build("pilot.py", "dataset=vtab")
    cfg.model.checkpoint = "/no/such/weights.npz"
    with pytest.raises(ValueError, match=r"data\.data_dir") as err:
        schema.validate(cfg)
    assert "\n" not in str(err.value)


@pytest.mark.slow
def test_a_demo_run_goes_through_sweep_and_tables(tmp_path, capsys):
    """One run of `coda_prompt_demo` (L2P++, seed 0) swept for real, then tabulated: its cell
    has its number and `1/2 done` (seed 1 is not run), CODA-P's cells `0/2 done`."""
    root = str(tmp_path)
    where = "--where=method=l2p,seed=0"
    assert sweep.main(["--experiment=coda_prompt_demo", f"--workdir={root}", where]) == 0
    results = layout.run_results(root, registry.get("coda_prompt_demo").select(
        {"method": "l2p", "seed": 0})[0])  # fmt: skip
    assert 0 <= results["A_T"] <= 100 and 0 <= results["avg_inc_acc"] <= 100
    capsys.readouterr()
    assert tables.main([root]) == 0  # the sweep's selection: its one run
    out = capsys.readouterr().out
    assert out.startswith(f"Shown: runs {where} (recorded by the sweep of {root};")
    l2p = next(line for line in out.splitlines() if line.startswith("| L2P++"))
    assert f"{results['A_T']:.1f} (n=1)" in l2p
    assert tables.main([root, "--where="]) == 0  # every run: the others have no results yet
    out, err = capsys.readouterr()
    l2p = next(line for line in out.splitlines() if line.startswith("| L2P++"))
    assert f"{results['A_T']:.1f} (1/2 done)" in l2p  # seed 1 not run
    assert "0/2 done" in next(line for line in out.splitlines() if line.startswith("| CODA-P"))
    assert err.count("warning:") == 1 and "cells have runs without results" in err


# ------------------------------------------------------------- APER and the prototype demos
PROTOTYPE_NAMES = ("aper", "prototypes_demo")


@pytest.mark.parametrize("name", PROTOTYPE_NAMES)
def test_prototype_experiments_list_their_runs_and_every_cell_selects_runs(name, tmp_path, capsys):
    test_list_prints_every_run_with_its_command(name, tmp_path, capsys)
    test_every_cell_selects_runs_and_published_values_parse(name)


def test_aper_runs_validate_with_the_official_settings():
    """Every run validates with its overrides; APER's train task 0 with its code's SGD, cosine
    annealing and AdaptFormer adapters on every block, in both losses; SimpleCIL runs once."""
    runs = registry.get("aper").runs()
    losses = {}
    for run in runs:
        cfg = _built(run)
        assert cfg.input.normalize == "none"
        assert cfg.model.weights == "vit_base_patch16_224.augreg_in21k"
        vtab = run.value("dataset") == "vtab"
        assert cfg.data.class_order_seed == (None if vtab else 1993)
        losses.setdefault(cfg.method.name, set()).add(cfg.loss.name)
        if cfg.method.name == "aper":
            assert (cfg.optim.optimizer, cfg.optim.lr_schedule) == ("sgd", "cosine_annealing")
            p = cfg.model.peft
            assert (p.kind, p.adapter_style, p.adapter_dim) == ("adapter", "ffn", 64)
            assert tuple(p.blocks) == tuple(range(12))
    assert losses == {"simplecil": {"ce"}, "aper": {"ce", "aepg"}}
    assert sum(r.value("method") == "simplecil" for r in runs) == 7


def test_aper_published_rows_hold_an_average_at_least_the_final_accuracy():
    (table,) = registry.get("aper").tables
    for row in table.rows:
        values = [table.published(row, c) for c in table.columns]
        for average, final in zip(values[::2], values[1::2], strict=True):
            assert (final is None) == (average is None)
            assert final is None or average.mean >= final.mean, row.label


# ---------------------------------------------------------------------------------- EASE
def test_ease_lists_builds_and_tabulates_its_runs(tmp_path, capsys):
    """`ease`: every run lists with its command, builds and validates with the official configs'
    settings in place (the IN-21K weights, SGD, epochs, batch, lr, weight decay, adapter width,
    alpha, the seed-1993 class order but on VTAB), CE and aEPG runs of one grid, and every table
    cell selects runs; the CE row holds EASE's cells."""
    e = registry.get("ease")
    runs = e.runs()
    assert sweep.main(["--experiment=ease", f"--workdir={tmp_path}", "--list"]) == 0
    commands = [c for c in capsys.readouterr().out.splitlines() if " -m aepg_jax.main " in c]
    assert len(commands) == len(runs) == 6 * 2 * 5
    losses = set()
    for run in runs:
        cfg = _built(run)
        assert cfg.method.name == "ease" and cfg.optim.peft_freeze_epochs == 0
        assert cfg.model.weights == field_methods.EASE_IN21K
        o = cfg.optim  # the configs' SGD, cosine annealing to 0 per epoch; ToTensor inputs
        assert (o.optimizer, o.momentum, o.lr_schedule) == ("sgd", 0.9, "cosine_annealing")
        assert cfg.input.normalize == "none"
        vtab = run.value("dataset") == "vtab"  # `shuffle: false`; every other: seed 1993
        assert cfg.data.class_order_seed == (None if vtab else 1993)
        assert vtab or cfg.data.class_order_rng == "numpy_legacy"
        losses.add(cfg.loss.name)
    assert losses == {"ce", "aepg"}
    (table,) = e.tables
    for row, col in itertools.product(table.rows, table.columns):
        assert e.select({**row.where, **col.where}), (row.label, col.label)
    ce, aepg = table.rows
    assert len(ce.paper) == len(table.columns) and not aepg.paper
    assert [table.published(ce, c).mean for c in table.columns[:2]] == [91.51, 85.80]


# -------------------------------------------------------------------------------- RanPAC
def test_ranpac_runs_build_with_its_settings_in_both_losses():
    """RanPAC's grids: its official settings (args ID 7) in every run, CE beside aEPG, seed
    1993's class order except VTAB, the IN-21K backbone on CIFAR-100 and OmniBenchmark."""
    runs = registry.get("ranpac").runs()
    assert {r.value("loss") for r in runs} == {"ce", "aepg"}
    for run in runs:
        cfg = _built(run)
        assert cfg.method.name == "ranpac" and cfg.method.ranpac_m == 10000
        assert (cfg.optim.batch_size, cfg.optim.epochs, cfg.model.peft.kind) == (48, 20, "adapter")
        assert tuple(cfg.model.peft.blocks) == tuple(range(12)) and cfg.model.peft.adapter_dim == 64
        p, o = cfg.model.peft, cfg.optim  # args ID 7: AdaptFormer, SGD, cosine annealing
        assert (p.adapter_style, p.adapter_scale, cfg.input.normalize) == ("ffn", 0.1, "none")
        assert (o.optimizer, o.momentum, o.learning_rate, o.weight_decay, o.lr_schedule) == (
            "sgd", 0.9, 0.01, 5e-4, "cosine_annealing")  # fmt: skip
        vtab = run.value("dataset") == "vtab"
        assert cfg.data.class_order_seed == (None if vtab else 1993)
        in21k = run.stem == "cifar100" or run.value("dataset") == "omnibenchmark"
        assert (cfg.model.weights == "vit_base_patch16_224.augreg_in21k") == in21k


# ------------------------------------------------------------------------------- SD-LoRA
def test_sd_lora_lists_builds_and_tabulates_its_runs(tmp_path, capsys):
    """`sd_lora`: every run lists with its command and validates with the official code's
    settings in place (augreg2 weights, [0, 1] inputs, SGD, constant lr, batch 128, 20 epochs,
    the logged runs' lr and class order), CE beside aEPG, every cell selects runs, the CE row
    holds the logged cells with Acc <= AAA."""
    e = registry.get("sd_lora")
    runs = e.runs()
    assert sweep.main(["--experiment=sd_lora", f"--workdir={tmp_path}", "--list"]) == 0
    commands = [c for c in capsys.readouterr().out.splitlines() if " -m aepg_jax.main " in c]
    assert len(commands) == len(runs) == 5 * 2 * 5
    losses = set()
    for run in runs:
        cfg = _built(run)
        assert cfg.method.name == "sd_lora" and cfg.method.sd_lora_rank == 10
        assert cfg.model.weights == "vit_base_patch16_224.augreg2_in21k_ft_in1k"
        o = cfg.optim
        assert (o.optimizer, o.momentum, o.lr_schedule, o.batch_size, o.epochs) == (
            "sgd", 0.9, "constant", 128, 20)  # fmt: skip
        assert cfg.input.normalize == "none" and cfg.data.class_order_seed is not None
        losses.add(cfg.loss.name)
    assert losses == {"ce", "aepg"}
    test_every_cell_selects_runs_and_published_values_parse("sd_lora")
    (table,) = e.tables
    logs, paper, aepg = table.rows  # the logs' cells, the paper's beside them, and ours
    assert len(logs.paper) == len(paper.paper) == len(table.columns) and not aepg.paper
    for row in (logs, paper):
        values = [table.published(row, c) for c in table.columns]
        pairs = zip(values[::2], values[1::2], strict=True)
        assert all(acc.mean <= aaa.mean for acc, aaa in pairs if acc and aaa)


def test_field_demo_lists_its_runs_and_every_cell_selects_runs(tmp_path, capsys):
    test_list_prints_every_run_with_its_command("field_demo", tmp_path, capsys)
    test_every_cell_selects_runs_and_published_values_parse("field_demo")
    assert {r.value("method") for r in registry.get("field_demo").runs()} >= {
        "sd_lora",
        "slca",
        "hide_prompt",
    }


# ---------------------------------------------------------------------------------- SLCA
def test_slca_lists_builds_and_tabulates_its_runs(tmp_path, capsys):
    """SLCA's grids: `--list` shows every run, every cell selects runs, and every run builds
    with its code's settings (full fine-tuning by SGD, multistep lr at its milestone, batch
    128, the IN-21K backbone, seed 1993's class order), CE beside aEPG."""
    test_list_prints_every_run_with_its_command("slca", tmp_path, capsys)
    test_every_cell_selects_runs_and_published_values_parse("slca")
    runs = registry.get("slca").runs()
    assert {r.value("loss") for r in runs} == {"ce", "aepg"}
    for run in runs[:: max(1, len(runs) // 3)]:  # one run per benchmark
        cfg = _built(run)
        o = cfg.optim
        assert cfg.method.name == "slca" and cfg.model.peft.kind == "none"
        assert (o.optimizer, o.learning_rate, o.weight_decay, o.batch_size) == (
            "sgd", 0.01, 5e-4, 128)  # fmt: skip
        assert o.lr_schedule == "multistep" and tuple(o.lr_milestones) == (
            (18,) if run.stem == "cifar100" else (40,)
        )
        assert cfg.model.weights == "vit_base_patch16_224.augreg_in21k"
        assert cfg.data.class_order_seed == 1993


# ---------------------------------------------------------------------------- HiDe-Prompt
def test_hide_prompt_runs_build_with_its_settings_in_both_losses(tmp_path, capsys):
    """`hide_prompt`: every run lists and builds with its scripts' settings (ToTensor inputs,
    crops from 5%, batch 24, Adam at 0.03 * 24 / 256 clipped at 1, per benchmark its epochs,
    schedule, prompt length, reg, heads' rate and TII lr), CE beside aEPG, 3 seeds; every table
    cell selects runs, and the table says it keeps class statistics."""
    e = registry.get("hide_prompt")
    runs = e.runs()
    assert sweep.main(["--experiment=hide_prompt", f"--workdir={tmp_path}", "--list"]) == 0
    commands = [c for c in capsys.readouterr().out.splitlines() if " -m aepg_jax.main " in c]
    assert len(commands) == len(runs) == 3 * 2 * 3
    expected = {  # stem: (epochs, schedule, length, reg, head scale, TII lr)
        "imagenet_r": (150, "cosine_annealing", 20, 0.5, 0.1, 0.0005 * 24 / 256),
        "cifar100": (50, "multistep", 5, 0.1, 0.1, 0.0005 * 24 / 256),
        "cub200": (50, "multistep", 20, 0.01, 1.0, 0.01 * 24 / 256),
    }
    losses = set()
    for run in runs:
        cfg = _built(run)
        o, m = cfg.optim, cfg.method
        assert m.name == "hide_prompt" and cfg.data.num_tasks == 10
        assert (cfg.input.normalize, tuple(cfg.data.crop_scale)) == ("none", (0.05, 1.0))
        assert (o.batch_size, o.learning_rate, o.clip_norm) == (24, 0.03 * 24 / 256, 1.0)
        assert o.peft_freeze_epochs == 0 and cfg.model.weights is None  # ViT-B_16.npz
        got = (o.epochs, o.lr_schedule, m.hide_prompt_length, m.hide_prompt_reg,
               m.hide_prompt_head_lr_scale, m.hide_prompt_tii_lr)  # fmt: skip
        assert got[:3] == expected[run.stem][:3]
        assert got[3:] == pytest.approx(expected[run.stem][3:])
        assert o.lr_schedule != "multistep" or tuple(o.lr_milestones) == (31,)
        losses.add(cfg.loss.name)
    assert losses == {"ce", "aepg"}
    (table,) = e.tables
    assert "class statistics" in table.title
    for row, col in itertools.product(table.rows, table.columns):
        assert e.select({**row.where, **col.where}), (row.label, col.label)
