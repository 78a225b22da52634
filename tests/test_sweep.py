"""aepg_jax.sweep and aepg_jax.tables: a failing run is reported and the others go on, finished
runs are skipped, the tables of a small fake results tree are exactly as expected (markdown,
LaTeX, csv); slow: real tiny runs through the CLI, SIGKILLed in the middle and restarted, and
split over three concurrent shards, end with the tables of one uninterrupted sweep."""

from __future__ import annotations

import json
import os
import pathlib
import signal
import subprocess
import sys
import time

import pytest
import sweep_fake
from tiny import child_cpu_seconds

from aepg_jax import main
from aepg_jax.experiments import Column, Experiment, Grid, Row, Table, layout, registry
from aepg_jax.sweep import sweep
from aepg_jax.system import memory
from aepg_jax.tables import tables

REPO = pathlib.Path(__file__).resolve().parents[1]

FAKE = Experiment(
    "fake",
    "fake",
    [Grid("configs/demo.py", "loss=ce/aepg,seed=0/1/2")],
    [
        Table(
            "Fake table",
            label="tab:fake",
            columns=[
                Column("A_5", {}, "A_T", "$A_{5}$"),
                Column("Ã_5", {}, "avg_inc_acc", r"$\tilde{A}_{5}$"),
            ],
            rows=[
                Row("CE", {"loss": "ce"}, ["50.5±0.2", ""]),
                Row("LoRA_aEPG", {"loss": "aepg"}, ["60.4", ""]),
            ],
        )
    ],
)


def _write_fake_tree(root: pathlib.Path) -> None:
    """CE: 3 seeds done; aEPG: seeds 0, 1 done, seed 2 failed."""
    values = {("ce", 0): (50, 70), ("ce", 1): (52, 71), ("ce", 2): (54, 72)}
    values |= {("aepg", 0): (60, 80), ("aepg", 1): (61, 82)}
    for run in FAKE.runs():
        directory = root / run.name
        directory.mkdir(parents=True)
        key = (run.value("loss"), run.seed)
        if key in values:
            a_t, avg = values[key]
            (directory / "results.json").write_text(json.dumps({"A_T": a_t, "avg_inc_acc": avg}))
        else:
            (directory / layout.ERROR_FILE).write_text("loss.name='x' is unknown\n")


MARKDOWN = """\
### Fake table

|  | A_5 ours | A_5 paper | A_5 Δ | Ã_5 ours | Ã_5 paper | Ã_5 Δ |
|---|---:|---:|---:|---:|---:|---:|
| CE | 52.0 ± 2.0 (n=3) | 50.5 ± 0.2 | +1.5 (!) | 71.0 ± 1.0 (n=3) |  |  |
| LoRA_aEPG | 60.5 ± 0.7 (2/3 done, 1 failed) | 60.4 | +0.1 | 81.0 ± 1.4 (2/3 done, 1 failed) |  |  |

ours: mean ± std over seeds (n runs; `k/n done` while runs are missing); Δ = ours - paper; (!): |Δ| > max(1, 2 x paper ±).

#### aEPG - CE (paired): Fake table

|  | A_5 | Ã_5 |
|---|---:|---:|
| LoRA_aEPG - CE | +9.50 [+3.15, +15.85] wins 2/2 (2/3 pairs) | +10.50 [+4.15, +16.85] wins 2/2 (2/3 pairs) |

paired: per seed, the row's value minus its CE row's (same seed and settings); mean over the seeds both finished [95% CI, Student t with n - 1 df] and wins: seeds where the row is better (higher accuracy; lower ECE, NLL, forgetting), none for entropies and other metrics with no better direction.
"""  # noqa: E501

