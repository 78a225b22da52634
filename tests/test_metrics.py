"""Tests of the task-incremental, transfer and old / new metrics (aepg_jax.metrics,
results, steps.make_eval_step) on hand-made matrices and a stub method; values worked out by
hand in the comments."""

import json
import math

import jax.numpy as jnp
import numpy as np
import pytest

from aepg_jax import metrics
from aepg_jax.continual import results as results_lib
from aepg_jax.continual import steps
from aepg_jax.experiments import layout
from aepg_jax.methods import TaskSpec
from aepg_jax.runs import records

nan = np.nan

# Rows: task i; columns: after task j (fractions).
A = np.array([[0.9, 0.8, 0.6], [nan, 0.7, 0.5], [nan, nan, 0.4]])
# bwt = mean(0.6 - 0.9, 0.5 - 0.7) = -0.25
# stepwise: j=1: 0.9 - 0.8 = 0.1; j=2: mean(0.8 - 0.6, 0.7 - 0.5) = 0.2; mean 0.15
# CODA-Prompt's loop on y = A.T: ((y[0,0]-y[1,0]) / 1 + ((y[1,0]-y[2,0]) + (y[1,1]-y[2,1])) / 2)
# / (T - 1) = (0.1 + 0.4 / 2) / 2 = 0.15

# Accuracy that rises before it falls: the three definitions disagree.
B = np.array([[0.5, 0.9, 0.6], [nan, 0.8, 0.8], [nan, nan, 0.7]])
# forgetting (max-based): f_0 = 0.9 - 0.6 = 0.3, f_1 = 0.8 - 0.8 = 0; mean 0.15
# bwt: mean(0.6 - 0.5, 0.8 - 0.8) = 0.05
# stepwise: j=1: 0.5 - 0.9 = -0.4; j=2: mean(0.9 - 0.6, 0.8 - 0.8) = 0.15; mean -0.125

# Counts behind A, unequal task sizes (10, 20, 50 test samples).
CORRECT = np.array([[9, 8, 6], [0, 14, 10], [0, 0, 20]])
TOTAL = np.array([[10, 10, 10], [0, 20, 20], [0, 0, 50]])
# old/new: t=0: (undefined, 9/10); t=1: (8/10, 14/20); t=2: ((6 + 10) / (10 + 20), 20/50)
# Task-incremental counts (>= CORRECT): a_TI = [[.9, .9, .8], [-, .8, .75], [-, -, .6]]
TASK_CORRECT = np.array([[9, 9, 8], [0, 16, 15], [0, 0, 30]])


def coda_prompt_forgetting(a):
    """CODA-Prompt's utils/calc_forgetting.py loop for one trial, y[t, i] = a[i, t]."""
    y, t_max = a.T, a.shape[0]
    fgt = 0.0
    for t in range(1, t_max):
        for i in range(t):
            fgt += (y[t - 1, i] - y[t, i]) / t
    return fgt / (t_max - 1)


def make_tracker(with_task=True):
    tracker = metrics.AccuracyTracker(3, ["model"])
    for j in range(3):
        for i in range(j + 1):
            own = int(TASK_CORRECT[i, j]) if with_task else None
            tracker.record(j, "model", i, int(CORRECT[i, j]), int(TOTAL[i, j]), own)
    return tracker


def test_backward_transfer_hand_computed():
    assert metrics.backward_transfer(A) == pytest.approx(-0.25)
    assert metrics.backward_transfer(B) == pytest.approx(0.05)
    # BWT is minus the max-based forgetting when accuracy never rises after a task is learned.
    assert metrics.backward_transfer(A) == pytest.approx(-metrics.mean_forgetting(A))


def test_stepwise_forgetting_hand_computed_and_as_coda_prompt():
    np.testing.assert_allclose(metrics.stepwise_forgetting(A), [0.1, 0.2])
    assert metrics.mean_stepwise_forgetting(A) == pytest.approx(0.15)
    np.testing.assert_allclose(metrics.stepwise_forgetting(B), [-0.4, 0.15])
    assert metrics.mean_stepwise_forgetting(B) == pytest.approx(-0.125)
    for a in (A, B):
        assert metrics.mean_stepwise_forgetting(a) == pytest.approx(coda_prompt_forgetting(a))
    # The max-based definition differs on B.
    assert metrics.mean_forgetting(B) == pytest.approx(0.15)


def test_old_new_accuracy_pools_old_samples():
    got = metrics.old_new_accuracy(CORRECT, TOTAL)
    assert got.shape == (3, 2)
    assert math.isnan(got[0, 0])
    np.testing.assert_allclose(got[:, 1], [0.9, 0.7, 0.4])
    np.testing.assert_allclose(got[1:, 0], [0.8, 16 / 30])
    # Pooled, not a mean of tasks: (0.6 + 0.5) / 2 = 0.55 would be the per-task mean.
    assert got[2, 0] != pytest.approx(0.55)


