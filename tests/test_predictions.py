"""Kept predictions (runs/predictions.py) and the metrics recomputed from them
(aepg_jax/evaluate), on hand-made probabilities with values worked out by hand; what evaluate
says of a damaged, edited or missing file, of an unfinished run and of one another process
holds."""

import math
import os

import jax.numpy as jnp
import numpy as np
import pytest

from aepg_jax.evaluate import evaluate
from aepg_jax.runs import lock, predictions, records

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


# ---------------------------------------------------------------- `aepg_jax.evaluate` on a run


def _run(workdir, finished: bool = True):
    """A run's files as the trainer leaves them: predictions.npz after task 1 of 2, or after
    both and results.json (its figures those recomputed, the file's sha256 recorded)."""
    predictions.write(workdir, 0, _evaluation(0, AFTER_0), META)
    if finished:
        digest = predictions.write(workdir, 1, _evaluation(1, AFTER_1), META)
        out = evaluate.evaluate_dir(str(workdir))
        results = {"methods": out["methods"], "predictions": {"sha256": digest}}
        records.write_results(workdir, results)
    return workdir / predictions.FILE


def _refused(argv, capsys) -> str:
    """`aepg_jax.evaluate argv` ends with exit status 2 and one line: that line."""
    with pytest.raises(SystemExit) as end:
        evaluate.main(argv)
    captured = capsys.readouterr()
    lines = captured.err.splitlines()
    assert end.value.code == 2 and len(lines) == 1 and not captured.out, captured
    assert lines[0].startswith("error: ")
    return lines[0]


def test_evaluate_writes_evaluation_json_of_an_intact_finished_run(tmp_path, capsys):
    _run(tmp_path)
    assert evaluate.main([str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "equal to results.json" in out
    assert (tmp_path / evaluate.OUT_FILE).is_file()
    # what it computed beyond results.json, in short form (the values of AFTER_1)
    assert (
        "  model: per-class accuracy after task 2 (4 classes, %): mean 50.0, min 0.0, max 100.0; "
        "lowest 0: 0.0, 2: 0.0, 1: 100.0"
    ) in out
    confusion = [line for line in out.splitlines() if line.startswith("  model: confusion, ")]
    assert confusion == [
        "  model: confusion, old tasks' examples as the new task's classes (%, after task t): "
        "2: 50.0",
        "  model: confusion, new task's examples as an old task's class (%, after task t): 2: 50.0",
    ]


def test_evaluate_of_a_sweeps_directory_names_its_run_folders(tmp_path, capsys):
    for name in ("demo/loss=ce,seed=0", "demo/loss=aepg,seed=0"):
        (tmp_path / name).mkdir(parents=True)
        _run(tmp_path / name)
    (tmp_path / "sweep.json").write_text("{}")
    line = _refused([str(tmp_path)], capsys)
    assert f"{tmp_path} is a sweep's directory, not a run's" in line
    assert "2 run folders (demo/loss=aepg,seed=0, demo/loss=ce,seed=0)" in line
    assert f"python -m aepg_jax.evaluate {tmp_path}/demo/loss=aepg,seed=0" in line


def _truncate(path):
    path.write_bytes(path.read_bytes()[:3000])


def _flip_a_bit(path):
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 1
    path.write_bytes(bytes(data))


def _change_one_value(path):
    """A well-formed file, every CRC right, one label changed."""
    arrays = predictions.load(path)
    arrays["label"] = arrays["label"].copy()
    arrays["label"][0] += 1
    with open(path, "wb") as f:
        predictions._write_npz(f, arrays)


@pytest.mark.parametrize("damage", [_truncate, _flip_a_bit, _change_one_value])
def test_evaluate_refuses_a_predictions_file_that_is_not_the_one_the_run_wrote(
    tmp_path, capsys, damage
):
    damage(_run(tmp_path))
    line = _refused([str(tmp_path)], capsys)
    assert f"{tmp_path / predictions.FILE} is not the file the run wrote" in line
    assert "results.json" in line and not (tmp_path / evaluate.OUT_FILE).exists()


def test_evaluate_names_a_missing_predictions_file(tmp_path, capsys):
    _run(tmp_path).unlink()
    line = _refused([str(tmp_path)], capsys)
    assert f"{tmp_path / predictions.FILE} is missing (results.json records its sha256" in line


@pytest.mark.parametrize("damage", [_truncate, _flip_a_bit])
def test_a_damaged_file_without_results_json_is_named_in_one_line(tmp_path, capsys, damage):
    """Nothing records the sha256 of an unfinished run's file: reading it finds the damage
    (the zip directory, each member's CRC-32); the trainer's rewrite on resume reads it too."""
    damage(_run(tmp_path, finished=False))
    line = _refused([str(tmp_path), "--partial"], capsys)
    assert f"{tmp_path / predictions.FILE} is damaged (" in line
    with pytest.raises(predictions.Damaged, match="is damaged"):
        predictions.write(tmp_path, 1, _evaluation(1, AFTER_1), META)


def test_evaluate_refuses_an_unfinished_run_or_prints_it_as_such(tmp_path, capsys):
    _run(tmp_path, finished=False)
    line = _refused([str(tmp_path)], capsys)
    assert "run not finished: evaluated after task 1 of 2" in line and "--partial" in line
    assert evaluate.main([str(tmp_path), "--partial"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0] == f"{tmp_path}: run not finished: evaluated after task 1 of 2"
    assert not (tmp_path / evaluate.OUT_FILE).exists()


@pytest.mark.parametrize("seeds", [False, True])
def test_evaluate_writes_nothing_into_a_run_a_live_process_holds(tmp_path, capsys, seeds):
    """The run's lock is held (here by this process: alive, as a training run is): refused,
    named, also when a seed directory of a `num_seeds > 1` run is given; --partial prints."""
    run = tmp_path / "run"
    named = run / "seed_3" if seeds else run
    _run(named, finished=False)
    (run / "config.json").write_text("{}")
    with lock.hold(str(run)):
        line = _refused([str(named)], capsys)
        assert f"{named} is in use by a live process (" in line and f"pid {os.getpid()}" in line
        assert "run not finished: evaluated after task 1 of 2" in line
        assert evaluate.main([str(named), "--partial"]) == 0
        assert "run not finished" in capsys.readouterr().out
    assert not (named / evaluate.OUT_FILE).exists()


def test_evaluate_writes_under_the_runs_lock(tmp_path, capsys, monkeypatch):
    """A process that takes the run between the check and the write: nothing written."""
    _run(tmp_path)

    def taken(workdir):
        raise lock.Busy(lock.busy_message(workdir, None))

    monkeypatch.setattr(lock, "acquire", taken)
    line = _refused([str(tmp_path)], capsys)
    assert f"{evaluate.OUT_FILE} not written: a process took {tmp_path}" in line
    assert not (tmp_path / evaluate.OUT_FILE).exists()
