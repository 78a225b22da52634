"""benchmarks/rehearse.py: RSS sampling, phase and task summaries, a tiny rehearsal (slow)."""

import json
import os
import sys
import time
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
import make_synthetic_archives
import rehearse


def test_status_reads_rss_and_anonymous_rss():
    rss, anon = rehearse._status(os.getpid())
    assert 0 < anon <= rss
    assert rehearse._status(2**22 + 12345) is None  # no such process


def test_summarise_phases_and_rss_at_the_end_of_each_task():
    t0 = 1000.0
    gib = 2**30
    samples = [(t0 + k, (1 + k) * gib, k * gib // 2) for k in range(10)]
    events = [
        {"phase": "cache build", "task": None, "start": t0, "end": t0 + 2.5, "disk": 3 * gib},
        {"phase": "setup", "task": None, "start": t0, "end": t0 + 3.5, "disk": 3 * gib},
        {"phase": "training steps", "task": 0, "start": t0 + 3.5, "end": t0 + 5.5, "disk": 3 * gib},
        {"phase": "evaluation", "task": 0, "start": t0 + 5.5, "end": t0 + 6.5, "disk": 3 * gib},
        {"phase": "checkpoint", "task": None, "start": t0 + 6.5, "end": t0 + 7.5, "disk": 4 * gib},
        {"phase": "evaluation", "task": 1, "start": t0 + 7.5, "end": t0 + 8.5, "disk": 4 * gib},
        {"phase": "flush", "task": None, "start": t0 + 8.6, "end": t0 + 8.7, "disk": 4 * gib},
    ]
    out = rehearse.summarise(events, samples, t0)
    phases = {p["phase"]: p for p in out["phases"]}
    assert phases["cache build"]["disk_gib"] == 3 and phases["checkpoint"]["disk_gib"] == 1
    assert phases["setup"]["wall_s"] == pytest.approx(1.0)  # the cache build is not counted twice
    assert phases["evaluation"]["calls"] == 2 and phases["evaluation"]["wall_s"] == pytest.approx(2)
    assert phases["flush"]["peak_rss_gib"] is None  # no sample inside: unknown, not 0
    # The RSS of a task is the last sample before its evaluation ended.
    assert [t["task"] for t in out["tasks"]] == [1, 2]
    assert [t["rss_gib"] for t in out["tasks"]] == [samples[6][1] / gib, samples[8][1] / gib]
    assert [t["anon_gib"] for t in out["tasks"]] == [samples[6][2] / gib, samples[8][2] / gib]
    # Disk already there before the run (another dataset's cache) is not the run's.
    later = rehearse.summarise(events, samples, t0, disk_start=gib)
    assert {p["phase"]: p["disk_gib"] for p in later["phases"]}["cache build"] == 2
    assert "| evaluation | 2 |" in rehearse.table(
        {"dataset": "x", "phases": out["phases"], "run": None}
    )


def test_missing_archive_is_one_error_line(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(
        sys, "argv", ["rehearse.py", "imagenet_r", f"--archives={tmp_path}", f"--root={tmp_path}"]
    )
    with pytest.raises(SystemExit) as exit_info:
        rehearse.main()
    err = capsys.readouterr().err.strip().splitlines()
    assert exit_info.value.code == 2 and len(err) == 1
    assert err[0].startswith("error: --archives:") and "imagenet-r.tar" in err[0]


@pytest.mark.slow
def test_tiny_rehearsal_end_to_end(tmp_path, monkeypatch):
    """A 404-image Food-101 archive in the official layout, prepared and run through every
    phase of the 10-task config (small images: the mechanics, not the sizes, are tested)."""
    archives = tmp_path / "archives"
    make_synthetic_archives.make("food101", str(archives), scale=0.001)
    root = tmp_path / "root"
    flags = [
        "--config.model.image_size=32",
        "--config.model.patch_size=16",
        "--config.data.store_size=32",
        "--config.optim.batch_size=8",
    ]
    monkeypatch.setattr(
        sys,
        "argv",
        [
            "rehearse.py",
            "food101",
            f"--archives={archives}",
            f"--root={root}",
            "--steps=1",
            "--interval=0.1",
            *flags,
        ],
    )
    start = time.time()
    with pytest.raises(SystemExit) as exit_info:
        rehearse.main()
    assert exit_info.value.code == 0
    result = json.loads((root / "rehearsal-food101.json").read_text())
    phases = {p["phase"]: p for p in result["phases"]}
    assert phases["archive check"]["ok"] and phases["preparation"]["exit"] == 0
    assert phases["training steps"]["calls"] == 10 and phases["evaluation"]["calls"] == 10
    assert phases["cache build"]["disk_gib"] > 0 and phases["checkpoint"]["disk_gib"] > 0
    run = result["run"]
    assert [t["task"] for t in run["tasks"]] == list(range(1, 11))
    assert all(
        0 < t["anon_gib"] <= t["rss_gib"] <= run["peak_rss_gib"] * 1.01 for t in run["tasks"]
    )
    assert run["wall_s"] < time.time() - start


def test_run_flags_per_trainer_and_data_layout():
    """CIFAR runs the from-scratch trainer capped per epoch (no ViT flags); CLRS25 reads its
    prepared folder; the TFDS datasets the prepared root."""
    cifar = rehearse.run_flags("cifar10", "/r", steps=3, epochs=2)
    assert cifar[0].startswith("--config=configs/cifar_scratch.py:dataset=cifar10")
    assert "--config.max_steps_per_epoch=3" in cifar and "--config.optim.epochs=2" in cifar
    assert not any(f.startswith("--config.model.") for f in cifar)
    clrs = rehearse.run_flags("clrs25", "/r", steps=2, epochs=2)
    assert "--config.data.data_dir=/r/prepared/clrs25" in clrs
    assert "--config.max_steps_per_task=2" in clrs and rehearse.NARROW[0] in clrs
    cub = rehearse.run_flags("caltech_birds2011", "/r", steps=2, epochs=2)
    assert cub[0].startswith("--config=configs/cub200.py") and cub[-1].endswith("=/r/prepared")


def test_archive_check_covers_every_listed_file(tmp_path):
    """CUB's checksums file lists both archives: a changed second one fails the check."""
    make_synthetic_archives.make("caltech_birds2011", str(tmp_path), scale=0.001, classes=2)
    first = str(tmp_path / "CUB_200_2011.tgz")
    assert rehearse.check_archive(first)["ok"]
    with open(tmp_path / "segmentations.tgz", "ab") as f:
        f.write(b"\0")
    assert not rehearse.check_archive(first)["ok"]
    folder = tmp_path / "CLRS"
    (folder / "a").mkdir(parents=True)
    (folder / "a" / "x.tif").write_bytes(b"12345")
    assert rehearse.check_archive(str(folder))["disk_gib"] == 5 / 2**30


@pytest.mark.slow
def test_tiny_scratch_rehearsal_end_to_end(tmp_path, monkeypatch):
    """CIFAR-10's python tarball (50 + 10 images) through the from-scratch trainer: each
    epoch is timed as a task, with its evaluation and checkpoint."""
    archives = tmp_path / "archives"
    make_synthetic_archives.make("cifar10", str(archives), scale=0.001)
    root = tmp_path / "root"
    monkeypatch.setattr(
        sys,
        "argv",
        [
            "rehearse.py",
            "cifar10",
            f"--archives={archives}",
            f"--root={root}",
            "--steps=1",
            "--epochs=2",
            "--interval=0.1",
            "--config.optim.batch_size=16",
        ],
    )
    with pytest.raises(SystemExit) as exit_info:
        rehearse.main()
    assert exit_info.value.code == 0
    result = json.loads((root / "rehearsal-cifar10.json").read_text())
    phases = {p["phase"]: p for p in result["phases"]}
    assert phases["preparation"]["records"] == {"train": 50, "test": 10}
    assert phases["training steps"]["calls"] == 2 and phases["evaluation"]["calls"] == 2
    assert phases["checkpoint"]["disk_gib"] > 0
    assert [t["task"] for t in result["run"]["tasks"]] == [1, 2]
