"""TensorBoard event files: the default config's run writes them beside metrics.jsonl, and read
back with TensorBoard's own event reader they hold metrics.jsonl's numbers (and the config)."""

import json
import os
from collections import Counter

import numpy as np
import pytest

from aepg_jax.config import schema
from aepg_jax.continual import trainer
from aepg_jax.runs import records
from aepg_jax.runs import tensorboard as tb

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _events(directory):
    from tensorboard.backend.event_processing import event_accumulator

    acc = event_accumulator.EventAccumulator(
        directory, size_guidance={event_accumulator.SCALARS: 0, event_accumulator.TENSORS: 0}
    )
    acc.Reload()
    return acc


def _default_run(tmp_path, **overrides):
    cfg = schema.from_file(os.path.join(REPO, "configs", "default.py"))
    cfg.data.cache_dir = str(tmp_path / "cache")
    cfg.pretrain.cache_dir = str(tmp_path / "cache" / "pretrained")
    cfg.data.num_tasks = 2
    cfg.max_steps_per_task = 4
    cfg.log_every_steps = 2
    for key, value in overrides.items():
        cfg[key] = value
    workdir = tmp_path / "run"
    trainer.run(cfg, str(workdir))
    return cfg, workdir


def test_the_event_files_hold_the_scalars_of_metrics_jsonl(tmp_path):
    cfg, workdir = _default_run(tmp_path)
    expected: dict[str, dict[int, float]] = {}
    for record in records.read_metrics(workdir):
        for tag, value in tb.scalars(record):
            if "step" in record:
                expected.setdefault(tag, {})[int(record["step"])] = value
    for tag in ("train/loss", "train/alpha", "train/entropy", "train/lr", "train/grad_norm"):
        assert tag in expected, sorted(expected)
    for tag in ("train/images_per_s", "eval/A_t", "eval/forgetting", "eval/acc_pooled"):
        assert tag in expected, sorted(expected)
    assert any(tag.startswith("eval/accuracy/") and tag.endswith("/task_1") for tag in expected)
    # Tasks count from 1, as the console and the docs count them.
    assert not any(tag.endswith("/task_0") for tag in expected)

    acc = _events(str(workdir))
    assert sorted(acc.Tags()["scalars"]) == sorted(expected)
    for tag, by_step in expected.items():
        got = {e.step: e.value for e in acc.Scalars(tag)}
        assert got.keys() == by_step.keys(), tag
        for step, value in by_step.items():  # events store float32
            assert got[step] == pytest.approx(np.float32(value), rel=1e-6, abs=1e-30), tag
    # Forgetting: null (no event) after the first task, a number after the second.
    assert len(expected["eval/forgetting"]) == 1
    text = acc.Tensors("config/text_summary")[0].tensor_proto.string_val[0].decode()
    config = json.loads("\n".join(line[4:] for line in text.splitlines()))
    assert config["loss"]["name"] == cfg.loss.name and config["tensorboard"] is True


def test_tensorboard_false_writes_metrics_jsonl_only(tmp_path):
    _, workdir = _default_run(tmp_path, tensorboard=False)
    assert records.read_metrics(workdir)
    assert not [f for f in os.listdir(workdir) if f.startswith("events.out.tfevents")]


def test_runs_under_one_root_show_by_their_names(tmp_path):
    """A sweep's runs are DIR/<run name>/ workdirs: `tensorboard --logdir=DIR` lists each."""
    from tensorboard.backend.event_processing import plugin_event_multiplexer
    from tensorboard.util import tensor_util

    names = ("imr10,method=lae,seed=0", "imr10,method=plain,seed=0")
    for i, name in enumerate(names):
        with records.MetricsWriter(tmp_path / name, tensorboard=True) as writer:
            writer.write("train", task=0, step=1, loss=float(i))
    multiplexer = plugin_event_multiplexer.EventMultiplexer()
    multiplexer.AddRunsFromDirectory(str(tmp_path))
    multiplexer.Reload()
    assert sorted(multiplexer.Runs()) == sorted(names)
    for i, name in enumerate(names):
        events = multiplexer.Tensors(name, "train/loss")
        assert [float(tensor_util.make_ndarray(e.tensor_proto)) for e in events] == [float(i)]


def test_a_full_disk_under_the_event_file_is_one_line_and_no_thread_traceback(
    tmp_path, monkeypatch, capfd
):
    """The disk fills: an event write fails (ENOSPC at the lowest write call);
    the run's next record raises one line naming the directory and what to do, no thread
    prints a traceback, metrics.jsonl keeps every line written, and closing raises nothing."""
    import errno
    import time

    from tensorboardX import record_writer

    writer = records.MetricsWriter(tmp_path, tensorboard=True)
    writer.write("train", step=0, loss=1.0)
    writer.events.flush()

    def full(self, data):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(record_writer.RecordWriter, "write", full)
    deadline, step = time.time() + 60, 1
    with pytest.raises(tb.EventWriteError) as err:
        while time.time() < deadline:
            writer.write("train", step=step, loss=1.0)
            step += 1
            time.sleep(0.01)
    line = str(err.value)
    assert "\n" not in line and line.startswith(f"cannot write TensorBoard events to {tmp_path} (")
    assert "No space left on device" in line and "--config.tensorboard=False" in line
    writer.close()  # no second error
    lines = (tmp_path / records.METRICS_FILE).read_text().splitlines()
    assert [json.loads(x)["step"] for x in lines] == list(range(step + 1))  # the last too
    captured = capfd.readouterr()
    assert "Traceback" not in captured.err + captured.out


