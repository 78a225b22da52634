"""Run folder names (aepg_jax/experiments/names.py): every run folder of every registered
experiment can be made (single runs, vmapped-seed programs, `+field=value` re-run folders, with
any override values), names that fit are those runs always had, a value never adds a path
level; a sweep records its selection and digests, and `aepg_jax.tables` shows that selection
and exits 0 once it read results; slow: one run of each field experiment through
`python -m aepg_jax.sweep` (stand-in weights and data) reaches training."""

from __future__ import annotations

import dataclasses
import json
import os
import pathlib
import shlex
import subprocess
import sys
import time

import pytest

from aepg_jax import main
from aepg_jax.experiments import Grid, Run, layout, names, registry
from aepg_jax.sweep import sweep
from aepg_jax.system import memory
from aepg_jax.tables import tables

REPO = pathlib.Path(__file__).resolve().parents[1]
FIELD = ("aper", "ease", "ranpac", "sd_lora", "slca", "hide_prompt")
# The sweep's overrides that change a run's result: none, one, and values that would add path
# levels or pass any length limit.
CHANGED = (
    (),
    (("optim.epochs", "3"),),
    (
        ("data.name", "../../x"),
        ("model.checkpoint", "/abs/" + "w" * 400),
        ("data.split_file", ".."),
        ("method.x", "a\x00b\nc%2F"),
    ),
)
STAMP = ".replaced-20261128-180000"  # what --rerun_changed appends


def _make(root: pathlib.Path, name: str) -> pathlib.Path:
    """Makes the run folder `name` under `root`: two levels, each within the limits."""
    path = root / name
    path.mkdir(parents=True, exist_ok=True)
    parts = path.resolve().relative_to(root.resolve()).parts
    assert len(parts) == 2, name
    assert all(len(p.encode()) <= names.MAX_BYTES for p in parts), name
    return path


def _make_every_folder(root: pathlib.Path, experiment: str) -> int:
    """Every folder a sweep of `experiment` may make, with seed folders in programs; the
    longest set aside as --rerun_changed does. Returns how many were made."""
    made, longest = set(), None
    runs = registry.get(experiment).runs()
    for vmapped in (False, True):
        for unit in layout.units(runs, vmapped):
            for changed in CHANGED:
                unit = dataclasses.replace(unit, changed=changed)
                path = _make(root, unit.name)
                made.add(unit.name)
                if unit.vmapped:
                    for run in unit.runs:
                        (path / f"seed_{run.seed}").mkdir(exist_ok=True)
                if longest is None or len(path.name) > len(longest.name):
                    longest = path
    os.rename(longest, f"{longest}{STAMP}")
    return len(made)


def test_every_run_folder_of_two_field_experiments_can_be_made(tmp_path):
    for name in ("slca", "hide_prompt"):  # the cheapest to list (every experiment: slow)
        runs = registry.get(name).runs()
        assert _make_every_folder(tmp_path / name, name) > 3 * len(runs)
        assert all((tmp_path / name / r.name).is_dir() for r in runs)


def test_the_workdirs_list_prints_can_be_made(tmp_path, capsys):
    for vmap in ([], ["--vmap_seeds"]):
        assert sweep.main(["--experiment=hide_prompt", "--list", *vmap]) == 0
        commands = [shlex.split(line) for line in capsys.readouterr().out.splitlines()
                    if " -m aepg_jax.main " in line]  # fmt: skip
        workdirs = [a.removeprefix("--workdir=<workdir>/") for c in commands for a in c
                    if a.startswith("--workdir=")]  # fmt: skip
        assert len(workdirs) == len(commands) == len(set(workdirs)) > 0
        for workdir in workdirs:
            _make(tmp_path, workdir)


@pytest.mark.slow
def test_every_run_folder_of_every_registered_experiment_can_be_made(tmp_path):
    for name in registry.registry():
        assert _make_every_folder(tmp_path / name, name) > 0


def test_names_that_fit_are_unchanged_and_long_overrides_are_digested():
    (run,) = Grid("configs/demo.py", "method=lae,seed=0").runs()
    assert run.name == "demo/loss=aepg,method=lae,seed=0"
    assert run.folder((("optim.epochs", "1"),)) == "demo/loss=aepg,method=lae,seed=0+optim.epochs=1"
    assert run.program_folder(0, 2) == "demo/loss=aepg,method=lae,seeds=0-2"
    short = (("optim.epochs", "20"), ("data.class_order_seed", "1993"))
    (run,) = Grid("configs/cifar100.py", "method=l2p,seed=0", overrides=short).runs()
    base = "cifar100/loss=aepg,method=l2p,seed=0"
    assert run.name == f"{base}+optim.epochs=20+data.class_order_seed=1993"
    # A field experiment's reference settings: one digest, the same for every seed of a cell.
    aper = [r for r in registry.get("aper").runs() if r.value("method") == "aper"]
    digest = names.token(aper[0].overrides)
    assert aper[0].name == f"cifar100/loss=ce,method=aper,peft=adapter,tasks=20,seed=0{digest}"
    assert all(r.name.endswith(digest) for r in aper if r.stem == "cifar100")
    assert aper[0].digested() == aper[0].overrides
    # The sweep's own overrides stay readable after the digest while they fit.
    assert aper[0].folder((("optim.epochs", "3"),)).endswith(f"{digest}+optim.epochs=3")


