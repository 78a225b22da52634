"""Calibration only for probability models (docs/algorithm.md §4), and the values refused or
allowed around the score-based methods.

Fast: which of the methods output scores (`Method.scores`); results.json's null figures with
the reason for such a method and numbers for plain; the tables, the report page and `evaluate`
saying "scores, not probabilities" instead of a number; RanPAC's `method.ranpac_m` refused by
the config-time fit check; non-finite class statistics and a covariance without a Cholesky
factor named by class and task; a task a method does not train may be smaller than a batch.

Slow: the CLI refuses `method.ranpac_m=10000000` in one line before anything is built; a real
SimpleCIL run with tasks smaller than `optim.batch_size` writes null calibration with its
reason; a real SLCA run whose class covariance cannot be factored stops with one line naming
the class and task.
"""

from __future__ import annotations

import json
import os
import pathlib
import subprocess
import sys

import jax.numpy as jnp
import ml_collections
import numpy as np
import pytest
import test_report  # the fake sweep's run folders, written as the trainer writes them
from tiny import child_cpu_seconds

from aepg_jax import methods, metrics
from aepg_jax.continual import fit, programs, results, trainer
from aepg_jax.data import splits
from aepg_jax.evaluate import evaluate
from aepg_jax.experiments import Column, Experiment, Grid, Row, Table
from aepg_jax.methods import class_gaussians
from aepg_jax.tables import tables

REPO = pathlib.Path(__file__).resolve().parents[1]
SCORES = metrics.SCORES


def test_the_score_methods_are_those_that_predict_without_a_trained_probability():
    expected = {"simplecil": {"model"}, "aper": {"model"}, "ease": {"model"}, "ranpac": {"model"}}
    expected["lae"] = {"ensemble"}
    for name, cls in methods.REGISTRY.items():
        notes = cls.calibration_notes()
        assert set(notes) == expected.get(name, set()), name
        assert all(
            n.startswith(f"{SCORES}: ") and len(n) > len(SCORES) + 10 for n in notes.values()
        )
    # The logged entropy is that of `predict`'s logits: LAE's are the online model's.
    assert methods.get("lae").entropy_note() is None
    assert methods.get("plain").entropy_note() is None
    assert (
        methods.get("simplecil").entropy_note()
        == methods.get("simplecil").calibration_notes()["model"]
    )


def _tracker(method: str) -> metrics.AccuracyTracker:
    """Two evaluated tasks of `method`'s predictors, every figure recorded."""
    cls = methods.get(method)
    tracker = metrics.AccuracyTracker(
        2, cls.predictors, cls.calibration_notes(), cls.entropy_note()
    )
    for j in range(2):
        for p in cls.predictors:
            for i in range(j + 1):
                tracker.record(j, p, i, 6, 10, 8)
            tracker.record_calibration(j, p, {"ece": 0.125, "nll": 0.5, "entropy": 0.25})
        tracker.record_entropy(j, 0.25)
    return tracker


def test_results_hold_null_with_the_reason_for_scores_and_numbers_for_plain():
    plain = results.build_results(_tracker("plain"), {}, 1.0, 0, [2, 2])
    assert (plain["ece_T"], plain["nll_T"], plain["test_entropy_T"]) == (12.5, 0.5, 0.25)
    assert plain["entropy"] == [0.25, 0.25] and "calibration_note" not in plain
    assert "entropy_note" not in plain
    for tracker in (_tracker("simplecil"), metrics.AccuracyTracker.from_dict(
        json.loads(json.dumps(_tracker("simplecil").to_dict()))
    )):  # fmt: skip
        r = results.build_results(tracker, {}, 1.0, 0, [2, 2])
        note = methods.get("simplecil").calibration_notes()["model"]
        for key in metrics.CALIBRATION_KEYS:
            assert r[key] in (None, [None, None]), key
        assert r["calibration_note"] == note == r["methods"]["model"]["calibration_note"]
        assert r["entropy"] == [None, None] and r["entropy_note"] == note
        assert r["A_T"] == 60.0  # accuracy is untouched
        table = results.final_table(r)
        assert f"ECE_T (%)           {SCORES}" in table
    # LAE: the ensemble scores, online and offline are softmaxes and keep their figures.
    lae = results.build_results(_tracker("lae"), {}, 1.0, 0, [2, 2])
    assert lae["ece_T"] is None and lae["calibration_note"].startswith(SCORES)
    assert lae["methods"]["online"]["ece_T"] == 12.5 and lae["entropy"] == [0.25, 0.25]
    lines = results.final_table(lae).splitlines()
    assert any(line.startswith("ensemble") and line.endswith(SCORES) for line in lines)
    assert any(line.split()[:2] == ["online", "12.50"] for line in lines)