def _raw_events(directory) -> tuple[int, Counter]:
    """(event files, {(tag, step): times}) over every event file of `directory`, read as they
    are, without a reader's merging of repeated steps."""
    from tensorboard.backend.event_processing import event_file_loader

    files = tb.event_files(directory)
    seen: Counter = Counter()
    for path in files:
        for event in event_file_loader.LegacyEventFileLoader(str(path)).Load():
            for value in event.summary.value:
                seen[(value.tag, event.step)] += 1
    return len(files), seen


def test_a_resume_keeps_each_step_once_in_metrics_and_events(tmp_path):
    """A process records task 0 (steps 1-6, its eval at 6) and task 1 up to step 9 and dies; a
    release without rewinding continued it (steps 8-9 again); the resume from checkpoint 8
    (inside task 1) rewinds: metrics.jsonl and the event files hold steps 1-8 once, and after
    the resumed steps 9-10 and task 1's eval, each step once and one event file."""

    def train(writer, steps, task):
        for step in steps:
            writer.write("train", task=task, step=step, loss=float(step))

    first = records.MetricsWriter(tmp_path, tensorboard=True)
    first.text("config", {"seed": 0})
    train(first, range(1, 7), 0)
    first.write("eval", task=0, step=6, A_t=50.0)
    train(first, range(7, 10), 1)
    first.close()  # a killed process's events may be lost unflushed: the rewind rebuilds them
    (path,) = tb.event_files(tmp_path)  # a file name holds the second: one of an earlier one
    path.rename(path.with_name(path.name.replace(".out.tfevents.", ".out.tfevents.1")))
    older = records.MetricsWriter(tmp_path, tensorboard=True)
    train(older, range(8, 10), 1)
    older.close()
    assert _raw_events(tmp_path)[1][("train/loss", 9)] == 2

    resumed = records.MetricsWriter(tmp_path, tensorboard=True)
    resumed.text("config", {"seed": 0})
    assert resumed.rewind(records.Cut(8, closed=False)) == 3  # 12 lines: 8 and 9 twice
    kept = [(r["type"], r["step"]) for r in records.read_metrics(tmp_path)]
    assert kept == [("train", s) for s in range(1, 7)] + [("eval", 6), ("train", 7), ("train", 8)]
    files, seen = _raw_events(tmp_path)
    assert files == 1 and max(c for c in seen.values()) == 1
    assert {s for tag, s in seen if tag == "train/loss"} == set(range(1, 9))
    train(resumed, range(9, 11), 1)
    resumed.write("eval", task=1, step=10, A_t=40.0)
    resumed.close()
    lines = (tmp_path / records.METRICS_FILE).read_text().splitlines()
    assert [json.loads(x)["step"] for x in lines] == [*range(1, 7), 6, *range(7, 11), 10]
    files, seen = _raw_events(tmp_path)
    assert files == 1 and set(seen.values()) == {1}
    assert sorted(s for tag, s in seen if tag == "train/loss") == list(range(1, 11))
    assert sorted(s for tag, s in seen if tag == "eval/A_t") == [6, 10]
    assert seen[("config/text_summary", 0)] == 1


def test_a_cut_keeps_the_train_record_of_its_step_and_the_closing_ones_when_closed():
    at = {"type": "train", "step": 5}, {"type": "eval", "step": 5}, {"type": "epoch", "step": 5}
    after, loose = {"type": "train", "step": 6}, {"type": "note"}
    assert [records.Cut(5, closed=False).keeps(r) for r in (*at, after, loose)] == [
        True, False, False, False, True,
    ]  # fmt: skip
    assert [records.Cut(5).keeps(r) for r in (*at, after, loose)] == [True] * 3 + [False, True]
    assert not records.Cut(0).keeps({"type": "train", "step": 1})


def test_events_are_written_in_the_calling_thread(tmp_path):
    """No queue or background thread: a Ctrl-C raised in the main thread while a record is
    written cannot leave a queue that `close` would wait on."""
    import threading

    before = threading.active_count()
    writer = tb.EventWriter(tmp_path)
    writer.record({"type": "train", "step": 1, "loss": 0.5})
    assert threading.active_count() == before
    writer.close()
    _, seen = _raw_events(tmp_path)
    assert seen[("train/loss", 1)] == 1