LATEX = r"""% Fake table (paper: tab:fake)
% ours: mean ± std over seeds (n runs; k/n done while runs are missing); Δ = ours - paper; (!): |Δ| > max(1, 2 x paper ±).
\begin{tabular}{lrrrrrr}
\toprule
 & \multicolumn{3}{c}{$A_{5}$} & \multicolumn{3}{c}{$\tilde{A}_{5}$} \\
\cmidrule(lr){2-4} \cmidrule(lr){5-7}
Method & ours & paper & $\Delta$ & ours & paper & $\Delta$ \\
\midrule
CE & 52.0 $\pm$ 2.0 (n=3) & 50.5 $\pm$ 0.2 & +1.5 (!) & 71.0 $\pm$ 1.0 (n=3) &  &  \\
LoRA\_aEPG & 60.5 $\pm$ 0.7 (2/3 done, 1 failed) & 60.4 & +0.1 & 81.0 $\pm$ 1.4 (2/3 done, 1 failed) &  &  \\
\bottomrule
\end{tabular}

% aEPG - CE (paired): Fake table
% paired: per seed, the row's value minus its CE row's (same seed and settings); mean over the seeds both finished [95% CI, Student t with n - 1 df] and wins: seeds where the row is better (higher accuracy; lower ECE, NLL, forgetting), none for entropies and other metrics with no better direction.
\begin{tabular}{lrr}
\toprule
 & $A_{5}$ & $\tilde{A}_{5}$ \\
\midrule
LoRA\_aEPG - CE & +9.50 [+3.15, +15.85] wins 2/2 (2/3 pairs) & +10.50 [+4.15, +16.85] wins 2/2 (2/3 pairs) \\
\bottomrule
\end{tabular}
"""  # noqa: E501


def test_markdown_and_latex_of_a_fake_results_tree(tmp_path):
    _write_fake_tree(tmp_path)
    assert tables.render(str(tmp_path), FAKE, "markdown") == MARKDOWN
    assert tables.render(str(tmp_path), FAKE, "latex") == LATEX
    rows = tables.render(str(tmp_path), FAKE, "csv").splitlines()
    assert rows[0] == ",".join(tables.CSV_FIELDS)
    assert rows[1] == "Fake table,CE,A_5,A_T,3,3,0,52.0,2.0,50.5,0.2,1.5,1,,,,,,,,"
    # aEPG - CE by seed: (60 - 50, 61 - 52) = (10, 9); 9.5 ± t(0.975, 1) x 0.7071 / √2.
    *_, against, n, total, mean, lo, hi, wins = rows[3].split(",")
    assert (against, n, total, mean, wins) == ("CE", "2", "3", "9.5", "2")
    assert float(lo) == pytest.approx(3.1468976319138156, abs=1e-9)
    assert float(hi) == pytest.approx(15.853102368086184, abs=1e-9)
    assert len(rows) == 5


def test_tables_cli_reads_the_experiment_the_sweep_recorded(tmp_path, capsys):
    layout.write_sweep_file(tmp_path, "demo")
    # Nothing done yet: the runs without results are counted, and the exit status says so.
    assert tables.main([str(tmp_path), "--format=csv", "--out", str(tmp_path / "t.csv")]) == 1
    text = (tmp_path / "t.csv").read_text()
    assert text.count("\n") == 1 + 6 * 3 and ",0,3,0,,,,,,0" in text  # 6 rows x 3 columns
    (tmp_path / "empty").mkdir()
    with pytest.raises(SystemExit) as err:
        tables.main([str(tmp_path / "empty")])
    assert err.value.code == 2 and "--experiment=NAME" in capsys.readouterr().err
    with pytest.raises(SystemExit) as err:
        tables.main([str(tmp_path / "nothing")])
    assert err.value.code == 2 and "nothing does not exist" in capsys.readouterr().err


def _fake_execute(calls, monkeypatch):
    """Stands in for main.execute in the fast tests: records the call, writes results.json.
    (The test process keeps its allocator settings: memory.apply_default is not applied.)"""
    monkeypatch.setattr(memory, "apply_default", lambda: False)

    def execute(cfg, workdir):
        calls.append((cfg.loss.name, cfg.seed, cfg.optim.epochs, workdir))
        if cfg.data.num_tasks > 10:  # what the real run finds once it has loaded digits
            raise ValueError(f"Invalid config: data.num_tasks={cfg.data.num_tasks} exceeds 10.")
        results = {"A_T": 40.0 + cfg.seed, "avg_inc_acc": 50.0}
        pathlib.Path(workdir, "results.json").write_text(json.dumps(results))
        return results

    return execute