def _noted(folder: pathlib.Path, note: str) -> None:
    """A fake run's results.json as a score method's run writes it."""
    path = folder / "results.json"
    r = json.loads(path.read_text())
    for m in (r, r["methods"]["model"]):
        m.update({k: None for k in metrics.CALIBRATION_KEYS})
        m.update({k: [None] * test_report.TASKS for k in ("ece", "nll", "test_entropy")})
        m["calibration_note"] = note
    path.write_text(json.dumps(r))


SCORES_EXPERIMENT = Experiment(
    "fake_scores",
    "Fake scores",
    [Grid("configs/demo.py", "method=plain,loss=ce/aepg,seed=0/1")],
    [
        Table(
            "Fake (digits)",
            columns=[Column("A_5", {}, "A_T"), Column("ECE_5", {}, "ece_T")],
            rows=[Row("LoRA", {"loss": "ce"}), Row("LoRA + aEPG", {"loss": "aepg"})],
        )
    ],
)


def test_tables_report_and_evaluate_say_scores_not_probabilities(tmp_path, capsys):
    note = methods.get("simplecil").calibration_notes()["model"]
    for run in SCORES_EXPERIMENT.runs():
        config = tables._configs(run, ())[0]
        folder = tmp_path / run.name
        test_report.write_run(folder, config, run.seed, 0.7)
        if run.value("loss") == "ce":
            _noted(folder, note)
    warnings: set[str] = set()
    text = tables.render(str(tmp_path), SCORES_EXPERIMENT, "markdown", warnings)
    ce = text.splitlines()[4]
    assert ce.startswith("| LoRA |") and f"| {SCORES} (n=2) |" in ce
    aepg = text.splitlines()[5]
    assert SCORES not in aepg and "(n=2)" in aepg  # numbers where the runs have them
    assert not warnings  # null by design is no failure
    csv_text = tables.render(str(tmp_path), SCORES_EXPERIMENT, "csv")
    assert f'LoRA,ECE_5,ece_T,0,2,0,,,,,,0,"{SCORES}"' in csv_text
    page = test_report.Collector()
    page.feed(text := tables.report_page(str(tmp_path), SCORES_EXPERIMENT))
    assert page.cells.count(SCORES) == 2  # the two CE runs' calibration tables
    assert text.count(">reliability after task 5</text>") == 2  # the aEPG runs' only
    # evaluate: no number recomputed where results.json has null; equal to it
    ce_run = next(r for r in SCORES_EXPERIMENT.runs() if r.value("loss") == "ce")
    assert evaluate.main([str(tmp_path / ce_run.name)]) == 0
    out = capsys.readouterr().out
    assert f" {SCORES}" in out and "equal to results.json" in out
    evaluation = json.loads((tmp_path / ce_run.name / evaluate.OUT_FILE).read_text())
    assert evaluation["methods"]["model"]["ece_T"] is None
    assert evaluation["methods"]["model"]["calibration_note"] == note


def _ranpac(m: int) -> ml_collections.ConfigDict:
    sys.path.insert(0, str(REPO / "configs"))
    try:
        import default
    finally:
        sys.path.pop(0)
    cfg = default.get_config()
    cfg.method.name = "ranpac"
    cfg.method.ranpac_m = m
    return cfg


def test_ranpac_m_that_cannot_fit_is_refused_from_the_config(monkeypatch):
    monkeypatch.setenv(fit.ENV, "1")
    monkeypatch.setattr(fit, "available", lambda: (8 * 2**30, "host memory available"))
    fit.check_config(_ranpac(10000), 1)  # the reference's M: 2.6 GiB
    with pytest.raises(fit.DoesNotFit) as err:
        fit.check_config(_ranpac(10_000_000), 1)
    message = str(err.value)
    assert "\n" not in message and message.startswith("method.ranpac_m=10000000 needs")
    fits = int(message.split("set method.ranpac_m <= ")[1].split()[0])
    fit.check_config(_ranpac(fits), 1)  # the advice is accepted, the next thousand is not
    with pytest.raises(fit.DoesNotFit):
        fit.check_config(_ranpac(fits + 1000), 1)
    monkeypatch.setenv(fit.ENV, "0")
    fit.check_config(_ranpac(10_000_000), 1)  # the fit check off: not refused


