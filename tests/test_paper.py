"""The paper's experiments as data (aepg_jax/experiments/paper.py): the runs agree with
configs/README.md's runs table, build and validate, and the config docstrings point to their
listing (`aepg_jax.sweep --list`); the published numbers with the paper's .tex (parsed
independently of the module when ../shared/paper is there) and with a second hand transcription;
`aepg_jax.sweep --list` and `--slurm` for Table 1."""

from __future__ import annotations

import itertools
import math
import pathlib
import re
import subprocess

import pytest
from test_configs import CONFIG_DIR, PAPER, load, validate_documented_run

from aepg_jax import experiments
from aepg_jax.experiments import layout, paper, registry
from aepg_jax.sweep import sweep

ROOT = pathlib.Path(__file__).resolve().parents[1]
TEX = next(
    (p for p in (ROOT.parent / "shared/paper/aepg_paper.tex", ROOT / "shared/paper/aepg_paper.tex")
     if p.exists()),
    None,
)  # fmt: skip


def readme_table_rows() -> list[tuple[str, list[tuple[str, str]], str]]:
    """(paper result, [(config, spec)], runs) of each row of configs/README.md's runs table."""
    text = (CONFIG_DIR / "README.md").read_text()
    section = text.split("## Paper results and the runs that reproduce them")[1].split("\n### ")[0]
    rows = []
    for line in section.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) != 3 or cells[0] in ("paper result", "---"):
            continue
        spans = re.findall(r"`(configs/\w+\.py):([^`]+)`", cells[1])
        rows.append((cells[0], spans, cells[2]))
    return rows


def module_grids() -> dict[str, list[experiments.Grid]]:
    """The README-listed grids of every paper experiment, by their row label (each once)."""
    out: dict[str, list[experiments.Grid]] = {}
    for e in paper.EXPERIMENTS:
        for g in e.all_grids():
            if g.readme and g not in out.setdefault(g.label, []):
                out[g.label].append(g)
    return out


def test_readme_runs_table_agrees_with_the_module():
    grids = module_grids()
    listed = {}
    for label, spans, runs in readme_table_rows():
        if not spans:  # rows that reuse another row's runs ("Table 3's runs"): no grid
            assert runs == "-", label
            continue
        listed[label] = (sorted(spans), int(runs))
    ours = {
        label: (sorted((g.config, g.spec) for g in gs), experiments.count(gs))
        for label, gs in grids.items()
    }
    assert listed == ours


def test_every_run_of_the_paper_builds_and_validates():
    """All the module's runs (hundreds: one test, not parametrized); their arguments reach
    their fields."""
    runs = registry.get("paper").runs()
    assert len(runs) > 500
    for r in runs:
        validate_documented_run(pathlib.Path(r.config).name, r.arg)


@pytest.mark.parametrize("filename", [*sorted(PAPER), "cifar_scratch.py", "demo.py"])
def test_config_docstrings_point_to_the_listing_of_their_runs(filename):
    """A config's docstring names every experiment with runs of it (and no other), and the
    `aepg_jax.sweep` commands it gives select runs of it: the runs live in the module only."""
    doc, stem = load(filename).__doc__, filename.removesuffix(".py")
    assert not re.search(r"\bfor \w+ in [^;]+; do", doc)  # the runs are listed, not repeated
    uses = {e.name for e in paper.EXPERIMENTS if any(r.stem == stem for r in e.runs())}
    if filename != "demo.py":
        named = re.search(r"experiments ((?:`\w+`,? ?)+)\)", " ".join(doc.split()))
        assert named and set(re.findall(r"`(\w+)`", named[1])) == uses - {"paper"}, uses
        assert f"--experiment=paper --where=config={stem} --list" in doc
    commands = re.findall(r"python -m aepg_jax\.sweep --experiment=(\w+)(?: --where=(\S+))?", doc)
    assert commands
    for name, where in commands:
        runs = registry.get(name).runs()
        if where:
            runs = experiments.filter_runs(runs, where)
            assert runs and all(r.stem == stem for r in runs), (name, where)
        assert any(r.stem == stem for r in runs), (name, where)