def test_failing_run_is_reported_and_the_others_run(tmp_path, monkeypatch, capsys):
    path = sweep_fake.write(tmp_path, failing=True)
    calls = []
    monkeypatch.setattr(main, "execute", _fake_execute(calls, monkeypatch))
    argv = [f"--experiment={path}", f"--workdir={tmp_path}/runs", "--config.optim.epochs=3"]
    assert sweep.main([*argv, "--compile_cache="]) == sweep.EXIT_FAILED_RUNS
    out, err = capsys.readouterr()
    assert sorted((c[0], c[1], c[2]) for c in calls) == [
        ("aepg", 0, 3), ("aepg", 1, 3), ("ce", 0, 3), ("ce", 1, 3), ("ce", 5, 3)
    ]  # fmt: skip
    lines = [line for line in out.splitlines() if line.startswith("[")]
    # --config.optim.epochs=3 changes the runs' result: they run under names of their own.
    ce1 = "[2/5] fake_config/loss=ce,seed=1+optim.epochs=3  done A_T 41.00"
    assert len(lines) == 5 and any(line.startswith(ce1) for line in lines), out
    name = "fake_config/loss=ce,seed=5+data.num_tasks=11+optim.epochs=3"
    failed = [line for line in lines if line.startswith(f"[5/5] {name}  FAILED: ")]
    assert failed and "data.num_tasks=11 exceeds 10" in failed[0]
    assert "error: 1 of 5 runs failed" in err
    bad = tmp_path / "runs" / name
    assert "data.num_tasks=11" in (bad / layout.ERROR_FILE).read_text()
    text = tables.render(f"{tmp_path}/runs", registry.get(path), "markdown")
    assert "| CE | — (0/3 done) |" in text  # the experiment's own config never ran

    calls.clear()  # again: only the failed run is tried, and it fails again
    assert sweep.main([*argv, "--compile_cache="]) == sweep.EXIT_FAILED_RUNS
    assert [c[1] for c in calls] == [5] and "5 runs: 4 done, 1 to run." in capsys.readouterr().out


def test_where_and_shard_select_runs(tmp_path, monkeypatch, capsys):
    path = sweep_fake.write(tmp_path)
    calls = []
    monkeypatch.setattr(main, "execute", _fake_execute(calls, monkeypatch))
    base = [f"--experiment={path}", f"--workdir={tmp_path}/runs", "--compile_cache="]
    assert sweep.main([*base, "--where=loss=aepg", "--shard=1/2"]) == 0
    assert [(c[0], c[1]) for c in calls] == [("aepg", 1)]
    for bad in (["--shard=2/2"], ["--where=loss=nope"], ["--shard=x"]):
        with pytest.raises(SystemExit) as err:
            sweep.main([*base, *bad])
        assert err.value.code == 2
    assert capsys.readouterr().err.count("error: ") == 3


def _one_error_line(capsys) -> str:
    err = capsys.readouterr().err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), err
    return lines[0]


def test_a_misspelt_override_stops_the_sweep_before_any_run(tmp_path, monkeypatch, capsys):
    path = sweep_fake.write(tmp_path)
    calls = []
    monkeypatch.setattr(main, "execute", _fake_execute(calls, monkeypatch))
    base = [f"--experiment={path}", f"--workdir={tmp_path}/runs", "--compile_cache="]
    for bad, says in (
        ("--config.optim.epoch=2", "--config.optim.epoch: the config has no field 'epoch'"),
        ("--config.optim.epochs=x", "--config.optim.epochs"),
        ("--config.optim.epochs=-1", "optim.epochs"),  # the trainer's validation refuses it
    ):
        for extra in ([], ["--list"]) if "epoch=" in bad else ([],):
            with pytest.raises(SystemExit) as err:
                sweep.main([*base, bad, *extra])
            line = _one_error_line(capsys)
            assert err.value.code == 2 and says in line, line
            assert "fake_config/loss=ce,seed=0" in line, line
    assert calls == [] and not (tmp_path / "runs").exists()  # nothing ran, nothing written