def test_no_value_adds_a_path_level():
    (run,) = Grid("configs/demo.py", "method=lae,seed=0").runs()
    for changed in (*CHANGED[2:], (("data.name", "../../x"),), (("data.name", "a/b"),)):
        folder = run.folder(changed)
        assert folder.count("/") == 1 and "\x00" not in folder and "\n" not in folder
    assert run.folder((("data.name", "../../x"),)).endswith("+data.name=..%2F..%2Fx")
    assert names.escape("..") == "%2E%2E" and names.escape("50%") == "50%25"
    odd = Run("configs/demo.py", (("method", ".."), ("seed", "0")), (("a", "/"),))
    assert odd.name.count("/") == 1 and "%2F" in odd.name


def test_a_value_holding_the_names_syntax_is_not_a_second_pair():
    """`+`, `=` and `,` in a field or value are escaped: a value `1+b=2` is not the pair b=2."""
    (run,) = Grid("configs/demo.py", "method=lae,seed=0").runs()
    one, two = run.folder((("a", "1+b=2"),)), run.folder((("a", "1"), ("b", "2")))
    assert one != two and one.endswith("+a=1%2Bb%3D2")
    sweep_side = run.folder((("data.name", "x+data.num_tasks=2"),))
    assert sweep_side != run.folder((("data.name", "x"), ("data.num_tasks", "2")))
    assert names.readable((("a,b", "c"),)) != names.readable((("a", "b,c"),))
    # The run's own arguments: `,` and `+` in a value are neither another argument nor a pair.
    args = [(("method", "lae"), ("x", "1,seed=0")), (("method", "lae,x=1"), ("seed", "0")),
            (("method", "lae"), ("x", "1+y=2")), (("method", "lae"), ("x", "1"))]  # fmt: skip
    folders = {Run("configs/demo.py", a).name for a in args[:3]}
    folders |= {Run("configs/demo.py", args[3], (("y", "2"),)).name}
    assert len(folders) == 4 and all(f.count("/") == 1 for f in folders)


def test_results_of_digested_runs_and_programs_are_found_by_their_names(tmp_path):
    """layout finds a run's results in its own folder and in a vmapped program of its cell,
    for the override set it was run with only."""
    runs = [r for r in registry.get("hide_prompt").runs() if r.stem == "cifar100"]
    seed1 = next(r for r in runs if r.seed == 1 and r.value("loss") == "ce")
    changed, other = (("optim.epochs", "3"),), (("optim.epochs", "4"),)
    for first, last, value, pairs in ((0, 2, 1.0, changed), (0, 2, 2.0, other)):
        program = _make(tmp_path, seed1.program_folder(first, last, pairs))
        (program / "seed_1").mkdir()
        (program / "seed_1" / "results.json").write_text(json.dumps({"A_T": value}))
    assert "+overrides-" in seed1.program_folder(0, 2, changed)
    assert layout.run_results(tmp_path, seed1, changed) == {"A_T": 1.0}
    assert layout.run_results(tmp_path, seed1, other) == {"A_T": 2.0}
    assert layout.run_results(tmp_path, seed1) is None
    own = _make(tmp_path, seed1.folder(changed))
    (own / "results.json").write_text(json.dumps({"A_T": 3.0}))
    assert layout.run_results(tmp_path, seed1, changed) == {"A_T": 3.0}  # its own folder first
    unit = layout.Unit(tuple(r for r in runs if r.value("loss") == "ce"), changed)
    assert unit.vmapped and unit.name == seed1.program_folder(0, 2, changed)


def _fake_execute(calls, monkeypatch):
    """main.execute without training: records the workdir, writes results.json there."""
    monkeypatch.setattr(memory, "apply_default", lambda: False)

    def execute(cfg, workdir):
        calls.append(workdir)
        results = {"A_T": 40.0 + cfg.seed, "avg_inc_acc": 50.0}
        pathlib.Path(workdir, "results.json").write_text(json.dumps(results))
        return results

    return execute