def test_undefined_cases_t1_and_not_evaluated():
    one = np.array([[0.7]])
    assert math.isnan(metrics.backward_transfer(one))
    assert metrics.stepwise_forgetting(one).shape == (0,)
    assert math.isnan(metrics.mean_stepwise_forgetting(one))
    got = metrics.old_new_accuracy(np.array([[7]]), np.array([[10]]))
    assert math.isnan(got[0, 0]) and got[0, 1] == pytest.approx(0.7)
    # An entry not evaluated makes the scalars that need it NaN.
    holed = A.copy()
    holed[0, 2] = nan
    assert math.isnan(metrics.backward_transfer(holed))
    assert math.isnan(metrics.mean_stepwise_forgetting(holed))
    # A task not evaluated yet has no old / new figures.
    partial = metrics.old_new_accuracy(CORRECT * [1, 1, 0], TOTAL * [1, 1, 0])
    assert np.isnan(partial[2]).all()

    tracker = metrics.AccuracyTracker(1, ["model"])
    tracker.record(0, "model", 0, 7, 10, 7)
    s = metrics.summary(tracker, "model")
    assert s["bwt"] is None and s["forgetting_stepwise"] is None and s["forgetting"] is None
    assert s["old_new_accuracy"] == [[None, pytest.approx(70.0)]]
    assert s["task_incremental_matrix"] == [[pytest.approx(70.0)]]
    assert s["task_incremental_A_T"] == pytest.approx(70.0) == s["A_T"]
    text = results_lib.final_table(results_lib.build_results(tracker, {}, 1.0, 0, [10]))
    assert "-" in text.split("bwt (%)")[1].splitlines()[0]


def test_summary_task_incremental_and_new_keys_in_percent():
    s = metrics.summary(make_tracker(), "model")
    expected = [[90.0, 90.0, 80.0], [None, 80.0, 75.0], [None, None, 60.0]]
    for row, want in zip(s["task_incremental_matrix"], expected, strict=True):
        assert row == [None if w is None else pytest.approx(w) for w in want]
    # A_TI: 90, (90 + 80) / 2 = 85, (80 + 75 + 60) / 3 = 71.67; mean 82.22
    assert s["task_incremental_A_t"] == pytest.approx([90.0, 85.0, 215 / 3])
    assert s["task_incremental_A_T"] == pytest.approx(215 / 3)
    assert s["task_incremental_avg_inc_acc"] == pytest.approx((90 + 85 + 215 / 3) / 3)
    assert s["bwt"] == pytest.approx(-25.0)
    assert s["forgetting_stepwise"] == pytest.approx(15.0)
    assert s["forgetting"] == pytest.approx(25.0)  # unchanged definition
    assert s["old_new_accuracy"][0] == [None, pytest.approx(90.0)]
    assert s["old_new_accuracy"][2] == pytest.approx([1600 / 30, 40.0])
    # Partial run: only the evaluated tasks count.
    partial = metrics.AccuracyTracker(3, ["model"])
    for j in range(2):
        for i in range(j + 1):
            partial.record(j, "model", i, int(CORRECT[i, j]), int(TOTAL[i, j]), None)
    p = metrics.summary(partial, "model")
    assert p["tasks_evaluated"] == 2 and p["bwt"] == pytest.approx(80.0 - 90.0)
    assert p["task_incremental_A_T"] is None  # not recorded
    assert p["old_new_accuracy"][2] == [None, None]


def test_tracker_task_counts_round_trip_and_older_dicts():
    tracker = make_tracker()
    d = json.loads(json.dumps(tracker.to_dict(), allow_nan=False))
    assert d["task_correct"]["model"][1] == [None, 16, 15]
    back = metrics.AccuracyTracker.from_dict(d)
    np.testing.assert_array_equal(back.task_correct["model"], tracker.task_correct["model"])
    np.testing.assert_array_equal(back.task_matrix("model"), tracker.task_matrix("model"))
    # A dict written without task-incremental counts restores with them unrecorded.
    del d["task_correct"]
    old = metrics.AccuracyTracker.from_dict(d)
    assert np.isnan(old.task_matrix("model")).all()
    np.testing.assert_array_equal(old.accuracy["model"], tracker.accuracy["model"])
    with pytest.raises(ValueError, match="task_correct"):
        tracker.record(0, "model", 0, 5, 10, 11)


