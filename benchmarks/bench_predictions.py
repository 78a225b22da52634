"""Size and write time of a run's kept predictions (`aepg_jax/runs/predictions.py`) at the real
test-set sizes, without training: one file per run, rewritten after each task's evaluation.

    .venv/bin/python benchmarks/bench_predictions.py                     # ImageNet-R, DomainNet
    .venv/bin/python benchmarks/bench_predictions.py --test=176743 --tasks=5 --classes=345

For T tasks of equal size over a test split of N images, the evaluation after task t keeps one
row per seen test image, so the file holds sum_t (t + 1) N / T rows in the end. The columns
are those a run writes (random values of the file's dtypes: their size does not depend on the
values, the file being uncompressed), for one predictor (`plain`, `model`) and for LAE's three
(`ensemble`, `online`, `offline`). Prints rows, bytes per row, the final file's size and the
time of the last rewrite (the longest: it copies every earlier evaluation's rows).
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time

import numpy as np

from aepg_jax.runs import predictions

# (name, test images, tasks, classes): ImageNet-R as the paper splits it (80/20 of 30,000
# images, 10 tasks of 20 classes), DomainNet as CODA-Prompt's 5 tasks of 69 classes.
DATASETS = (("imagenet_r", 6_000, 10, 200), ("domainnet", 176_743, 5, 345))


def evaluation(after_task: int, sizes: list[int], classes: int, names: tuple[str, ...], rng):
    """The flat columns of the evaluation after `after_task` (tasks 0..after_task)."""
    n = sum(sizes[: after_task + 1])
    k = min(predictions.TOP_K, classes)
    cls = np.int16 if classes <= np.iinfo(np.int16).max else np.int32
    cols = {
        "after_task": np.full(n, after_task, np.int16),
        "task": np.repeat(np.arange(after_task + 1, dtype=np.int16), sizes[: after_task + 1]),
        "index": np.arange(n, dtype=np.int32),
        "label": rng.integers(0, classes, n).astype(cls),
        "logged_entropy": rng.random(n, dtype=np.float32),
    }
    for p in names:
        cols[f"{p}/top_classes"] = rng.integers(0, classes, (n, k)).astype(cls)
        cols[f"{p}/top_probs"] = rng.random((n, k)).astype(np.float16)
        cols[f"{p}/p_true"] = rng.random(n, dtype=np.float32)
        cols[f"{p}/entropy"] = rng.random(n).astype(np.float16)
        cols[f"{p}/task_pred"] = rng.integers(0, classes, n).astype(cls)
    return cols


def measure(name: str, test: int, tasks: int, classes: int, names: tuple[str, ...]) -> str:
    sizes = [len(a) for a in np.array_split(np.arange(test), tasks)]
    rng = np.random.default_rng(0)
    meta = {"format": predictions.FORMAT, "predictors": list(names), "num_classes": classes}
    with tempfile.TemporaryDirectory() as d:
        for t in range(tasks):
            cols = evaluation(t, sizes, classes, names, rng)
            start = time.perf_counter()
            predictions.write(d, t, cols, meta)
            seconds = time.perf_counter() - start
        size = os.path.getsize(os.path.join(d, predictions.FILE))
        rows = len(predictions.load(os.path.join(d, predictions.FILE))["label"])
    return (
        f"{name:<11} {len(names)} predictor(s): {rows:>9,} rows, {size / rows:5.1f} B/row, "
        f"{size / 2**20:7.1f} MiB, last rewrite {seconds:.2f} s"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--test", type=int, help="test images (default: the two datasets)")
    parser.add_argument("--tasks", type=int, default=10)
    parser.add_argument("--classes", type=int, default=200)
    args = parser.parse_args()
    datasets = DATASETS if args.test is None else (("custom", args.test, args.tasks, args.classes),)
    for name, test, tasks, classes in datasets:
        for names in (("model",), ("ensemble", "online", "offline")):
            print(measure(name, test, tasks, classes, names), flush=True)


if __name__ == "__main__":
    main()