def test_a_field_run_starts_in_its_folder_and_the_sweep_records_its_digest(
    tmp_path, monkeypatch, capsys
):
    calls = []
    monkeypatch.setattr(main, "execute", _fake_execute(calls, monkeypatch))
    root = tmp_path / "runs"
    where = "config=cifar100,method=aper,loss=ce,seed=0"
    argv = ["--experiment=aper", f"--workdir={root}", f"--where={where}", "--compile_cache="]
    assert sweep.main([*argv, *_tiny_flags(tmp_path / "cache")]) == 0
    (workdir,) = calls
    folder = pathlib.Path(workdir).relative_to(root)
    assert str(folder).startswith("cifar100/loss=ce,method=aper,peft=adapter,tasks=20,seed=0+")
    assert (root / folder / "results.json").exists()
    record = json.loads((root / layout.SWEEP_FILE).read_text())
    assert record["where"] == where
    (digest, pairs), *_ = record["digests"].items()
    (run,) = [r for r in registry.get("aper").runs() if str(folder).startswith(r.name[:60])]
    assert folder.name.endswith(f"+{names.DIGEST_TAG}{digest}")
    assert [tuple(p) for p in pairs[: len(run.overrides)]] == list(run.overrides)
    assert sweep.main([*argv, "--status", *_tiny_flags(tmp_path / "cache")]) == 0
    assert "1 done" in capsys.readouterr().out  # found again by its name
    # A value with `/` names the folder, never a path: the run stays two levels below root.
    flags = [*_tiny_flags(tmp_path / "cache"), "--config.data.name=../../x"]
    assert sweep.main([*argv, *flags]) == 0
    assert len(calls) == 2 and pathlib.Path(calls[1]).parent.parent == root


def test_tables_show_the_sweeps_selection_and_exit_0(tmp_path, monkeypatch, capsys):
    calls = []
    monkeypatch.setattr(main, "execute", _fake_execute(calls, monkeypatch))
    root = tmp_path / "demo"
    where = "method=plain,loss=ce,seed=0"
    argv = ["--experiment=demo", f"--workdir={root}", f"--where={where}", "--compile_cache="]
    assert sweep.main(argv) == 0 and len(calls) == 1
    capsys.readouterr()
    html = tmp_path / "report.html"
    assert tables.main([str(root), "--no_plots", f"--html={html}"]) == 0
    out, err = capsys.readouterr()
    shown = f"runs --where={where} (recorded by the sweep of {root}; --where= shows every run)"
    assert out.startswith(f"Shown: {shown}.\n") and "warning" not in err, err
    assert "| LoRA | 40.0 (n=1) |" in out
    assert f"runs --where={where} (recorded by the sweep of {root}" in html.read_text()
    # Every run: the missing ones in their cells and one line, still exit 0.
    assert tables.main([str(root), "--no_plots", "--where="]) == 0
    out, err = capsys.readouterr()
    assert "Shown:" not in out and "(1/3 done)" in out
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("warning: 18 of 18 cells have runs without ")


# ------------------------------------------------------------- slow: the field's runs for real


def _tiny_flags(cache: pathlib.Path) -> list[str]:
    """Stand-ins for a paper config's weights and data: the tiny timm ViT fixture (its
    architecture) on digits, 2 tasks of 2 steps."""
    fixture = REPO / "tests" / "fixtures" / "timm_tiny_vit.npz"
    fields = {
        "model.checkpoint": fixture, "model.patch_size": 8, "model.hidden_size": 32,
        "model.depth": 2, "model.num_heads": 2, "model.mlp_dim": 128, "model.image_size": 32,
        "model.peft.blocks": "(0,1)", "data.source": "digits", "data.num_tasks": 2,
        "data.store_size": 32, "data.cache_dir": cache, "pretrain.cache_dir": cache / "pre",
        "optim.epochs": 1, "optim.batch_size": 16, "max_steps_per_task": 2,
        "eval.batch_size": 64, "tensorboard": False,
    }  # fmt: skip
    return [f"--config.{k}={v}" for k, v in fields.items()]


@pytest.mark.slow
@pytest.mark.parametrize("name", FIELD)
def test_one_run_of_each_field_experiment_reaches_training(name, tmp_path):
    root = tmp_path / "runs"
    where = "config=cifar100,loss=ce,seed=0" + (",method=aper" if name == "aper" else "")
    command = [sys.executable, "-m", "aepg_jax.sweep", f"--experiment={name}",
               f"--workdir={root}", f"--where={where}", "--compile_cache=",
               *_tiny_flags(tmp_path / "cache")]  # fmt: skip
    if name == "ranpac":  # its default width 10000: a 400 MB Gram matrix checkpointed per task
        command.append("--config.method.ranpac_m=64")
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    start = time.monotonic()
    proc = subprocess.run(command, cwd=REPO, env=env, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    (metrics,) = root.glob("cifar100/*/metrics.jsonl")
    assert len(metrics.parent.name.encode()) <= names.MAX_BYTES
    records = [json.loads(line) for line in metrics.read_text().splitlines()]
    assert any(r.get("type") == "train" for r in records), records[:3]
    assert (metrics.parent / "results.json").exists()
    print(f"{name}: {time.monotonic() - start:.0f} s")
