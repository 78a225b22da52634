"""The experiment `field_claims` (`aepg_jax/experiments/field_claims.py`): every method that
trains with a loss, CE and aEPG, 5 seeds, its official head init and N(0, 0.001^2), on
configs/claims.py (the embedded default with arguments), a cell's seeds as one program, and a
table whose CE and aEPG rows pair; the published cells of SLCA, HiDe-Prompt, SD-LoRA and APER
with their sources."""

from __future__ import annotations

import collections
import importlib.util
import pathlib
import re

from aepg_jax import experiments, methods
from aepg_jax.experiments import field_claims, registry
from aepg_jax.sweep import sweep
from aepg_jax.tables import paired

ROOT = pathlib.Path(__file__).resolve().parents[1]
TRAINED = {"plain", "lae", "lwf", "l2p", "dualprompt", "coda_prompt", "inflora", "aper", "ease",
           "ranpac", "sd_lora", "slca", "hide_prompt"}  # fmt: skip


def test_field_claims_lists_every_method_loss_seed_and_head_init():
    experiment = registry.get("field_claims")
    runs = [r for grid in experiment.grids for r in grid.runs()]
    cells = collections.defaultdict(set)
    for run in runs:
        args = dict(run.args)
        assert run.config == "configs/claims.py"
        cells[(args["method"], args["loss"], args["head_init"])].add(int(args["seed"]))
    assert {m for m, _, _ in cells} == TRAINED
    for method in TRAINED:
        inits = {methods.get(method).official_head_init, "normal"}
        for loss in ("ce", "aepg"):
            for init in inits:
                assert cells[(method, loss, init)] >= {0, 1, 2, 3, 4}, (method, loss, init)
    assert {i for _, _, i in cells} == {"normal", "uniform", "trunc_normal", "linear"}
    assert len(runs) == len(set(runs)) == sum(10 * len(field_claims.head_inits(m)) for m in TRAINED)
    (table,) = experiment.tables
    pairs = paired.row_pairs(table)
    assert len(pairs) == sum(len(field_claims.head_inits(m)) for m in TRAINED)
    for base, other in pairs:
        assert table.rows[base].where == {**table.rows[other].where, "loss": "ce"}


def test_field_claims_runs_one_program_of_5_seeds_per_method_loss_and_init(tmp_path, capsys):
    units = sweep.select(sweep.parse(["--experiment=field_claims"])[0])[1]
    assert len(units) == sum(2 * len(field_claims.head_inits(m)) for m in TRAINED)
    assert all([r.seed for r in u.runs] == [0, 1, 2, 3, 4] for u in units)
    assert units[0].name == "claims/head_init=normal,loss=ce,method=plain,seeds=0-4"
    assert "--config.num_seeds=5" in units[0].command("runs/claims")
    alone = sweep.select(sweep.parse(["--experiment=field_claims", "--no-vmap_seeds"])[0])[1]
    assert len(alone) == 5 * len(units) and not any(u.vmapped for u in alone)
    # A SLURM worker runs as the sweep would: the experiment's own choice, or the one given.
    for extra, flag in (([], ""), (["--no-vmap_seeds"], " --no-vmap_seeds")):
        argv = ["--experiment=field_claims", f"--workdir={tmp_path}", "--where=method=plain",
                "--slurm", *extra]  # fmt: skip
        assert sweep.main(argv) == 0
        command = next(x for x in capsys.readouterr().out.splitlines() if "aepg_jax.sweep" in x)
        assert command.endswith(f"--workdir={tmp_path} --where=method=plain{flag} &")
        assert "vmap_seeds" in flag or "vmap_seeds" not in command


def test_the_docs_give_every_method_its_comparison_with_its_official_heads():
    text = (ROOT / "docs/methods.md").read_text()
    found = re.findall(
        r"^- (.+): `--where=(method=(\w+),head_init=official)` \((\w+) heads", text, re.M
    )
    assert [(n, m) for n, _, m, _ in found] == [(n, m) for m, n in field_claims.METHODS]
    experiment = registry.get("field_claims")
    for _, where, method, init in found:
        assert init == methods.get(method).official_head_init
        runs = experiments.filter_runs(experiment.runs(), where)
        assert {(r.value("loss"), r.value("head_init")) for r in runs} == {
            ("ce", init),
            ("aepg", init),
        } and len(runs) == 10


def test_claims_config_without_arguments_is_the_embedded_default():
    def load(name):
        spec = importlib.util.spec_from_file_location(f"_cfg_{name}", ROOT / "configs" / name)
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        return module

    default = load("default.py").get_config()
    claims_config = load("claims.py")
    assert claims_config.get_config().to_json() == default.to_json()
    c = claims_config.get_config("method=l2p,loss=ce,head_init=normal,seed=3")
    assert (c.method.name, c.loss.name, c.method.head_init, c.seed) == ("l2p", "ce", "normal", 3)
    assert c.model.peft.kind == "none"  # L2P++ brings its own parameters


def test_slca_and_hide_prompt_name_the_source_of_their_published_cells():
    from aepg_jax.tables import tables

    for name, cells, source in (
        ("slca", ("91.53±0.28", "84.71±0.40", "90.94±0.68"), "VQ-Prompt (NeurIPS 2024)"),
        ("hide_prompt", ("92.61±0.28", "86.61±0.18", "87.01±0.03"), "VQ-Prompt"),
    ):
        (table,) = registry.get(name).tables
        ce = table.rows[0]
        printed = [p for p in (table.published(ce, c) for c in table.columns) if p is not None]
        assert {f"{p.mean:.2f}±{p.pm:.2f}" for p in printed} >= set(cells), name
        assert len(printed) < len(table.columns)  # the compilation-only cells stay empty
        line = tables.source_text(table, "markdown")
        assert line.startswith("Published cells: ") and source in line
        assert "third-party compilation, left empty" in line
    (sd_lora,) = registry.get("sd_lora").tables
    assert [r.label for r in sd_lora.rows][:2] == ["SD-LoRA (CE) vs logs", "SD-LoRA (CE) vs paper"]
    assert sd_lora.published(sd_lora.rows[1], sd_lora.columns[0]).mean == 79.15
    assert paired.row_pairs(sd_lora) == [(0, 2)]  # aEPG pairs with the first CE row
    (aper,) = registry.get("aper").tables
    assert "B0 Inc10" in aper.source and "logs" in aper.source
