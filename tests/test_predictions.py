"""Kept predictions (runs/predictions.py) and the metrics recomputed from them
(aepg_jax/evaluate), on hand-made probabilities with values worked out by hand."""

import math

import jax.numpy as jnp
import numpy as np
import pytest

from aepg_jax.evaluate import evaluate
from aepg_jax.runs import predictions

# Two tasks of two classes (0-1, 2-3); after task 0 the classes of task 1 have probability 0.
AFTER_0 = {0: ([[0.7, 0.3, 0, 0], [0.6, 0.4, 0, 0]], [0, 1])}  # task 0: right, wrong
AFTER_1 = {
    0: ([[0.1, 0.2, 0.6, 0.1], [0.1, 0.5, 0.3, 0.1]], [0, 1]),  # -> 2 (new, wrong), 1 (right)
    1: ([[0.5, 0.1, 0.3, 0.1], [0.1, 0.1, 0.1, 0.7]], [2, 3]),  # -> 0 (old, wrong), 3 (right)
}
META = {
    "format": predictions.FORMAT,
    "predictors": ["model"],
    "task_offsets": [0, 2],
    "task_sizes": [2, 2],
    "num_classes": 4,
    "scenario": "class",
}


def _evaluation(after_task: int, tasks: dict) -> dict:
    parts = []
    for task, (probs, labels) in tasks.items():
        probs, labels = jnp.asarray(probs, jnp.float32), jnp.asarray(labels)
        logged = -jnp.sum(jnp.where(probs > 0, probs * jnp.log(probs + (probs == 0)), 0.0), -1)
        rows = predictions.per_example(
            {"model": probs}, logged, labels, jnp.asarray(2 * task), jnp.asarray(2 * task + 2)
        )
        cols = predictions.host_rows(rows, len(labels), 4)
        cols.update(
            after_task=np.full(2, after_task, np.int16),
            task=np.full(2, task, np.int16),
            index=np.arange(2 * task, 2 * task + 2, dtype=np.int32),
        )
        parts.append(cols)
    return predictions.flatten(predictions.concat(parts))


def test_per_example_keeps_top_classes_true_class_probability_and_task_prediction():
    cols = _evaluation(1, AFTER_1)
    np.testing.assert_array_equal(cols["model/top_classes"][:, 0], [2, 1, 0, 3])
    np.testing.assert_array_equal(cols["model/task_pred"], [1, 1, 2, 3])  # own classes only
    np.testing.assert_allclose(cols["model/p_true"], [0.1, 0.5, 0.3, 0.7], rtol=1e-6)
    assert cols["model/top_classes"].dtype == np.int16 and cols["model/top_probs"].shape == (4, 4)
    h = -np.sum([0.1, 0.2, 0.6, 0.1] * np.log([0.1, 0.2, 0.6, 0.1]))
    assert float(cols["model/entropy"][0]) == pytest.approx(h, rel=1e-3)  # float16 kept


def test_a_rewrite_replaces_later_evaluations_and_equal_files_have_equal_digests(tmp_path):
    a, b = tmp_path / "a", tmp_path / "b"
    for d in (a, b):
        predictions.write(d, 0, _evaluation(0, AFTER_0), META)
        digest = predictions.write(d, 1, _evaluation(1, AFTER_1), META)
    assert digest == predictions.sha256(a / predictions.FILE)
    assert (a / predictions.FILE).read_bytes() == (b / predictions.FILE).read_bytes()
    # A resumed run evaluates task 1 again: no row twice, the same file.
    assert predictions.write(a, 1, _evaluation(1, AFTER_1), META) == digest
    assert len(predictions.load(a / predictions.FILE)["label"]) == 6
    predictions.write(a, 0, _evaluation(0, AFTER_0), META)
    assert predictions.load(a / predictions.FILE)["after_task"].tolist() == [0, 0]


def test_metrics_recomputed_from_kept_predictions(tmp_path):
    predictions.write(tmp_path, 0, _evaluation(0, AFTER_0), META)
    predictions.write(tmp_path, 1, _evaluation(1, AFTER_1), META)
    arrays = predictions.load(tmp_path / predictions.FILE)
    tracker = evaluate.tracker_of(arrays)
    a = tracker.matrix("model")
    assert a[0, 0] == a[0, 1] == a[1, 1] == 0.5 and np.isnan(a[1, 0])
    np.testing.assert_array_equal(tracker.task_matrix("model")[:, 1], [0.5, 1.0])
    # After task 0: confidences .7 (right, bin 11) and .6 (wrong, bin 9), as float16.
    cal = tracker.calibration["model"]
    assert cal["ece"][0] == pytest.approx((0.3 + 0.6) / 2, abs=1e-3)
    assert cal["nll"][0] == pytest.approx(-(math.log(0.7) + math.log(0.4)) / 2, rel=1e-6)
    more = evaluate.beyond(arrays)["model"]
    assert more["old_to_new"] == [None, 50.0] and more["new_to_old"] == [None, 50.0]
    assert more["per_class_accuracy"] == [0.0, 100.0, 0.0, 100.0]
    assert more["top5_A_t"] == [100.0, 100.0]  # 4 classes: every class is in the top 5
