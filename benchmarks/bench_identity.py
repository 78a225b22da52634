"""Cost of a run's identity (input digests) and of the record rewind at real sizes, each against
a plain file-system baseline measured in the same run.

    nice -n 5 .venv/bin/python benchmarks/bench_identity.py [--weights_mb=330] [--classes=200] \
        [--files=30000] [--config=configs/imagenet_r.py:tasks=10,method=lae] [--train=24000] \
        [--log_every=50,1] [--repeats=3]

In a temporary directory:

* `identity.file_digest` of a `--weights_mb` MiB file of random bytes (ViT-B/16's augreg .npz
  is 330 MiB, 346 MB): the first call (sha256 of the file, written to the on-disk digest
  cache), a second call answered from memory, a call answered from the on-disk cache after
  `identity._MEMORY` is cleared, and one in a fresh process (timed inside it, without the
  interpreter's start); baseline: reading the file in 1 MiB chunks. The file was just written,
  so every read is from the page cache (a weights file read for the first time after a reboot
  adds the disk's time).
* `identity.folder_digest` of a folder in ImageNet-R's layout (`--classes` class folders holding
  `--files` small files: the listing is what is hashed); baseline: a plain `os.walk` of it.
* `MetricsWriter.rewind` of a metrics.jsonl holding a whole run's records: `--config`'s epochs,
  batch and tasks over `--train` training images give the logged train records per task (every
  `log_every_steps`-th step and the last), plus one eval record per task (LAE's three
  predictors), shaped as the trainer writes them. The resume is from a checkpoint in the middle
  of the last task, so the second half of that task's train records and its eval are dropped.
  With TensorBoard the stopped process's event file is there and the resumed writer's new one:
  rewind writes the kept records into one event file and removes both. Baseline: a copy of the
  metrics.jsonl (`shutil.copyfile`). Each `--log_every` value is one row (`config` is the
  config's own; 1 is every step logged).

Times are medians of `--repeats`; the load average is printed beside them.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

from aepg_jax.config import schema
from aepg_jax.runs import identity, records
from aepg_jax.runs import tensorboard as tb

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PREDICTORS = ("ensemble", "online", "offline")  # LAE's


def _timed(fn) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def _median(fn, repeats: int, before=None) -> float:
    """Median seconds of `fn()` over `repeats` calls, `before()` (untimed) ahead of each."""
    out = []
    for _ in range(repeats):
        if before is not None:
            before()
        out.append(_timed(fn))
    return statistics.median(out)


def _t(seconds: float) -> str:
    return f"{seconds * 1e3:.1f} ms" if seconds >= 1e-3 else f"{seconds * 1e6:.0f} us"


def _row(name: str, seconds: float, baseline: float, note: str = "") -> str:
    return f"| {name} | {_t(seconds)} | {seconds / baseline:.3g}x | {note} |"


# --- file_digest ----------------------------------------------------------------------------


def _write_random(path: str, megabytes: int) -> None:
    with open(path, "wb") as f:
        for _ in range(megabytes):
            f.write(os.urandom(1 << 20))  # 1 MiB; random bytes: nothing compresses or dedups


def _plain_read(path: str) -> None:
    with open(path, "rb") as f:
        while f.read(1 << 20):
            pass


FRESH = """
import sys, time
from aepg_jax.runs import identity
start = time.perf_counter()
identity.file_digest(sys.argv[1])
print(time.perf_counter() - start)
"""


def bench_file(tmp: str, megabytes: int, repeats: int) -> list[str]:
    path = os.path.join(tmp, "weights.npz")
    _write_random(path, megabytes)
    cache = os.environ[identity.DIGEST_CACHE_ENV]

    def forget() -> None:
        identity._MEMORY.clear()
        if os.path.exists(cache):
            os.remove(cache)

    plain = _median(lambda: _plain_read(path), repeats)
    first = _median(lambda: identity.file_digest(path), repeats, before=forget)
    memory = _median(lambda: identity.file_digest(path), repeats)
    on_disk = _median(lambda: identity.file_digest(path), repeats, before=identity._MEMORY.clear)
    fresh = statistics.median(
        float(
            subprocess.run(
                [sys.executable, "-c", FRESH, path],
                check=True,
                capture_output=True,
                text=True,
                cwd=REPO,
            ).stdout
        )
        for _ in range(repeats)
    )
    size = os.path.getsize(path)
    return [
        f"`file_digest` of a {size / 1e6:.0f} MB file ({size / 2**20 / plain:.0f} MiB/s read, "
        f"{size / 2**20 / first:.0f} MiB/s hashed; page cache warm)",
        "",
        "| call | time | / plain read | |",
        "|---|---|---|---|",
        _row("plain read, 1 MiB chunks (baseline)", plain, plain),
        _row("first call: sha256 + digest cache written", first, plain),
        _row("second call, in memory", memory, plain),
        _row("from the on-disk cache (`_MEMORY` cleared)", on_disk, plain),
        _row("from the on-disk cache, fresh process", fresh, plain, "timed inside the child"),
    ]


# --- folder_digest --------------------------------------------------------------------------


def bench_folder(tmp: str, classes: int, files: int, repeats: int) -> list[str]:
    root = os.path.join(tmp, "imagenet-r")
    for c in range(classes):
        folder = os.path.join(root, f"n{c:08d}")
        os.makedirs(folder)
        for i in range(c * files // classes, (c + 1) * files // classes):
            with open(os.path.join(folder, f"{i}.jpg"), "wb") as f:
                f.write(b"x" * (i % 97 + 1))

    def walk() -> None:
        for _ in os.walk(root):
            pass

    def digest() -> None:
        identity._MEMORY.clear()
        identity.folder_digest(root)

    plain = _median(walk, repeats)
    first = _median(digest, repeats)
    memory = _median(lambda: identity.folder_digest(root), repeats)
    return [
        f"`folder_digest` of {classes} class folders, {files:,} files (dentry cache warm)",
        "",
        "| call | time | / os.walk | |",
        "|---|---|---|---|",
        _row("plain `os.walk` (baseline)", plain, plain),
        _row("`folder_digest` (listing, sizes, sha256)", first, plain),
        _row("second call, in memory", memory, plain),
    ]


# --- MetricsWriter.rewind -------------------------------------------------------------------


def run_records(tasks: int, steps: int, every: int) -> tuple[list[dict], int]:
    """A whole run's records as the continual trainer writes them (each task `steps` steps,
    train records at every `every`-th and the last step, one eval per task), and the global
    step of a checkpoint in the middle of the last task."""
    out = []
    for t in range(tasks):
        for s in range(1, steps + 1):
            if s % every and s != steps:
                continue
            out.append({
                "type": "train", "task": t, "step": t * steps + s, "task_step": s,
                "epoch": s // 9, "loss": 1.234567 + s * 1e-4, "alpha": 0.4567891,
                "entropy": 2.345678, "lr": 0.0005, "grad_norm": 0.987654,
                "images_per_s": 123.456789, "train_peft": True,
            })  # fmt: skip
        accuracy = {p: [55.5 + i for i in range(t + 1)] for p in PREDICTORS}
        out.append({
            "type": "eval", "task": t, "step": (t + 1) * steps, "accuracy": accuracy,
            "A_t": 60.1, "acc_pooled": 59.9, "entropy": 1.2, "forgetting": 3.4 if t else None,
            "forgetting_stepwise": 2.1 if t else None, "bwt": -3.4 if t else None,
            "old_accuracy": 58.0, "new_accuracy": 70.0, "task_incremental_A_t": 80.0,
            "task_incremental_accuracy": accuracy,
        })  # fmt: skip
    return out, (tasks - 1) * steps + steps // 2


def bench_rewind(tmp: str, cfg, train: int, every: int, repeats: int) -> list[str]:
    tasks = cfg.data.num_tasks
    steps = cfg.optim.epochs * ((train // tasks) // cfg.optim.batch_size)
    if cfg.max_steps_per_task:
        steps = min(steps, cfg.max_steps_per_task)
    recs, cut_step = run_records(tasks, steps, every)
    cut = records.Cut(cut_step, closed=False)
    pristine = os.path.join(tmp, f"pristine-{every}")
    with records.MetricsWriter(pristine, tensorboard=True) as writer:  # the stopped process
        writer.text("config", cfg)
        for r in recs:
            writer.write(r)
    size = os.path.getsize(os.path.join(pristine, records.METRICS_FILE))
    workdir = os.path.join(tmp, f"resumed-{every}")
    copy_to = os.path.join(tmp, "copy.jsonl")
    dropped = set()
    base = _median(
        lambda: shutil.copyfile(os.path.join(pristine, records.METRICS_FILE), copy_to), repeats
    )
    cells = []
    for tensorboard in (False, True):
        times = []
        for _ in range(repeats):
            shutil.rmtree(workdir, ignore_errors=True)
            shutil.copytree(pristine, workdir)
            writer = records.MetricsWriter(workdir, tensorboard=tensorboard)
            writer.text("config", cfg)
            start = time.perf_counter()
            dropped.add(writer.rewind(cut))
            times.append(time.perf_counter() - start)
            writer.close()
            kept = records.read_metrics(workdir)
            assert len(kept) == sum(cut.keeps(r) for r in recs), (len(kept), len(recs))
            if tensorboard:
                assert len(tb.event_files(workdir)) == 1
        t = statistics.median(times)
        cells.append(f"{_t(t)} ({t / base:.3g}x)")
    (drop,) = dropped
    return (
        f"| {every} | {len(recs):,} ({tasks} x {steps} steps) | {size / 1e3:.0f} kB | "
        f"{cut_step} | {drop} | {_t(base)} | {cells[0]} | {cells[1]} |"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--weights_mb", type=int, default=330, help="weights file size (MiB)")
    parser.add_argument("--classes", type=int, default=200, help="class folders")
    parser.add_argument("--files", type=int, default=30_000, help="files in the folder")
    parser.add_argument("--config", default="configs/imagenet_r.py:tasks=10,method=lae")
    parser.add_argument("--train", type=int, default=24_000, help="training images, all tasks")
    parser.add_argument(
        "--log_every", default="config,1", help="log_every_steps values ('config': its own)"
    )
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()

    path, _, arg = args.config.partition(":")
    cfg = schema.from_file(os.path.join(REPO, path), arg or None)
    print(f"load average {os.getloadavg()[0]:.2f} at start, {os.cpu_count()} CPUs")
    with tempfile.TemporaryDirectory() as tmp:
        os.environ[identity.DIGEST_CACHE_ENV] = os.path.join(tmp, "digests.json")
        blocks = [bench_file(tmp, args.weights_mb, args.repeats)]
        blocks.append(bench_folder(tmp, args.classes, args.files, args.repeats))
        rewind = [
            "`MetricsWriter.rewind` of a whole run's metrics.jsonl, resumed mid last task",
            "",
            "| log every | records | size | cut at step | dropped | copy (baseline) | "
            "rewind, TensorBoard off (/ copy) | rewind, TensorBoard on (/ copy) |",
            "|---|---|---|---|---|---|---|---|",
        ]
        for value in args.log_every.split(","):
            every = cfg.log_every_steps if value == "config" else int(value)
            rewind.append(bench_rewind(tmp, cfg, args.train, every, args.repeats))
        blocks.append(rewind)
    print("\n\n".join("\n".join(b) for b in blocks))
    print(f"\nload average {os.getloadavg()[0]:.2f} at end; medians of {args.repeats}")


if __name__ == "__main__":
    main()