def test_results_class_order_seeds_summary_and_tables():
    tracker = make_tracker()
    res = results_lib.build_results(tracker, {}, 1.0, 0, [4, 3, 3], class_order=np.arange(10)[::-1])
    assert res["class_order"] == list(range(9, -1, -1))
    assert all(type(c) is int for c in res["class_order"])
    for key in ("bwt", "forgetting_stepwise", "task_incremental_A_T", "old_new_accuracy"):
        assert res[key] == res["methods"]["model"][key]
    # An experiment's table column reads any of them from a run's results.json.
    assert layout.metric(res, "task_incremental_A_T") == pytest.approx(215 / 3)
    assert layout.metric(res, "forgetting_stepwise") == pytest.approx(15.0)
    table = results_lib.final_table(json.loads(json.dumps(res)))
    for text in ("TI A_T (%)", "71.67", "-25.00", "15.00", "53.33", "40.00"):
        assert text in table

    worse = metrics.AccuracyTracker(3, ["model"])
    for j in range(3):
        for i in range(j + 1):  # one fewer task-incremental hit everywhere
            c, n, o = int(CORRECT[i, j]), int(TOTAL[i, j]), int(TASK_CORRECT[i, j]) - 1
            worse.record(j, "model", i, c, n, o)
    res2 = results_lib.build_results(worse, {}, 1.0, 1, [4, 3, 3], class_order=np.arange(10)[::-1])
    summary = results_lib.seeds_summary([res, res2], {}, 2.0)
    ti = summary["metrics"]["model"]["task_incremental_A_T"]
    # seed 1: (70 + 70 + 29/50*100) / 3 = (70 + 70 + 58) / 3 = 66
    assert ti["values"] == pytest.approx([215 / 3, 66.0])
    assert ti["mean"] == pytest.approx((215 / 3 + 66.0) / 2)
    assert summary["metrics"]["model"]["bwt"]["std"] == pytest.approx(0.0)
    assert summary["task_incremental_matrix_mean"][0][0] == pytest.approx((90.0 + 80.0) / 2)
    assert summary["task_incremental_matrix_mean"][1][0] is None
    assert summary["class_order"] == res["class_order"]
    assert "TI_A_T" in results_lib.seeds_table(summary)


class _FixedScores:
    """A stub method whose predictor scores are the batch's images' first pixel row."""

    predictors = ("model",)

    def predict(self, net, trainable, frozen, state, images, task):
        scores = images[:, 0, :, 0]  # (B, C) after normalisation: order is kept
        return {"model": scores}, scores


def test_eval_step_counts_task_incremental_hits_in_the_same_pass():
    # 4 classes in two tasks [0, 2) and [2, 4); scores per row (higher = preferred).
    scores = np.array(
        [
            [9, 5, 1, 1],  # label 0: argmax 0 -> both hit
            [1, 2, 9, 1],  # label 1: argmax 2 (wrong); within task 0: 1 -> TI hit
            [1, 1, 3, 2],  # label 3: argmax 2 -> both miss
            [9, 1, 1, 5],  # label 3: argmax 0 (wrong); within task 1: 3 -> TI hit
            [1, 9, 1, 1],  # padding row (mask False): not counted
        ],
        np.uint8,
    )
    images = np.repeat(np.repeat(scores[:, None, :, None], 4, axis=1), 3, axis=3)
    batch = {
        "image": jnp.asarray(images),
        "label": jnp.asarray([0, 1, 3, 3, 1]),
        "mask": jnp.asarray([True, True, True, True, False]),
    }
    cfg = steps.StepConfig(4, (0.5, 1.0), (0.75, 1.33), 0.0, "minus_one_one")
    step = steps.make_eval_step(_FixedScores(), None, cfg)

    def spec(offset, k):
        return TaskSpec(
            index=offset // 2, offset=offset, num_classes=k, freeze_steps=0, head_sizes=(2, 2)
        ).traced()

    after = spec(2, 2)
    both, _ = step(None, None, None, batch, after, spec(0, 4))  # the mask spans every class
    assert int(both["count"]) == 4
    assert int(both["model"]) == int(both["task_incremental"]["model"]) == 1
    own0, _ = step(None, None, None, batch, after, spec(0, 2))
    assert int(own0["model"]) == 1 and int(own0["task_incremental"]["model"]) == 2
    own1, rows = step(None, None, None, batch, after, spec(2, 2))
    assert int(own1["task_incremental"]["model"]) == 1  # row 3 only (rows 0-1 not in task 1)
    # The counts are those of the kept rows: each row's task-incremental prediction is one of
    # the evaluated task's classes, its class-incremental one the top class.
    assert set(np.asarray(rows["model"]["task_pred"]).tolist()) <= {2, 3}
    top = np.asarray(rows["model"]["top_classes"])[:, 0]
    assert int(own1["model"]) == int(np.sum((top == np.asarray(batch["label"])) & batch["mask"]))