def test_table1_has_210_runs_and_every_experiment_selects_runs_for_every_cell():
    assert len(registry.get("table1").runs()) == 210
    assert registry.get("tab:sota").name == "table1"
    for e, tables, _ in registry.get("paper").sections():
        for t in tables:
            assert all(len(r.paper) in (0, len(t.columns)) for r in t.rows), t.title
            for row, col in itertools.product(t.rows, t.columns):
                assert e.select({**row.where, **col.where}), (e.name, row.label, col.label)


def test_identical_configs_share_one_workdir():
    t3 = {r.name for r in registry.get("table3").runs()}
    t8 = {r.name for r in registry.get("table8").runs() if r.value("tau") == "6"}
    assert len(t8) == 10 and t8 <= t3  # Table 8's tau=6 is Table 3's aepg


# A second, independent transcription of a sample of cells: (experiment, row, column, text).
SAMPLE = [
    ("table1", "L2P", "A_5", "71.1±0.4"),
    ("table1", "DualPrompt", "Ã_20", "74.8±0.1"),
    ("table1", "InfLoRA", "A_20", "68.6±0.5"),
    ("table1", "LAE + aEPG", "A_10", "76.7±0.3"),
    ("table1", "LwfLoRA", "Ã_5", "80.4±0.2"),
    ("table2", "Adapter LAE", "CLRS25 A_5", "70.3±1.7"),
    ("table2", "Prefix LAE+aEPG", "CUB200 Ã_10", "84.5±0.3"),
    ("table3", "LS", "Food101 A_10", "77.5±0.4"),
    ("table3", "EP", "CUB200 A_10", "85.0±0.2"),
    ("table3", "aEPG", "CLRS25 Ã_5", "85.5±0.3"),
    ("table6", "aEPG", "CLRS25", "73.4±1.9"),
    ("table6", "CE", "S-CUB200", "79.5±0.3"),
    ("table4", "alpha = 0", "CIFAR100", "7.32±0.70"),
    ("table4", "alpha = 0.2", "CIFAR10", "95.81±0.05"),
    ("table8", "tau = 8", "CLRS25", "76.5"),
    ("fig4", "alpha = 0.2", "CIFAR100", "81"),
]


def _published(name, row_label, col_label):
    table = registry.get(name).tables[0]
    row = next(r for r in table.rows if r.label == row_label)
    col = next(c for c in table.columns if c.label == col_label)
    return table.published(row, col)


@pytest.mark.parametrize(("name", "row", "col", "text"), SAMPLE)
def test_sample_of_published_numbers(name, row, col, text):
    assert _published(name, row, col) == experiments.Published.parse(text)


def _tex_rows(label: str) -> list[list[tuple[float, float | None]]]:
    """The numbers (mean, pm) of each body row of the table carrying `\\label{label}`, read
    from the .tex (cells after the first; comments dropped)."""
    text = TEX.read_text()
    at = text.index(f"\\label{{{label}}}")
    body = text[text.rfind("\\begin{table", 0, at) : text.index("\\end{table", at)]
    body = "\n".join(re.sub(r"(?<!\\)%.*", "", line) for line in body.splitlines())
    rows = []
    for chunk in body.split("\\midrule", 1)[1].split("\\\\"):
        cells = chunk.split("&")
        nums = re.findall(r"([\d.]+)\s*}?\s*(?:\$?\\pm\$?\s*([\d.]+))?", "&".join(cells[1:]))
        if len(cells) > 1 and nums:
            rows.append([(float(m), float(p) if p else None) for m, p in nums])
    return rows


