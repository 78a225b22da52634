"""The host-side records of a run: accuracy trackers and metric writers (one per seed), elapsed
time, and the `meta` that every checkpoint stores to resume them."""

from __future__ import annotations

import os
import time

import numpy as np
import tqdm

from aepg_jax.continual import metrics
from aepg_jax.continual.setup import Run
from aepg_jax.runs.records import MetricsWriter


class Bookkeeping:
    """Trackers, writers and wall time of `run`; only process 0 writes files."""

    def __init__(self, run: Run, state_layout: int):
        self.run = run
        self.state_layout = state_layout
        seeds = run.axis.seeds
        self.seed_dirs = (
            [os.path.join(run.workdir, f"seed_{s}") for s in seeds]
            if run.axis.vmapped
            else [run.workdir]
        )
        self.writers = [
            MetricsWriter(d, enabled=run.is_main, tensorboard=run.cfg.get("tensorboard", True))
            for d in self.seed_dirs
        ]
        for writer in self.writers:
            writer.text("config", run.cfg)
        self.trackers = [
            metrics.AccuracyTracker(run.num_tasks, run.method.predictors) for _ in seeds
        ]
        self.elapsed_before = 0.0
        self.started = time.time()

    def elapsed(self) -> float:
        """Wall seconds of this run, earlier (resumed) sessions included."""
        return self.elapsed_before + time.time() - self.started

    def meta(self, task: int, phase: str, epoch: int) -> dict:
        """What a checkpoint stores beside the state."""
        return {
            "state_layout": self.state_layout,
            "task": task,
            "phase": phase,
            "epoch": epoch,
            "seeds": list(self.run.axis.seeds),
            "trackers": [t.to_dict() for t in self.trackers],
            "head_sizes": list(self.run.head_sizes[: task + 1]),
            "backbone_sha256": self.run.fingerprint,
            "elapsed_s": self.elapsed(),
        }

    def resume_from(self, meta: dict) -> None:
        """Takes the trackers and elapsed time of a restored checkpoint."""
        self.trackers = [metrics.AccuracyTracker.from_dict(d) for d in meta["trackers"]]
        self.elapsed_before = meta["elapsed_s"]

    def record_eval(self, task: int, step: int, results: list[dict]) -> None:
        """Writes each seed's eval record and prints A_t (mean +- std over seeds)."""
        predictors = self.run.method.predictors
        primary = predictors[0]
        a_t = []
        for result, tracker, writer in zip(results, self.trackers, self.writers, strict=True):
            a = tracker.matrix(primary)
            a_t.append(100.0 * metrics.incremental_accuracy(a, task))
            writer.write(
                {
                    "type": "eval",
                    "task": task,
                    "step": step,
                    "accuracy": {
                        p: [result["per_task"][i][p] for i in range(task + 1)] for p in predictors
                    },
                    "A_t": a_t[-1],
                    "acc_pooled": 100.0
                    * metrics.pooled_accuracy(
                        tracker.correct[primary], tracker.total[primary], task
                    ),
                    "entropy": result["entropy"],
                    # Mean forgetting of tasks < task (NaN -> null after the first task).
                    "forgetting": 100.0 * metrics.mean_forgetting(a[: task + 1, : task + 1]),
                }
            )
        if not self.run.is_main:
            return
        if self.run.axis.vmapped:
            summary = (
                f"{np.mean(a_t):.2f} +- {np.std(a_t, ddof=1):.2f}% over "
                f"{len(a_t)} seeds ({primary})"
            )
        else:
            summary = f"{a_t[0]:.2f}% ({primary})"
        tqdm.tqdm.write(f"after task {task + 1}: A_t = {summary}")

    def close(self) -> None:
        for writer in self.writers:
            writer.close()