def test_non_finite_statistics_and_unfactorable_covariances_name_class_and_task():
    sizes = (2, 3, 2)
    stats = {"sums": np.ones((7, 4), np.float32), "m2": np.zeros((7, 4, 4), np.float32)}
    stats["m2"][3, 1, 2] = np.nan
    own = np.arange(7) >= 2
    class_gaussians.check_statistics("SLCA", stats, np.arange(7) < 2, sizes, 0)  # not class 3
    with pytest.raises(FloatingPointError) as err:
        class_gaussians.check_statistics("SLCA", stats, own & (np.arange(7) < 5), sizes, 1)
    assert "\n" not in str(err.value)
    assert str(err.value).startswith("SLCA: the feature statistics of class 3 (task 2) are")
    covs = np.stack([np.eye(4, dtype=np.float32)] * 7)
    covs[4] = -np.eye(4)  # not positive definite: its Cholesky factor is NaN
    finite = {"kernel": jnp.ones((4, 7)), "bias": jnp.zeros(7)}
    seen = np.arange(7) < 5
    class_gaussians.check_alignment("SLCA", finite, covs, seen, sizes, 1, "fix")  # finite: ok
    nan = {"kernel": jnp.full((4, 7), jnp.nan), "bias": jnp.zeros(7)}
    with pytest.raises(FloatingPointError) as err:
        class_gaussians.check_alignment("SLCA", nan, covs, seen, sizes, 1, "do this")
    assert "\n" not in str(err.value)
    assert str(err.value).startswith("SLCA: the feature covariance of class 4 (task 2) has no")
    assert "after task 2 are NaN; do this." in str(err.value)
    with pytest.raises(FloatingPointError, match="aligned after task 2 is not finite; do"):
        class_gaussians.check_alignment(
            "SLCA", nan, np.stack([np.eye(4)] * 7), seen, sizes, 1, "do"
        )


def test_a_task_the_method_does_not_train_may_be_smaller_than_a_batch():
    task = splits.Task(1, 2, 2, np.arange(2, 4), np.arange(10), np.arange(4))
    cfg = _ranpac(0)
    cfg.optim.batch_size = 32
    cfg.method.name = "simplecil"
    assert programs.plan_task(cfg, task).total_steps == 0
    cfg.method.name = "plain"  # a method that trains it: refused in one line
    with pytest.raises(ValueError, match=r"fewer than optim\.batch_size=32"):
        programs.plan_task(cfg, task)


def _cli(tmp_path: pathlib.Path, *flags: str, timeout: float = 600) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(REPO), fit.ENV: "1"}
    argv = [sys.executable, "-m", "aepg_jax.main", "--config=configs/default.py", *flags]
    return subprocess.run(argv, cwd=REPO, env=env, capture_output=True, text=True, timeout=timeout)


@pytest.mark.slow
def test_cli_refuses_ranpac_m_in_one_line_before_training(tmp_path):
    start = child_cpu_seconds()
    done = _cli(
        tmp_path,
        "--config.method.name=ranpac",
        "--config.method.ranpac_m=10000000",
        f"--workdir={tmp_path / 'run'}",
    )
    assert done.returncode == 2, done.stderr[-2000:]
    lines = [line for line in done.stderr.splitlines() if line.strip()]
    assert lines[-1].startswith("error: method.ranpac_m=10000000 needs"), done.stderr[-2000:]
    assert "set method.ranpac_m <=" in lines[-1] and "Traceback" not in done.stderr
    assert not (tmp_path / "run" / "checkpoints").exists() or not os.listdir(
        tmp_path / "run" / "checkpoints"
    )
    assert child_cpu_seconds() - start < 120


@pytest.mark.slow
def test_simplecil_runs_tasks_smaller_than_a_batch_and_reports_no_calibration(tmp_path):
    done = _cli(
        tmp_path,
        "--config.method.name=simplecil",
        "--config.optim.batch_size=1000",  # each digits task has ~290 training images
        f"--workdir={tmp_path / 'run'}",
    )
    assert done.returncode == 0, done.stderr[-2000:]
    r = json.loads((tmp_path / "run" / "results.json").read_text())
    assert r["A_T"] > 50 and r["ece_T"] is None and r["nll_T"] is None
    assert r["test_entropy_T"] is None and r["entropy"] == [None] * 5
    assert r["calibration_note"].startswith(f"{SCORES}: cosine similarities")
    assert f"ECE_T (%)           {SCORES}" in done.stdout
    assert not (tmp_path / "run" / "reliability.png").exists()


@pytest.mark.slow
def test_slca_stops_in_one_line_at_a_covariance_without_cholesky_factor(tmp_path, monkeypatch):
    covariances = class_gaussians.ClassGaussians.covariances

    def broken(self, ridge=0.0):  # class 7 (task 2) not positive definite
        cov = covariances(self, ridge)
        return cov.at[7].set(-jnp.eye(cov.shape[-1]))

    monkeypatch.setattr(class_gaussians.ClassGaussians, "covariances", broken)
    cfg = _ranpac(0)
    cfg.method.name = "slca"
    cfg.data.num_tasks = 2
    cfg.max_steps_per_task = 2
    cfg.method.slca_ca_epochs = 1
    with pytest.raises(FloatingPointError) as err:
        trainer.run(cfg, str(tmp_path / "run"))
    assert "\n" not in str(err.value)
    assert str(err.value).startswith("SLCA: the feature covariance of class 7 (task 2) has no")
    assert "after task 2 are NaN" in str(err.value)
