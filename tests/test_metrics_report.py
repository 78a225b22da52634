"""Tests of aepg_jax.metrics, continual/results.py and scripts/compare_runs.py (CPU, NumPy only)."""

import json
import math
import runpy
import sys
from pathlib import Path

import numpy as np
import pytest

from aepg_jax import metrics
from aepg_jax.continual import plots
from aepg_jax.continual import results as results_lib
from aepg_jax.runs import records as records_lib

SCRIPTS = Path(__file__).resolve().parents[1] / "scripts"
PNG = b"\x89PNG\r\n\x1a\n"
nan = np.nan

# 3 tasks. Rows: task i; columns: after task j.
#   a = [[0.9, 0.8, 0.6],
#        [nan, 0.7, 0.5],
#        [nan, nan, 0.4]]
# A_0 = 0.9, A_1 = (0.8 + 0.7) / 2 = 0.75, A_2 = (0.6 + 0.5 + 0.4) / 3 = 0.5
# avg_inc_acc = (0.9 + 0.75 + 0.5) / 3 = 2.15 / 3 = 0.71666...
# forgetting: f_0 = max(0.9, 0.8) - 0.6 = 0.3, f_1 = max(0.7) - 0.5 = 0.2; mean 0.25
A = np.array([[0.9, 0.8, 0.6], [nan, 0.7, 0.5], [nan, nan, 0.4]])

# Counts behind A with unequal task sizes: task 0 has 10 test samples, task 1 20, task 2 50.
# pooled_0 = 9/10 = 0.9; pooled_1 = (8 + 14) / 30 = 22/30; pooled_2 = (6 + 10 + 20) / 80 = 0.45
SIZES = (10, 20, 50)
CORRECT = np.array([[9, 8, 6], [0, 14, 10], [0, 0, 20]])
TOTAL = np.array([[10, 10, 10], [0, 20, 20], [0, 0, 50]])


def make_tracker(predictors=("model",), entropy=True):
    tracker = metrics.AccuracyTracker(3, predictors)
    for j in range(3):
        for p_idx, p in enumerate(predictors):
            for i in range(j + 1):
                # The second predictor is one sample worse on every task.
                tracker.record(j, p, i, int(CORRECT[i, j]) - p_idx, int(TOTAL[i, j]))
        if entropy:
            tracker.record_entropy(j, 0.5 * (j + 1))
    return tracker


def test_incremental_accuracy_hand_computed():
    assert metrics.incremental_accuracy(A, 0) == pytest.approx(0.9)
    assert metrics.incremental_accuracy(A, 1) == pytest.approx(0.75)
    assert metrics.incremental_accuracy(A, 2) == pytest.approx(0.5)
    np.testing.assert_allclose(metrics.incremental_accuracies(A), [0.9, 0.75, 0.5])
    assert metrics.average_incremental_accuracy(A) == pytest.approx(2.15 / 3)


def test_forgetting_hand_computed():
    np.testing.assert_allclose(metrics.forgetting(A), [0.3, 0.2])
    assert metrics.mean_forgetting(A) == pytest.approx(0.25)
    # Entries below the diagonal (task not yet seen) are ignored even if filled in.
    filled = np.where(np.isnan(A), 1.0, A)
    np.testing.assert_allclose(metrics.forgetting(filled), [0.3, 0.2])


def test_pooled_accuracy_differs_from_mean_with_unequal_tasks():
    assert metrics.pooled_accuracy(CORRECT, TOTAL, 0) == pytest.approx(0.9)
    assert metrics.pooled_accuracy(CORRECT, TOTAL, 1) == pytest.approx(22 / 30)
    assert metrics.pooled_accuracy(CORRECT, TOTAL, 2) == pytest.approx(0.45)
    assert metrics.pooled_accuracy(CORRECT, TOTAL, 2) != pytest.approx(
        metrics.incremental_accuracy(A, 2)
    )
    np.testing.assert_allclose(metrics.pooled_accuracies(CORRECT, TOTAL), [0.9, 22 / 30, 0.45])


def test_tracker_matches_matrix_and_summary_in_percent():
    tracker = make_tracker()
    np.testing.assert_allclose(tracker.matrix("model"), A)
    s = metrics.summary(tracker, "model")
    assert s["accuracy_matrix"][1][0] is None
    assert s["accuracy_matrix"][0][2] == pytest.approx(60.0)
    assert s["A_t"] == pytest.approx([90.0, 75.0, 50.0])
    assert s["A_T"] == pytest.approx(50.0)
    assert s["avg_inc_acc"] == pytest.approx(215 / 3)
    assert s["forgetting"] == pytest.approx(25.0)
    assert s["forgetting_per_task"] == pytest.approx([30.0, 20.0])
    assert s["acc_pooled"] == pytest.approx([90.0, 2200 / 30, 45.0])
    assert s["acc_pooled_T"] == pytest.approx(45.0)
    assert s["tasks_evaluated"] == 3
    json.dumps(s, allow_nan=False)