def test_a_problem_of_the_runs_own_configs_stops_the_sweep_in_one_line():
    """Table 1's runs fail validation until model.checkpoint is given: one line for all of
    them, before any run; an override that adds a problem of its own is named as the
    override's, with the first run it breaks."""
    from aepg_jax.sweep import preflight

    units = layout.units(registry.get("demo").runs()[:3])

    def validate(cfg):
        problems = ["model.checkpoint is needed."]
        if cfg.optim.epochs < 1:
            problems.append("optim.epochs must be >= 1.")
        raise ValueError("Invalid config: " + "; ".join(problems))

    for overrides in ([], ["--config.optim.epochs=3"]):
        with pytest.raises(ValueError) as err:
            preflight.check(units, overrides, validate)
        assert str(err.value) == (
            "Invalid config: model.checkpoint is needed (for all 3 runs); nothing ran: fix it "
            "with --config.<field>=<value> or in the experiment's config file."
        )
    with pytest.raises(ValueError, match=r"optim.epochs must be >= 1.* for run demo/"):
        preflight.check(units, ["--config.optim.epochs=0"], validate)

    def some(cfg):
        if cfg.seed == 1:
            raise ValueError("Invalid config: seed 1 is broken.")

    with pytest.raises(ValueError, match=r"seed 1 is broken \(for 1 of the 3 runs, e.g. demo/"):
        preflight.check(units, [], some)