# ------------------------------------------------------------------- end to end (tiny digits)

NEW_KEYS = (
    "task_incremental_matrix",
    "task_incremental_A_t",
    "task_incremental_A_T",
    "task_incremental_avg_inc_acc",
    "bwt",
    "forgetting_stepwise",
    "old_new_accuracy",
)


def _check_run(workdir, num_tasks, predictors):
    """The new keys of a finished run's results.json and metrics.jsonl, checked."""
    saved = json.load(open(workdir / "results.json"))
    assert saved["class_order"] == list(range(10))  # digits, identity order
    assert saved["predictors"] == list(predictors)
    for p in predictors:
        m = saved["methods"][p]
        for key in NEW_KEYS:
            assert key in m, key
        ci = metrics.as_float_array(m["accuracy_matrix"])
        ti = metrics.as_float_array(m["task_incremental_matrix"])
        assert ti.shape == ci.shape == (num_tasks, num_tasks)
        upper = np.triu_indices(num_tasks)
        assert np.isfinite(ti[upper]).all() and np.isnan(ti[np.tril_indices(num_tasks, -1)]).all()
        # The masked argmax is over a subset holding the true class: it can only help.
        assert (ti[upper] >= ci[upper] - 1e-9).all()
        # After task 0 the seen classes are task 0's own: the two evaluations coincide.
        assert ti[0, 0] == pytest.approx(ci[0, 0])
        assert m["task_incremental_A_T"] == pytest.approx(np.mean(ti[:, -1]))
        assert m["bwt"] == pytest.approx(metrics.backward_transfer(ci))
        assert m["forgetting_stepwise"] == pytest.approx(metrics.mean_stepwise_forgetting(ci))
        assert len(m["old_new_accuracy"]) == num_tasks
        assert m["old_new_accuracy"][0][0] is None
        assert [pair[1] for pair in m["old_new_accuracy"]] == pytest.approx(list(np.diag(ci)))
    # Re-read as the plots and reports do (a resumed run's repeated records dropped).
    evals = [r for r in records.read_metrics(workdir) if r["type"] == "eval"]
    assert [e["task"] for e in evals] == list(range(num_tasks))
    ti = saved["task_incremental_matrix"]
    for e in evals:
        t = e["task"]
        for p in predictors:
            column = [saved["methods"][p]["task_incremental_matrix"][i][t] for i in range(t + 1)]
            assert e["task_incremental_accuracy"][p] == pytest.approx(column)
        assert e["task_incremental_A_t"] == pytest.approx(np.mean([ti[i][t] for i in range(t + 1)]))
        assert e["new_accuracy"] == pytest.approx(saved["accuracy_matrix"][t][t])
    assert evals[0]["bwt"] is None and evals[0]["old_accuracy"] is None
    assert evals[-1]["bwt"] == pytest.approx(saved["bwt"])
    return saved


@pytest.mark.slow  # ~25 s on 2 cores; CI: tests/test_driver.py test_default_config_runs_offline
def test_run_reports_every_new_metric(tmp_path):
    from tiny import tiny_config

    from aepg_jax.continual import trainer

    cfg = tiny_config(
        tmp_path / "cache",
        **{"method.name": "plain", "data.num_tasks": 2, "max_steps_per_task": 2},
    )
    trainer.run(cfg, str(tmp_path / "run"))
    _check_run(tmp_path / "run", 2, ["model"])


@pytest.mark.slow  # two LAE runs of 3 tasks (~40 s on 2 cores)
def test_resumed_run_gives_the_same_results(tmp_path):
    """LAE's own predictors each get a task-incremental matrix; a run resumed from its
    checkpoint after task 2 rebuilds every figure of results.json as before."""
    import shutil

    from tiny import tiny_config

    from aepg_jax.continual import trainer

    cfg = tiny_config(tmp_path / "cache", **{"method.name": "lae", "max_steps_per_task": 4})
    work = tmp_path / "run"
    trainer.run(cfg, str(work))
    full = _check_run(work, 3, ["ensemble", "online", "offline"])
    ckpts = sorted((work / "checkpoints").iterdir(), key=lambda p: int(p.name))
    shutil.rmtree(ckpts[-1])
    (work / "results.json").unlink()
    trainer.run(cfg, str(work))
    resumed = _check_run(work, 3, ["ensemble", "online", "offline"])
    for key in ("methods", "tracker", "class_order", "entropy", *NEW_KEYS):
        assert resumed[key] == full[key], key
