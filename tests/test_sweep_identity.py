"""A sweep never counts a run of another config as done, and the tables never show one as the
experiment's: a `--config.*` override that changes results gives the runs names of their own, a
run folder holding another config stops the sweep in one line (or is set aside with
`--rerun_changed`), and the tables leave such results out, naming the fields. Also what the
sweep says: the values `--where` can take, `--list` commands runnable as printed, no shard
without `--shard`."""

from __future__ import annotations

import json
import os
import pathlib
import shlex

import pytest
import sweep_fake

from aepg_jax import main
from aepg_jax.experiments import registry
from aepg_jax.sweep import sweep
from aepg_jax.system import memory
from aepg_jax.tables import tables


@pytest.fixture
def fake(tmp_path, monkeypatch):
    """The fake experiment, and main.execute replaced by one that saves config.json and
    results.json as a run does (A_T = 10 x epochs + seed)."""
    monkeypatch.setattr(memory, "apply_default", lambda: False)
    calls = []

    def execute(cfg, workdir):
        config = json.loads(cfg.to_json_best_effort())
        calls.append(os.path.relpath(workdir, tmp_path / "runs"))
        results = {"A_T": 10.0 * cfg.optim.epochs + cfg.seed, "avg_inc_acc": 1.0}
        pathlib.Path(workdir, "config.json").write_text(json.dumps(config))
        pathlib.Path(workdir, "results.json").write_text(json.dumps({**results, "config": config}))
        return results

    monkeypatch.setattr(main, "execute", execute)
    path = sweep_fake.write(tmp_path)
    return path, tmp_path / "runs", calls


def _argv(path, root, *extra):
    return [f"--experiment={path}", f"--workdir={root}", "--compile_cache=", *extra]


def _one_error_line(capsys) -> str:
    err = capsys.readouterr().err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), err
    return lines[0]


def test_an_override_that_changes_results_runs_under_its_own_name(fake, capsys):
    path, root, calls = fake
    one = "--where=loss=ce,seed=0"
    assert sweep.main(_argv(path, root, one, "--config.optim.epochs=3")) == 0
    assert calls == ["fake_config/loss=ce,seed=0+optim.epochs=3"]
    capsys.readouterr()
    # The same sweep without the override: the experiment's run is not done, it runs.
    assert sweep.main(_argv(path, root, one)) == 0
    assert "1 run: 0 done, 1 to run." in capsys.readouterr().out
    assert calls[1] == "fake_config/loss=ce,seed=0"
    # An override that changes nothing the results depend on keeps the name (and is done).
    assert sweep.main(_argv(path, root, one, f"--config.data.cache_dir={root}/c")) == 0
    assert "1 run: 1 done, 0 to run." in capsys.readouterr().out and len(calls) == 2
    text = tables.render(str(root), registry.get(path), "markdown")
    assert "| CE | 20.0 (1/2 done) |" in text  # the 2-epoch run only, never the 3-epoch 30.0


