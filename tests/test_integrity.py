"""Checkpoint integrity: bytes changed on disk never restore as wrong values.

Every file of a saved checkpoint gets a few bytes flipped (its size unchanged), one file at a
time; the restore must return the newest checkpoint's exact values (the file did not matter) or
fall back to the previous checkpoint's exact values, never anything else.
"""

from __future__ import annotations

import json
import logging
import os
import pathlib
import shutil
import subprocess
import sys
import textwrap

import numpy as np
import pytest

from aepg_jax.runs import checkpointing


def _items(step: int) -> dict:
    rng = np.random.default_rng(step)
    return {
        "state": {
            "mu": rng.normal(size=(64, 16)).astype(np.float32),
            "count": np.asarray(step, np.int32),
        }
    }


def _targets(meta):
    del meta
    return {"state": {"mu": np.zeros((64, 16), np.float32), "count": np.asarray(0, np.int32)}}


def _save_two(directory: pathlib.Path) -> None:
    ckpt = checkpointing.Checkpointer(str(directory))
    for step in (1, 2):
        ckpt.save(step, _items(step), {"task": 0, "phase": "in_task", "step": step})
    ckpt.close()


def _flip(path: pathlib.Path) -> None:
    """Inverts 8 bytes in the middle of the file (all of a short file's), size unchanged."""
    data = bytearray(path.read_bytes())
    mid = len(data) // 2
    for i in range(max(0, mid - 4), min(len(data), mid + 4)):
        data[i] ^= 0xFF
    path.write_bytes(bytes(data))


def _same(items, expected) -> bool:
    return all(
        np.array_equal(np.asarray(items["state"][k]), expected["state"][k]) for k in ("mu", "count")
    )


@pytest.fixture(scope="module")
def pristine(tmp_path_factory):
    directory = tmp_path_factory.mktemp("pristine") / "ckpt"
    _save_two(directory)
    return directory


def _files(step_dir: pathlib.Path) -> list[pathlib.Path]:
    return sorted(p for p in step_dir.rglob("*") if p.is_file() and p.stat().st_size > 0)


def test_every_file_of_the_newest_checkpoint(pristine, tmp_path, caplog):
    files = _files(pristine / "2")
    kinds = {p.name.split(".")[-1] if "." in p.name else p.name for p in files}
    assert len(files) >= 4 and len(kinds) >= 3, files  # arrays, manifests, JSON metadata
    fell_back = 0
    for i, original in enumerate(files):
        directory = tmp_path / f"case{i}"
        shutil.copytree(pristine, directory)
        _flip(directory / original.relative_to(pristine))
        ckpt = checkpointing.Checkpointer(str(directory))
        with caplog.at_level(logging.WARNING):
            items, meta = ckpt.restore_latest(_targets)
        ckpt.close()
        rel = original.relative_to(pristine)
        expected = _items(meta["step"])
        assert _same(items, expected), f"flipping {rel} restored wrong values"
        fell_back += meta["step"] == 1
    assert fell_back >= 2  # at least the array data and the meta JSON are caught


def test_tampered_metadata_digest_falls_back(pristine, tmp_path):
    directory = tmp_path / "ckpt"
    shutil.copytree(pristine, directory)
    meta_file = directory / "2" / "meta" / "metadata"
    meta = json.loads(meta_file.read_text())
    meta["task"] = 1  # a plausible change the JSON parser cannot notice
    meta_file.write_text(json.dumps(meta))
    ckpt = checkpointing.Checkpointer(str(directory))
    items, restored_meta = ckpt.restore_latest(_targets)
    ckpt.close()
    assert restored_meta["step"] == 1 and _same(items, _items(1))


def test_meta_without_digests_is_not_trusted(tmp_path):
    directory = tmp_path / "ckpt"
    _save_two(directory)
    meta_file = directory / "2" / "meta" / "metadata"
    meta = json.loads(meta_file.read_text())
    del meta["digests"]
    meta_file.write_text(json.dumps(meta))
    ckpt = checkpointing.Checkpointer(str(directory))
    _, restored_meta = ckpt.restore_latest(_targets)
    ckpt.close()
    assert restored_meta["step"] == 1


def test_no_good_checkpoint_is_one_error(tmp_path):
    directory = tmp_path / "ckpt"
    _save_two(directory)
    for step in ("1", "2"):
        for f in (directory / step / "state").rglob("*"):
            if f.is_file() and f.stat().st_size > 64 and "metadata" not in f.name:
                _flip(f)
    ckpt = checkpointing.Checkpointer(str(directory))
    with pytest.raises(checkpointing.NoRestorableCheckpoint) as err:
        ckpt.restore_latest(_targets)
    ckpt.close()
    message = str(err.value)
    assert "\n" not in message and "move the workdir away" in message
    assert message.count("digest") + message.count("Error") >= 2  # both steps named with a cause


FALLBACK_SCRIPT = textwrap.dedent("""
    import sys
    sys.path.insert(0, {tests!r})
    from test_integrity import _targets
    from aepg_jax.runs import checkpointing
    ckpt = checkpointing.Checkpointer(sys.argv[1])
    items, meta = ckpt.restore_latest(_targets)
    ckpt.close()
    print("restored", meta["step"])
""")


def test_fallback_leaves_a_short_clean_stderr(tmp_path):
    """Garbage array files make tensorstore fail; stderr holds the two warning lines only."""
    directory = tmp_path / "ckpt"
    _save_two(directory)
    for f in (directory / "2" / "state").rglob("*"):
        if f.is_file() and not f.name.endswith(".json") and "metadata" not in f.name:
            f.write_bytes(b"garbage")
    script = tmp_path / "restore.py"
    script.write_text(FALLBACK_SCRIPT.format(tests=str(pathlib.Path(__file__).parent)))
    env = {**os.environ, "JAX_PLATFORMS": "cpu"}
    out = subprocess.run(
        [sys.executable, str(script), str(directory)], capture_output=True, text=True, env=env
    )
    assert out.returncode == 0, out.stderr[-2000:]
    assert "restored 1" in out.stdout
    lines = [line for line in out.stderr.splitlines() if line.strip()]
    assert "Event loop is closed" not in out.stderr
    assert len(lines) <= 2 and all(len(line) < 400 for line in lines), lines


def test_an_abandoned_checkpointer_closes_without_waiting(tmp_path):
    """Ctrl-C: the trainers abandon their checkpointer, whose close then waits on no save
    (a KeyboardInterrupt inside Orbax's hand-over could leave that wait without an end)."""
    ckpt = checkpointing.Checkpointer(str(tmp_path / "checkpoints"))
    waited = []
    ckpt._manager.wait_until_finished = lambda: waited.append(True)
    ckpt.abandon()
    ckpt.close()
    assert waited == []