def test_table1_without_its_weights_is_one_line_and_no_run_folder(tmp_path):
    """The README's paper command without --config.model.checkpoint: exit 2, one line naming
    the field and the 210 runs, within a minute of CPU, nothing written."""
    start = child_cpu_seconds()
    proc = subprocess.run(
        [sys.executable, "-m", "aepg_jax.sweep", "--experiment=table1", f"--workdir={tmp_path}/t1"],
        cwd=REPO, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    lines = (proc.stdout + proc.stderr).strip().splitlines()
    assert proc.returncode == 2 and len(lines) == 1, proc.stdout + proc.stderr
    assert "model.init=augreg needs model.checkpoint=" in lines[0]
    assert "(for all 210 runs)" in lines[0]
    assert child_cpu_seconds() - start < 60 and not (tmp_path / "t1").exists()


def test_command_line_mistakes_are_one_line(tmp_path, capsys):
    path = sweep_fake.write(tmp_path)
    for argv, says in (
        ([f"--experiment={path}"], "--workdir is required"),
        ([], "the following arguments are required: --experiment"),
        ([f"--experiment={path}", "--workdir=x", "--bogus"], "unknown arguments: --bogus"),
        ([f"--experiment={path}", "--list", "--where=foo=bar"], "'foo' is not an argument"),
    ):
        with pytest.raises(SystemExit) as err:
            sweep.main(argv)
        assert err.value.code == 2 and says in _one_error_line(capsys)


def test_list_and_status_without_and_with_a_workdir(tmp_path, capsys):
    path = sweep_fake.write(tmp_path)
    assert sweep.main([f"--experiment={path}", "--list"]) == 0
    out = capsys.readouterr().out
    assert out.count(" unknown ") == 4 and "--workdir=<workdir>/fake_config/loss=ce,seed=0" in out
    root = tmp_path / "runs"
    runs = registry.get(path).runs()
    done, failed, held, _ = (root / r.name for r in runs)
    for d in (done, failed, held):
        d.mkdir(parents=True)
    (done / "results.json").write_text(json.dumps({"A_T": 1.0}))
    (failed / layout.ERROR_FILE).write_text("optim.epochs=-1 must be >= 1.\n")
    (held / "config.json").write_text(json.dumps({"data": {"num_tasks": 2}}))
    (held / "metrics.jsonl").write_text(json.dumps({"type": "eval", "task": 0}) + "\n")
    from aepg_jax.runs import lock

    with lock.hold(str(held)):
        assert sweep.main([f"--experiment={path}", f"--workdir={root}", "--status"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].startswith("[1/4] done    fake_config/loss=ce,seed=0")
    assert lines[1].endswith("(optim.epochs=-1 must be >= 1.)") and " failed " in lines[1]
    assert " running " in lines[2] and f"pid {os.getpid()} since " in lines[2]
    assert lines[2].endswith(", task 2 of 2)") and " todo " in lines[3]
    assert lines[4] == "1 done, 1 failed, 1 running, 1 todo"


def test_a_listing_into_a_closed_pipe_ends_quietly_and_leaves_sigpipe_alone(tmp_path, capsys):
    """`--list | head`: a reader gone before the listing is written ends it with status 0 and
    nothing on stderr; run inside another process, the listing leaves that process's SIGPIPE
    disposition as it was (SIGPIPE's default action would end the process at its next write
    to a closed pipe or socket, on any thread, without a word)."""
    path = sweep_fake.write(tmp_path)
    before = signal.getsignal(signal.SIGPIPE)
    assert sweep.main([f"--experiment={path}", "--list"]) == 0
    assert signal.getsignal(signal.SIGPIPE) == before
    capsys.readouterr()
    proc = subprocess.Popen(
        [sys.executable, "-m", "aepg_jax.sweep", f"--experiment={path}", "--list"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    proc.stdout.close()  # the reader is gone before the first line
    err = proc.stderr.read()
    assert (proc.wait(), err) == (0, "")


def test_tables_name_missing_runs_damaged_seed_files_and_non_objects(tmp_path, capsys):
    """A run not run yet, a results.json holding a list, and a damaged seed file of a vmapped
    program are each named; the tables still print and the command exits 0 (results were
    read), 1 once no run shown has results."""
    _write_fake_tree(tmp_path)
    runs = {(r.value("loss"), r.seed): r for r in FAKE.runs()}
    (tmp_path / runs["ce", 0].name / "results.json").write_text("[1, 2]")  # not an object
    (tmp_path / runs["ce", 1].name / "results.json").unlink()  # not run yet
    seed = runs["ce", 2]
    (tmp_path / seed.name / "results.json").unlink()
    program = tmp_path / seed.program_folder(0, 2)
    (program / "seed_2").mkdir(parents=True)
    (program / "seed_2" / "results.json").write_text('{"A_T": 5')  # truncated
    layout.write_sweep_file(tmp_path, "x")
    fake = tmp_path / "fake.py"
    fake.write_text("from test_sweep import FAKE as EXPERIMENT\n")
    assert tables.main([str(tmp_path), f"--experiment={fake}", "--no_plots"]) == 0
    out, err = capsys.readouterr()
    assert f"{runs['ce', 0].name}/results.json cannot be read as a results object" in err
    assert "seed_2/results.json cannot be read as a results object" in err
    missing = "2 of 4 cells have runs without results (not run yet, or running): 1 run, e.g. "
    assert f"warning: {missing}{runs['ce', 1].name}.\n" in err and err.count("without results") == 1
    assert "| CE | — (0/3 done, 2 failed) |" in out
    assert (
        tables.main([str(tmp_path), f"--experiment={fake}", "--no_plots", "--where=loss=ce"]) == 1
    )
    assert "error: no run shown has results" in capsys.readouterr().err


def test_tables_name_damaged_results_and_a_bad_out(tmp_path, capsys):
    _write_fake_tree(tmp_path)
    runs = FAKE.runs()
    (tmp_path / runs[0].name / "results.json").write_text('{"A_T": 5')  # truncated
    (tmp_path / runs[1].name / "results.json").write_text('{"A_T": NaN, "avg_inc_acc": 1}')
    (tmp_path / runs[2].name / "results.json").write_text('{"A_T": null, "avg_inc_acc": 1}')
    layout.write_sweep_file(tmp_path, "x")
    fake = tmp_path / "fake.py"
    fake.write_text("from test_sweep import FAKE as EXPERIMENT\n")
    argv = [str(tmp_path), f"--experiment={fake}", "--no_plots"]
    assert tables.main(argv) == 0  # the aEPG row's results were read
    out, err = capsys.readouterr()
    warnings = err.strip().splitlines()
    assert len(warnings) == 3 and all(w.startswith("warning: ") for w in warnings), err
    assert "seed=0/results.json cannot be read" in err and "A_T is None (not finite)" in err
    assert "| CE | — (0/3 done, 3 failed) |" in out
    with pytest.raises(SystemExit) as exc:
        tables.main([*argv, f"--out={tmp_path}/no/such/dir/t.md"])
    assert exc.value.code == 2 and "--out=" in _one_error_line(capsys)


# ---------------------------------------------------------------- slow: real runs, real CLI


def _sweep(path, root, *extra, wait=True):
    cmd = [sys.executable, "-m", "aepg_jax.sweep", f"--experiment={path}", f"--workdir={root}"]
    kwargs = dict(cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    if not wait:
        return subprocess.Popen([*cmd, *extra], **kwargs)
    return subprocess.run([*cmd, *extra], timeout=1200, **kwargs)


def _table(path, root) -> str:
    return tables.render(str(root), registry.get(str(path)), "markdown")


def _matrices(root):
    return {
        str(p.relative_to(root)): json.loads(p.read_text())["accuracy_matrix"]
        for p in sorted(pathlib.Path(root).glob("fake_config/*/results.json"))
    }


@pytest.fixture(scope="module")
def straight(tmp_path_factory):
    """The fake experiment swept once, uninterrupted (checkpoints every 2 steps)."""
    tmp = tmp_path_factory.mktemp("straight")
    path = sweep_fake.write(tmp, steps=6, every=2)
    proc = _sweep(path, tmp / "runs")
    assert proc.returncode == 0, proc.stdout
    return path, tmp / "runs"


@pytest.mark.slow
def test_sigkill_mid_run_then_restart_ends_with_the_same_table(straight, tmp_path):
    path, reference = straight
    root = tmp_path / "runs"
    proc = _sweep(path, root, wait=False)
    second = root / "fake_config/loss=ce,seed=1"
    deadline = time.time() + 600
    while time.time() < deadline and proc.poll() is None:  # a mid-task checkpoint of run 2
        ckpts = second / "checkpoints"
        if ckpts.exists() and any(s.isdigit() and int(s) >= 2 for s in os.listdir(ckpts)):
            break
        time.sleep(0.05)
    assert proc.poll() is None, "the sweep ended before it could be killed"
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    assert (root / "fake_config/loss=ce,seed=0/results.json").exists()
    assert not (second / "results.json").exists()
    again = _sweep(path, root)
    assert again.returncode == 0, again.stdout
    assert "4 runs: 1 done, 3 to run." in again.stdout
    assert _matrices(root) == _matrices(reference)
    assert _table(path, root) == _table(path, reference)
    assert "(n=2)" in _table(path, root)


@pytest.mark.slow
def test_three_shards_run_each_run_once_and_their_table_is_the_one_process_one(straight, tmp_path):
    path, reference = straight
    root = tmp_path / "runs"
    procs = [_sweep(path, root, f"--shard={i}/3", wait=False) for i in range(3)]
    outs = [p.communicate(timeout=1200)[0] for p in procs]
    assert [p.returncode for p in procs] == [0, 0, 0], outs
    ran = sorted(line.split()[1] for out in outs for line in out.splitlines() if "  done" in line)
    assert ran == sorted(r.name for r in registry.get(str(path)).runs())  # each once
    for log in root.glob("fake_config/*/sweep.log"):
        assert log.read_text().count("--- ") == 1, log
    assert _matrices(root) == _matrices(reference)
    assert _table(path, root) == _table(path, reference)


@pytest.mark.slow
def test_a_real_failing_run_does_not_stop_the_others(tmp_path):
    path = sweep_fake.write(tmp_path, failing=True)  # seed=5 has more tasks than classes
    quick = ("--config.optim.epochs=1", "--config.optim.peft_freeze_epochs=0")
    proc = _sweep(path, tmp_path / "runs", "--where=seed=5", *quick)
    assert proc.returncode == 1 and "FAILED: Invalid config: data.num_tasks=11" in proc.stdout
    proc = _sweep(path, tmp_path / "runs", "--where=loss=ce", *quick)
    assert proc.returncode == 1
    quick_name = "+optim.epochs=1+optim.peft_freeze_epochs=0"  # overrides that change results
    assert f"[1/3] fake_config/loss=ce,seed=0{quick_name}  done A_T" in proc.stdout, proc.stdout
    assert f"[2/3] fake_config/loss=ce,seed=1{quick_name}  done A_T" in proc.stdout
    assert "error: 1 of 3 runs failed" in proc.stdout


def test_figure_experiments_plot_from_the_runs(tmp_path):
    """Fig. 3a (A_T against the fixed alpha) and Fig. 2 (curves per task) from fake results."""
    for run in registry.get("fig3a").runs()[:12]:  # alpha 0, 0.2 (5 seeds), 0.4 (2 seeds)
        directory = tmp_path / run.name
        directory.mkdir(parents=True)
        alpha = float(run.value("alpha"))
        (directory / "results.json").write_text(json.dumps({"A_T": 70 + 10 * alpha + run.seed}))
    for run in registry.get("fig2").runs():
        directory = tmp_path / run.name
        directory.mkdir(parents=True, exist_ok=True)
        curves = {
            "A_t": [90 - 2 * t for t in range(10)],
            "entropy": [1.0 / (t + 1) for t in range(10)],
        }
        (directory / "results.json").write_text(json.dumps(curves))
    from aepg_jax.tables import plots

    written = plots.write_plots(str(tmp_path), registry.get("fig3a"))
    written += plots.write_plots(str(tmp_path), registry.get("fig2"))
    names = sorted(pathlib.Path(p).name for p in written)
    assert names == ["fig2_accuracy.png", "fig2_entropy.png", "fig3a_alpha.png"]
    for p in written:
        assert pathlib.Path(p).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert plots.write_plots(str(tmp_path / "empty"), registry.get("fig6")) == []


def test_vmap_seeds_runs_a_cell_as_one_program_and_tables_read_its_seeds(
    tmp_path, monkeypatch, capsys
):
    path = sweep_fake.write(tmp_path)
    calls = []
    monkeypatch.setattr(memory, "apply_default", lambda: False)

    def execute(cfg, workdir):  # the layout of a num_seeds run (continual/report.py)
        calls.append((cfg.loss.name, cfg.seed, cfg.num_seeds))
        per_seed = []
        for s in range(cfg.seed, cfg.seed + cfg.num_seeds):
            per_seed.append({"A_T": 30.0 + s, "avg_inc_acc": 40.0})
            seed_dir = pathlib.Path(workdir, f"seed_{s}")
            seed_dir.mkdir()
            (seed_dir / "results.json").write_text(json.dumps(per_seed[-1]))
        summary = {"predictors": ["model"], "metrics": {"model": {"A_T": {
            "mean": 30.5, "std": 0.71, "values": [30.0, 31.0]}}}}  # fmt: skip
        pathlib.Path(workdir, "results_seeds.json").write_text(json.dumps(summary))
        return summary

    monkeypatch.setattr(main, "execute", execute)
    argv = [f"--experiment={path}", f"--workdir={tmp_path}/runs", "--vmap_seeds"]
    assert sweep.main([*argv, "--compile_cache="]) == 0
    assert calls == [("ce", 0, 2), ("aepg", 0, 2)]
    out = capsys.readouterr().out
    assert "[1/2] fake_config/loss=ce,seeds=0-1  done A_T 30.50 ± 0.71 (2 seeds)" in out
    text = tables.render(f"{tmp_path}/runs", registry.get(path), "markdown")
    assert "| CE | 30.5 ± 0.7 (n=2) | 10.0 ± 1.0 | +20.5 (!) |" in text
    assert sweep.main([*argv, "--list"]) == 0
    assert "done    fake_config/loss=aepg,seeds=0-1" in capsys.readouterr().out


@pytest.mark.slow
def test_vmap_seeds_gives_the_table_of_separate_runs(straight, tmp_path):
    path, reference = straight
    proc = _sweep(path, tmp_path / "runs", "--vmap_seeds")
    assert proc.returncode == 0, proc.stdout
    assert "[1/2] fake_config/loss=ce,seeds=0-1  done A_T" in proc.stdout
    assert _table(path, tmp_path / "runs") == _table(path, reference)
