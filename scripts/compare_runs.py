"""Overlays the entropy curves and A_t of several runs (like the paper's Figure 3, CE vs aEPG)
and prints mean +- std over seeds of runs whose configs differ only in the seed.

    .venv/bin/python scripts/compare_runs.py runs/ce_s0 runs/ce_s1 runs/aepg_s0 runs/aepg_s1 \
        --out runs/compare.png --label-key loss.name --label-key method.name

Each RUN_DIR is the workdir of a finished run (its results.json; its metrics.jsonl is optional:
without it the run has no entropy curve), or of a finished `num_seeds` run, which counts as its
seeds (`seed_<s>/`). std is the sample standard deviation (ddof=1); a group of one seed prints
its value and "(1 seed)". The plot goes to `--out`, by default `compare.png` beside the first
RUN_DIR (never into the current directory unless a RUN_DIR is there).
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
import numpy as np

from aepg_jax.continual import results
from aepg_jax.runs import records as records_lib

# The metrics of a run's results.json, in two tables as a run's own seeds summary prints them:
# class-incremental accuracy and forgetting, then task-incremental accuracy and transfer.
METRICS = (results.SEED_METRICS, results.SEED_METRICS_MORE)
DEFAULT_LABEL_KEYS = ("loss.name", "method.name")


SEEDS_RESULTS_FILE = "results_seeds.json"  # a num_seeds run's summary (continual/results.py)


def load_runs(run_dir: Path) -> list[dict[str, Any]]:
    """The runs of one workdir: itself, or each seed of a finished `num_seeds` run."""
    if (run_dir / records_lib.RESULTS_FILE).is_file():
        return [load_run(run_dir)]
    if (run_dir / SEEDS_RESULTS_FILE).is_file():
        summary = json.loads((run_dir / SEEDS_RESULTS_FILE).read_text(encoding="utf-8"))
        seed_dirs = [run_dir / f"seed_{s}" for s in summary.get("seeds", [])]
        if seed_dirs and all((d / records_lib.RESULTS_FILE).is_file() for d in seed_dirs):
            return [load_run(d) for d in seed_dirs]
    raise SystemExit(
        f"error: {run_dir} has no {records_lib.RESULTS_FILE} (nor a {SEEDS_RESULTS_FILE} with "
        "its seed_<s>/ directories); pass the workdir of a finished run (results are written "
        "when the run completes)."
    )


def load_run(run_dir: Path) -> dict[str, Any]:
    """results.json and (if present) metrics.jsonl of one run directory."""
    results_path = run_dir / records_lib.RESULTS_FILE
    results = json.loads(results_path.read_text(encoding="utf-8"))
    metrics_path = run_dir / records_lib.METRICS_FILE
    if metrics_path.is_file():
        records = records_lib.read_metrics(metrics_path)
    else:
        print(
            f"note: {run_dir} has no {records_lib.METRICS_FILE}; no entropy curve.", file=sys.stderr
        )
        records = []
    return {"dir": run_dir, "results": results, "records": records}


def lookup(config: dict[str, Any], dotted: str) -> Any:
    """`config["a"]["b"]` for "a.b"; "?" when missing."""
    node: Any = config
    for part in dotted.split("."):
        if not isinstance(node, dict) or part not in node:
            return "?"
        node = node[part]
    return node


def group_runs(runs: list[dict[str, Any]], label_keys: list[str]) -> dict[str, list[dict]]:
    """Runs grouped by their config without its top-level `seed`, labelled by `label_keys`."""
    groups: dict[str, list[dict]] = {}
    for run in runs:
        config = {k: v for k, v in run["results"].get("config", {}).items() if k != "seed"}
        groups.setdefault(json.dumps(config, sort_keys=True), []).append(run)
    labelled: dict[str, list[dict]] = {}
    for members in groups.values():
        config = members[0]["results"].get("config", {})
        label = " / ".join(str(lookup(config, k)) for k in label_keys)
        base, n = label, 2
        while label in labelled:  # configs differ in keys the label does not show
            label, n = f"{base} [{n}]", n + 1
        labelled[label] = members
    return labelled


def mean_std(values: list[Any]) -> tuple[float, float, int]:
    """Mean and sample std (ddof=1; NaN for one value) of the non-None values, and their count."""
    v = np.array([x for x in values if x is not None], np.float64)
    if not v.size:
        return math.nan, math.nan, 0
    return float(v.mean()), float(v.std(ddof=1)) if v.size > 1 else math.nan, int(v.size)


def format_table(groups: dict[str, list[dict]], metrics: tuple[str, ...]) -> str:
    """Mean +- std of each of `metrics` per group ("-" where no run of the group has it); each
    column at least two characters wider than its metric's name, so that headers stay apart."""
    width = max([len("group"), *map(len, groups)]) + 2
    widths = [max(18, len(m) + 2) for m in metrics]
    header = f"{'group':<{width}}{'seeds':>6}" + "".join(
        f"{m:>{w}}" for m, w in zip(metrics, widths, strict=True)
    )
    lines = [header, "-" * len(header)]
    for label, members in groups.items():
        cells = []
        for metric, w in zip(metrics, widths, strict=True):
            mean, std, n = mean_std([run["results"].get(metric) for run in members])
            if n == 0:
                cells.append(f"{'-':>{w}}")
            elif math.isnan(std):
                cells.append(f"{f'{mean:.2f} (1 seed)':>{w}}")
            else:
                cells.append(f"{f'{mean:.2f} +- {std:.2f}':>{w}}")
        lines.append(f"{label:<{width}}{len(members):>6}" + "".join(cells))
    return "\n".join(lines)


def plot(groups: dict[str, list[dict]], out: str) -> None:
    fig, (ax_h, ax_a) = plt.subplots(1, 2, figsize=(12, 4.2))
    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    for g, (label, members) in enumerate(groups.items()):
        color = colors[g % len(colors)]
        for r, run in enumerate(members):
            name = label if r == 0 else None
            train = [x for x in run["records"] if x.get("type") == "train"]
            pts = [(x["step"], x["entropy"]) for x in train if x.get("entropy") is not None]
            if pts:
                steps, values = zip(*pts, strict=True)
                ax_h.plot(steps, values, color=color, lw=0.9, alpha=0.8, label=name)
            a_t = [np.nan if v is None else v for v in run["results"].get("A_t", [])]
            ax_a.plot(range(1, len(a_t) + 1), a_t, "o-", color=color, alpha=0.8, label=name)
    ax_h.set(xlabel="global step", ylabel="output entropy H(p)", title="Entropy during training")
    ax_a.set(xlabel="after task t (1..T)", ylabel="A_t (%)", title="Incremental accuracy")
    ax_a.xaxis.get_major_locator().set_params(integer=True)
    for ax in (ax_h, ax_a):
        ax.grid(alpha=0.3)
        if ax.has_data():
            ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(out, dpi=120)
    plt.close(fig)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("run_dirs", nargs="+", type=Path, metavar="RUN_DIR")
    parser.add_argument(
        "--out", help="PNG file to write (default: compare.png beside the first RUN_DIR)"
    )
    parser.add_argument(
        "--label-key",
        action="append",
        dest="label_keys",
        help="dotted config key naming a group; repeatable (default: loss.name, method.name)",
    )
    args = parser.parse_args()
    runs = [run for d in args.run_dirs for run in load_runs(d)]
    groups = group_runs(runs, args.label_keys or list(DEFAULT_LABEL_KEYS))
    print("\n\n".join(format_table(groups, m) for m in METRICS))
    out = args.out or str(args.run_dirs[0].resolve().parent / "compare.png")
    plot(groups, out)
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