def test_summary_of_partial_run_uses_evaluated_tasks():
    tracker = metrics.AccuracyTracker(3, ["model"])
    for i in range(2):
        for j in range(i, 2):
            tracker.record(j, "model", i, int(CORRECT[i, j]), int(TOTAL[i, j]))
    s = metrics.summary(tracker, "model")
    assert s["tasks_evaluated"] == 2
    assert s["A_t"][2] is None and s["acc_pooled"][2] is None
    assert s["A_T"] == pytest.approx(75.0)
    assert s["avg_inc_acc"] == pytest.approx(82.5)
    assert s["forgetting_per_task"] == pytest.approx([10.0])


def test_tracker_rejects_bad_records():
    tracker = metrics.AccuracyTracker(3, ["model"])
    with pytest.raises(ValueError, match="seen tasks"):
        tracker.record(0, "model", 1, 1, 2)
    with pytest.raises(KeyError, match="Unknown predictor"):
        tracker.record(0, "online", 0, 1, 2)
    with pytest.raises(ValueError, match="correct <= total"):
        tracker.record(0, "model", 0, 3, 2)
    with pytest.raises(ValueError, match="after_task"):
        tracker.record_entropy(3, 1.0)


def test_tracker_round_trip_through_json():
    tracker = make_tracker(("online", "offline", "ensemble"))
    tracker.entropy[2] = nan  # not recorded
    text = json.dumps(tracker.to_dict(), allow_nan=False)
    assert "NaN" not in text
    back = metrics.AccuracyTracker.from_dict(json.loads(text))
    assert back.predictors == tracker.predictors
    for p in tracker.predictors:
        np.testing.assert_array_equal(back.accuracy[p], tracker.accuracy[p])
        np.testing.assert_array_equal(back.correct[p], tracker.correct[p])
        np.testing.assert_array_equal(back.total[p], tracker.total[p])
    np.testing.assert_array_equal(back.entropy, tracker.entropy)


def test_single_task_has_no_forgetting():
    a = np.array([[0.8]])
    assert metrics.forgetting(a).shape == (0,)
    assert math.isnan(metrics.mean_forgetting(a))
    tracker = metrics.AccuracyTracker(1, ["model"])
    tracker.record(0, "model", 0, 8, 10)
    s = metrics.summary(tracker, "model")
    assert s["A_T"] == pytest.approx(80.0) and s["avg_inc_acc"] == pytest.approx(80.0)
    assert s["forgetting"] is None and s["forgetting_per_task"] == []
    results = results_lib.build_results(tracker, {"seed": 0}, 1.0, 0, [10])
    assert json.loads(json.dumps(results, allow_nan=False))["forgetting"] is None
    assert "-" in results_lib.final_table(results).split("forgetting (%)")[1].splitlines()[0]


def test_metrics_writer_append_resume_truncation_and_dedup(tmp_path):
    with records_lib.MetricsWriter(tmp_path) as w:
        for step in range(1, 5):
            w.write("train", task=0, step=step, loss=1.0 / step, alpha=np.float32(0.5))
        w.write("eval", task=0, step=4, accuracy={"model": [90.0]}, entropy=float("nan"))
        w.write({"type": "train", "task": 1, "step": 5, "loss": 0.1})  # dict form
        with pytest.raises(ValueError, match="type"):
            w.write({"step": 6})
    # A run killed mid-write leaves a partial line.
    with open(tmp_path / "metrics.jsonl", "a") as f:
        f.write('{"type": "train", "task": 1, "st')
    records = records_lib.read_metrics(tmp_path / "metrics.jsonl")
    assert [r["step"] for r in records] == [1, 2, 3, 4, 4, 5]
    assert records[4]["entropy"] is None and records[0]["alpha"] == 0.5

    # Resume from a checkpoint at step 3: steps 4 and 5 are logged again with new values.
    with records_lib.MetricsWriter(tmp_path) as w:
        w.write("train", task=0, step=4, loss=0.44)
        w.write("eval", task=0, step=4, accuracy={"model": [91.0]})
        w.write("train", task=1, step=5, loss=0.55)
        w.write("train", task=1, step=6, loss=0.66)
    lines = (tmp_path / "metrics.jsonl").read_text().splitlines()
    assert len(lines) == 10 and all(json.loads(line) for line in lines)  # partial line removed
    records = records_lib.read_metrics(tmp_path)
    train = [r for r in records if r["type"] == "train"]
    assert [r["step"] for r in train] == [1, 2, 3, 4, 5, 6]
    assert [r["loss"] for r in train[3:]] == [0.44, 0.55, 0.66]
    (evaluation,) = [r for r in records if r["type"] == "eval"]
    assert evaluation["accuracy"] == {"model": [91.0]}