def test_a_folder_holding_another_config_stops_the_sweep_or_is_set_aside(fake, capsys):
    path, root, calls = fake
    one = "--where=loss=ce,seed=0"
    assert sweep.main(_argv(path, root, one)) == 0
    run = root / "fake_config/loss=ce,seed=0"
    saved = json.loads((run / "config.json").read_text())
    saved["optim"]["epochs"] = 1  # as if the config file had changed since it ran
    (run / "config.json").write_text(json.dumps(saved))
    results = json.loads((run / "results.json").read_text())
    (run / "results.json").write_text(json.dumps({**results, "config": saved}))
    calls.clear()
    capsys.readouterr()
    with pytest.raises(SystemExit) as err:
        sweep.main(_argv(path, root, one))
    line = _one_error_line(capsys)
    assert err.value.code == 2 and calls == []
    assert line == (
        f"error: {run} holds a run of another config (differs in: optim.epochs); nothing ran: "
        "pass --rerun_changed to keep such runs as <run>.replaced-<time> and run this config "
        "afresh, or use another --workdir."
    )
    # The tables (of the sweep's selection) leave it out, naming it and the field; no run
    # shown has results (exit 1).
    assert tables.main([str(root), f"--experiment={path}", "--no_plots"]) == 1
    out, err_text = capsys.readouterr()
    assert out.startswith(f"Shown: runs --where=loss=ce,seed=0 (recorded by the sweep of {root};")
    assert "| CE | — (0/1 done, 1 of another config) |" in out
    assert "loss=ce,seed=0: its results are of another config than the experiment's " in err_text
    assert "(differs in: optim.epochs)" in err_text
    # --rerun_changed keeps the old folder beside and runs this config afresh.
    assert sweep.main(_argv(path, root, one, "--rerun_changed")) == 0
    assert calls == ["fake_config/loss=ce,seed=0"]
    kept = list(run.parent.glob("loss=ce,seed=0.replaced-*"))
    assert len(kept) == 1 and json.loads((kept[0] / "config.json").read_text()) == saved
    assert "kept the run of another config as " in capsys.readouterr().out
    # No result of another config is left (exit 0); the cell's other seed, not selected by
    # the sweep, has not run: one line with every run.
    assert tables.main([str(root), f"--experiment={path}", "--no_plots"]) == 0
    out, err_text = capsys.readouterr()
    assert "| CE | 20.0 (n=1) |" in out and err_text == ""
    assert tables.main([str(root), f"--experiment={path}", "--no_plots", "--where="]) == 0
    out, err_text = capsys.readouterr()
    assert "| CE | 20.0 (1/2 done) |" in out and "Shown:" not in out
    assert err_text.count("warning:") == 1 and "4 of 4 cells have runs without results" in err_text


def test_where_names_the_values_that_exist(fake, capsys):
    path, _, _ = fake
    with pytest.raises(SystemExit) as err:
        sweep.main([f"--experiment={path}", "--list", "--where=loss=lora"])
    assert err.value.code == 2
    assert _one_error_line(capsys) == (
        "error: --where=loss=lora: loss=lora matches none of fake's runs; loss is one of aepg, ce."
    )
    with pytest.raises(SystemExit):
        sweep.main(["--experiment=demo", "--list", "--where=method=plain,loss=ce/lora"])
    line = _one_error_line(capsys)
    assert line.endswith(": loss=lora matches none of demo's runs; loss is one of aepg, ce.")
    # Each value exists, their combination in no run (plain's heads are N(0, s^2) only): every
    # key named.
    with pytest.raises(SystemExit):
        sweep.main(["--experiment=field_claims", "--list", "--where=method=plain,head_init=linear"])
    line = _one_error_line(capsys)
    assert line.startswith(
        "error: --where=method=plain,head_init=linear matches none of field_claims's runs; "
        "method is one of aper, coda_prompt, "
    )
    assert line.endswith("; head_init is one of linear, normal, trunc_normal, uniform, official.")


FIELD_CLAIMS_SLCA = "--where=method=slca,head_init=official,seed=0/1/2"


def _listed(capsys) -> list[str]:
    """The run or program names `--list` printed."""
    lines = capsys.readouterr().out.splitlines()
    return [x.split()[-1] for x in lines if x.startswith("[")]