@pytest.mark.skipif(TEX is None, reason="no ../shared/paper/aepg_paper.tex beside the clone")
@pytest.mark.parametrize(
    ("name", "label"),
    [("table1", "tab:sota"), ("table2", "tab:lae"), ("table3", "tab:focal_all"),
     ("table6", "tab:label_noise"), ("table4", "tab:train-from-scratch"), ("table8", "tab:tau")],
)  # fmt: skip
def test_published_numbers_equal_the_tex(name, label):
    tex = _tex_rows(label)
    if name == "table8":  # alpha_start, alpha_end: the schedule's, not results
        tex = [row[2:] for row in tex]
    table = registry.get(name).tables[0]
    ours = [
        [(p.mean, p.pm) for p in (table.published(r, c) for c in table.columns)]
        for r in table.rows
        if r.paper
    ]
    assert len(ours) == len(tex) >= 2
    for got, want in zip(ours, tex, strict=True):
        assert len(got) == len(want), (got, want)
        for (gm, gp), (wm, wp) in zip(got, want, strict=True):
            assert math.isclose(gm, wm) and (gp == wp or math.isclose(gp, wp)), (got, want)


def test_list_prints_all_table1_runs_with_their_commands(tmp_path, capsys):
    assert sweep.main(["--experiment=table1", f"--workdir={tmp_path}", "--list"]) == 0
    out = capsys.readouterr().out.splitlines()
    heads = [line for line in out if line.startswith("[")]
    commands = [
        line.strip() for line in out if line.startswith("    ") and " -m aepg_jax.main" in line
    ]
    assert len(heads) == 210 and len(commands) == 210
    assert heads[0].startswith("[  1/210] todo    imagenet_r/")
    assert all("--config=configs/imagenet_r.py:tasks=" in c for c in commands)
    assert len({c.split("--workdir=")[1] for c in commands}) == 210


def test_slurm_script_is_valid_bash_with_sbatch_directives(tmp_path, capsys):
    argv = ["--experiment=table1", f"--workdir={tmp_path}/t1", "--slurm", "--array_size=16",
            "--gpus_per_worker=1", "--sbatch=--partition=gpu",
            "--config.model.checkpoint=/w/B 16.npz"]  # fmt: skip
    assert sweep.main(argv) == 0
    script = capsys.readouterr().out
    path = tmp_path / "t1.sbatch"
    path.write_text(script)
    subprocess.run(["bash", "-n", str(path)], check=True)
    lines = script.splitlines()
    assert lines[0] == "#!/bin/bash"
    directives = [line for line in lines if line.startswith("#SBATCH")]
    # sbatch reads directives only before the first command.
    first_command = next(i for i, line in enumerate(lines[1:], 1) if not line.startswith("#"))
    assert all(lines.index(d) < first_command for d in directives)
    options = dict((d.removeprefix("#SBATCH ") + "=").split("=")[:2] for d in directives)
    assert options["--array"] == "0-15" and options["--partition"] == "gpu"
    assert options["--gres"] == "gpu:1" and options["--output"].endswith("slurm-%A_%a.out")
    command = next(line for line in lines if "-m aepg_jax.sweep" in line)
    assert "--shard" not in command and "workers claiming them" in script  # sweep_claims
    assert "'--config.model.checkpoint=/w/B 16.npz'" in command


def test_shards_partition_the_runs():
    units = layout.units(registry.get("table1").runs())
    shards = [[u for _, u in layout.shard(units, i, 3)] for i in range(3)]
    assert sorted(map(len, shards)) == [70, 70, 70]
    names = [u.name for s in shards for u in s]
    assert sorted(names) == sorted(u.name for u in units) and len(set(names)) == 210


def test_vmap_seeds_groups_consecutive_seeds_of_a_cell():
    units = layout.units(registry.get("table1").runs(), vmap_seeds=True)
    assert len(units) == 42 and all(len(u.runs) == 5 for u in units)
    u = units[0]
    assert u.name == "imagenet_r/loss=ce,method=plain,tasks=5,seeds=0-4"
    assert "--config.num_seeds=5" in u.command("runs/t1") and ":tasks=5," in u.config_arg
