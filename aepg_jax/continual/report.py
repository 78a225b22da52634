"""What a finished continual run reports: each seed's results.json and plots, the seeds'
summary (results_seeds.json) and the terminal tables."""

from __future__ import annotations

import os

from aepg_jax.continual import plots, results
from aepg_jax.continual.bookkeeping import Bookkeeping
from aepg_jax.continual.setup import Run
from aepg_jax.runs import checkpointing, records
from aepg_jax.system import environment


def _seed_config(run: Run, seed: int) -> dict:
    """The config of one seed of a multi-seed run, as a single run of that seed has it."""
    d = run.cfg.to_dict()
    d["seed"], d["num_seeds"] = int(seed), 1
    return d


def provenance(run: Run, seed_index: int, env: dict) -> dict:
    """What one seed's numbers depend on besides its config: the frozen backbone's fingerprint
    (as a single run of that seed computes it), the backbone's file, the environment."""
    fingerprint = (
        run.fingerprint
        if run.frozen_axis is None
        else checkpointing.backbone_fingerprint(run.frozen_of(seed_index))
    )
    return {
        "backbone_fingerprint": fingerprint,
        "backbone_source": run.backbone_source,
        "environment": env,
    }


def report(run: Run, book: Bookkeeping, wall: float, compilations: dict | None = None) -> dict:
    """Writes results (per seed, plus the seeds' summary) and returns the run's results;
    `compilations` (`compiles.Counter.summary`) goes into each results file."""
    env = environment.describe()
    per_seed = [
        results.build_results(
            tracker,
            _seed_config(run, seed),
            wall,
            seed,
            list(run.head_sizes),
            provenance(run, i, env),
        )
        for i, (tracker, seed) in enumerate(zip(book.trackers, run.axis.seeds, strict=True))
    ]
    if compilations is not None:
        for res in per_seed:
            res["compilations"] = compilations
    if run.is_main:
        for res, directory in zip(per_seed, book.seed_dirs, strict=True):
            records.write_results(directory, res)
            plots.write_plots(
                directory, res, records.read_metrics(os.path.join(directory, records.METRICS_FILE))
            )
    if not run.axis.vmapped:
        if run.is_main:
            print(results.final_table(per_seed[0]))
        return per_seed[0]
    summary = results.seeds_summary(per_seed, records.to_jsonable(run.cfg.to_dict()), wall)
    if compilations is not None:
        summary["compilations"] = compilations
    if run.is_main:
        records.write_results(run.workdir, summary, results.SEEDS_RESULTS_FILE)
        print(results.seeds_table(summary))
    return summary