def test_read_metrics_drops_abandoned_steps_and_keeps_zero_step_tasks(tmp_path):
    path = tmp_path / "metrics.jsonl"
    rows = [
        {"type": "train", "task": 0, "step": 10},
        {"type": "train", "task": 0, "step": 20},  # abandoned: resumed at 10, logs 15, 25
        {"type": "train", "task": 0, "step": 15},
        {"type": "train", "task": 0, "step": 25},
        {"type": "eval", "task": 0, "step": 25},
        {"type": "eval", "task": 1, "step": 25},  # a task with no steps: same step, kept
        {"type": "note", "text": "no step"},
    ]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    got = [(r["type"], r.get("task"), r.get("step")) for r in records_lib.read_metrics(path)]
    assert got == [
        ("train", 0, 10),
        ("train", 0, 15),
        ("train", 0, 25),
        ("eval", 0, 25),
        ("eval", 1, 25),
        ("note", None, None),
    ]


def test_disabled_writer_writes_nothing(tmp_path):
    w = records_lib.MetricsWriter(tmp_path, enabled=False)
    w.write("train", step=1)
    w.close()
    assert not (tmp_path / "metrics.jsonl").exists()


def test_write_results_atomic_with_nan_as_null(tmp_path):
    (tmp_path / "results.json").write_text("old")
    path = records_lib.write_results(tmp_path, {"x": float("nan"), "y": np.array([1.0, np.inf])})
    assert json.loads(path.read_text()) == {"x": None, "y": [1.0, None]}
    assert sorted(p.name for p in tmp_path.iterdir()) == ["results.json"]  # no temp file left
    with pytest.raises(TypeError):
        records_lib.write_results(tmp_path, {"x": object()})
    assert json.loads(path.read_text()) == {"x": None, "y": [1.0, None]}  # old file intact
    assert sorted(p.name for p in tmp_path.iterdir()) == ["results.json"]


def test_build_results_and_final_table():
    tracker = make_tracker(("online", "offline", "ensemble"))
    results = results_lib.build_results(
        tracker, {"seed": 3, "loss": {"name": "aepg"}}, 3723.0, 3, [4, 3, 3]
    )
    for key in (
        "config",
        "predictors",
        "methods",
        "accuracy_matrix",
        "A_t",
        "A_T",
        "avg_inc_acc",
        "forgetting",
        "acc_pooled",
        "entropy",
        "wall_time_s",
        "seed",
        "num_tasks",
        "head_sizes",
    ):
        assert key in results
    assert results["predictors"] == ["online", "offline", "ensemble"]
    assert results["A_T"] == results["methods"]["online"]["A_T"] == pytest.approx(50.0)
    assert results["entropy"] == [0.5, 1.0, 1.5]
    table = results_lib.final_table(json.loads(json.dumps(results)))
    for text in (
        "90.0",
        "60.0",
        "40.0",
        "50.00",
        "71.67",
        "25.00",
        "45.00",
        "1:02:03",
        "online",
        "offline",
        "ensemble",
    ):
        assert text in table
    offline_line = next(line for line in table.splitlines() if line.startswith("offline"))
    # offline: one sample fewer on every task: A_T = (50 + 45 + 38) / 3 = 44.33
    assert "44.33" in offline_line


def test_plots_write_png(tmp_path):
    tracker = make_tracker(("online", "offline"))
    results = results_lib.build_results(tracker, {}, 1.0, 0, [4, 3, 3])
    records = [
        {"type": "train", "task": t, "step": s, "entropy": 1.0 / s, "alpha": 1 - s / 30}
        for t, steps in enumerate((range(1, 11), range(11, 21), range(21, 31)))
        for s in steps
    ]
    records[3].pop("alpha")  # missing keys are tolerated
    records += [{"type": "eval", "task": 0, "step": 10, "entropy": 0.3}]
    paths = plots.write_plots(tmp_path, results, records)
    assert [p.name for p in paths] == [
        "accuracy_matrix.png",
        "training_curves.png",
        "incremental_accuracy.png",
    ]
    for p in paths:
        assert p.read_bytes()[:8] == PNG
    plots.plot_training_curves([], tmp_path / "empty.png")
    plots.plot_accuracy_matrix(A, tmp_path / "a.png", "A")
    assert (tmp_path / "empty.png").read_bytes()[:8] == PNG
    assert (tmp_path / "a.png").read_bytes()[:8] == PNG