def test_where_takes_several_values_and_the_official_head_init(capsys):
    assert (
        sweep.main(["--experiment=field_claims", "--list", "--no-vmap_seeds", FIELD_CLAIMS_SLCA])
        == 0
    )
    # SLCA's official heads are trunc_normal (its code's): CE and aEPG, seeds 0-2, no N(0, s^2).
    leaves = [f"head_init=trunc_normal,loss={loss},method=slca,seed={s}" for loss in ("ce", "aepg")
              for s in (0, 1, 2)]  # fmt: skip
    assert _listed(capsys) == [f"claims/{leaf}" for leaf in leaves]
    # By default its seeds are vmapped: the same 6 runs as one program per loss.
    assert sweep.main(["--experiment=field_claims", "--list", FIELD_CLAIMS_SLCA]) == 0
    out = capsys.readouterr().out
    assert [x.split()[-1] for x in out.splitlines() if x.startswith("[")] == [
        f"claims/head_init=trunc_normal,loss={loss},method=slca,seeds=0-2"
        for loss in ("ce", "aepg")
    ]
    assert out.count("--config.num_seeds=3") == 2
    assert "6 runs as 2 programs (seeds vmapped; --no-vmap_seeds: one each)" in out
    # Where the official init is N(0, s^2), official and normal select the same runs.
    plain = "--where=method=plain,loss=ce,head_init={},seed=0"
    assert sweep.main(["--experiment=field_claims", "--list", plain.format("official")]) == 0
    official = _listed(capsys)
    assert sweep.main(["--experiment=field_claims", "--list", plain.format("normal")]) == 0
    assert _listed(capsys) == official == ["claims/head_init=normal,loss=ce,method=plain,seed=0"]


def test_a_bad_where_value_names_its_key_and_the_valid_values(capsys):
    for where, key, valid in (
        ("method=slca,seed=0/7", "seed=7", "seed is one of 0, 1, 2, 3, 4"),
        ("head_init=offical", "head_init=offical",
         "head_init is one of linear, normal, trunc_normal, uniform, official"),
    ):  # fmt: skip
        with pytest.raises(SystemExit) as err:
            sweep.main(["--experiment=field_claims", "--list", f"--where={where}"])
        assert err.value.code == 2
        assert _one_error_line(capsys) == (
            f"error: --where={where}: {key} matches none of field_claims's runs; {valid}."
        )


def test_list_prints_commands_runnable_as_printed_and_names_say_method_and_loss(capsys):
    assert sweep.main(["--experiment=demo", "--list", "--where=seed=0"]) == 0
    out = capsys.readouterr().out
    assert "demo/loss=aepg,method=lae,seed=0" in out  # the demo's defaults, named
    commands = [line.strip() for line in out.splitlines() if line.startswith("    ")]
    assert len(commands) == 6
    for command in commands:
        program = shlex.split(command)[0]
        assert os.access(program, os.X_OK), command  # this Python, not a bare `python`
        assert shlex.split(command)[1:3] == ["-m", "aepg_jax.main"]


def test_the_count_line_names_a_shard_only_with_shard(fake, capsys):
    path, root, _ = fake
    assert sweep.main(_argv(path, root)) == 0
    assert capsys.readouterr().out.startswith("4 runs: 0 done, 4 to run.")
    assert sweep.main(_argv(path, root, "--shard=1/2")) == 0
    assert capsys.readouterr().out.startswith("2 of 4 runs in shard 1/2: 2 done, 0 to run.")


@pytest.mark.parametrize("module", ["main", "sweep", "tables", "plan", "checkpoints.inspect"])
def test_help_says_what_the_command_does_without_pointing_into_the_source(module):
    import subprocess
    import sys

    out = subprocess.run(
        [sys.executable, "-m", f"aepg_jax.{module}", "--help"],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    text = out.stdout.partition("\nflags:\n")[0]  # absl's flag list names its modules
    text = text.replace("~/.cache/aepg_jax/", "~/.cache/")  # the user cache's folder: no source
    assert out.returncode == 0, out.stderr[-2000:]
    assert "aepg_jax/" not in text and ".py`" not in text and "inspect.py" not in text, text
    if module in ("main", "sweep", "plan"):
        assert "python -m pydoc aepg_jax.config.schema" in text  # where the fields are


def test_inspect_exits_1_on_a_file_that_is_not_a_vit(tmp_path):
    import subprocess
    import sys

    import numpy as np

    np.savez(tmp_path / "x.npz", a=np.zeros(3))
    out = subprocess.run(
        [sys.executable, "-m", "aepg_jax.checkpoints.inspect", str(tmp_path / "x.npz")],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert out.returncode == 1 and "loads:       NO: Not a ViT checkpoint" in out.stdout