def _fake_run(root, name, loss, seed, a_t_final, forgetting):
    run = root / name
    run.mkdir()
    results = {
        "config": {"seed": seed, "loss": {"name": loss}, "method": {"name": "lae"}},
        "seed": seed,
        "A_t": [90.0, a_t_final],
        "A_T": a_t_final,
        "avg_inc_acc": (90.0 + a_t_final) / 2,
        "forgetting": forgetting,
        "acc_pooled_T": a_t_final - 1.0,
        "bwt": None if forgetting is None else -forgetting,
    }
    records_lib.write_results(run, results)
    with records_lib.MetricsWriter(run) as w:
        for step in range(1, 6):
            w.write("train", task=0 if step < 3 else 1, step=step, entropy=2.0 / step)
    return str(run)


def test_compare_runs_mean_and_std_over_seeds(tmp_path, capsys, monkeypatch):
    dirs = [
        _fake_run(tmp_path, "ce0", "ce", 0, 70.0, 10.0),
        _fake_run(tmp_path, "ce1", "ce", 1, 74.0, 14.0),
        _fake_run(tmp_path, "aepg0", "aepg", 0, 80.0, 4.0),
        _fake_run(tmp_path, "aepg1", "aepg", 1, 81.0, None),
    ]
    out = tmp_path / "compare.png"
    monkeypatch.setattr(sys, "argv", ["compare_runs.py", *dirs, "--out", str(out)])
    runpy.run_path(str(SCRIPTS / "compare_runs.py"), run_name="__main__")
    printed = capsys.readouterr().out
    ce = next(line for line in printed.splitlines() if line.startswith("ce / lae"))
    aepg = next(line for line in printed.splitlines() if line.startswith("aepg / lae"))
    # ce: A_T 70, 74 -> 72 +- 2.83 (ddof=1); avg_inc_acc 80, 82 -> 81 +- 1.41; forgetting
    # 10, 14 -> 12 +- 2.83; acc_pooled_T 69, 73 -> 71 +- 2.83.
    assert ce.split()[3] == "2"
    for text in ("72.00 +- 2.83", "81.00 +- 1.41", "12.00 +- 2.83", "71.00 +- 2.83"):
        assert text in ce
    # aepg: A_T 80, 81 -> 80.5 +- 0.71; forgetting has one value only.
    for text in ("80.50 +- 0.71", "85.25 +- 0.35", "4.00 (1 seed)", "79.50 +- 0.71"):
        assert text in aepg
    # The second table: task-incremental accuracy and transfer; bwt -10, -14 -> -12 +- 2.83,
    # the figures these results lack shown as "-".
    ce_more = [line for line in printed.splitlines() if line.startswith("ce / lae")][1]
    assert "-12.00 +- 2.83" in ce_more and ce_more.split()[4] == "-"
    # Its headers, longer than the first table's, stay apart (one word per metric).
    header = next(line for line in printed.splitlines() if "task_incremental_A_T" in line)
    assert header.split() == ["group", "seeds", *results_lib.SEED_METRICS_MORE]
    assert out.read_bytes()[:8] == PNG


def test_compare_runs_label_key_and_missing_results(tmp_path, capsys, monkeypatch):
    run = _fake_run(tmp_path, "ce0", "ce", 0, 70.0, 10.0)
    argv = ["compare_runs.py", run, "--out", str(tmp_path / "c.png"), "--label-key", "loss.name"]
    monkeypatch.setattr(sys, "argv", argv)
    runpy.run_path(str(SCRIPTS / "compare_runs.py"), run_name="__main__")
    assert any(line.startswith("ce  ") for line in capsys.readouterr().out.splitlines())

    empty = tmp_path / "empty"
    empty.mkdir()
    monkeypatch.setattr(sys, "argv", ["compare_runs.py", str(empty)])
    with pytest.raises(SystemExit, match=r"has no results\.json"):
        runpy.run_path(str(SCRIPTS / "compare_runs.py"), run_name="__main__")


if __name__ == "__main__":
    sys.exit(pytest.main([__file__]))
