"""What a sweep's runs are doing, read from outside (`aepg_jax.sweep --status` / `--list`):

done      every run of the unit has its results
running   a live process holds its lock (`runs/lock.py`): that worker, since when, and the
          task it is in (t of T, from metrics.jsonl's eval records and config.json)
failed    its last attempt failed: the error line (sweep_error.txt)
partial   started, not running now (resumes from its checkpoint when claimed)
todo      not started
unknown   no --workdir given: nothing to read
"""

from __future__ import annotations

import json
import pathlib

from aepg_jax.experiments import layout
from aepg_jax.runs import lock


def _tasks(workdir: pathlib.Path) -> tuple[int, int] | None:
    """(task being trained, 1-based; tasks of the run) or None."""
    config = layout.read_json(workdir / "config.json")
    if not config:
        return None
    total = config.get("data", {}).get("num_tasks")
    metrics = workdir / "metrics.jsonl"
    if not metrics.exists():
        seeds = sorted(workdir.glob("seed_*/metrics.jsonl"))
        metrics = seeds[0] if seeds else metrics
    done = 0
    try:
        with open(metrics) as f:
            for line in f:
                try:
                    record = json.loads(line)
                except ValueError:  # a line being written
                    continue
                if record.get("type") == "eval" and isinstance(record.get("task"), int):
                    done = max(done, record["task"] + 1)
    except OSError:
        pass
    if not isinstance(total, int):
        return None
    return min(done + 1, total), total


def status(root: str | None, unit: layout.Unit) -> tuple[str, str]:
    """(status word, detail) of `unit` in the sweep directory `root` (module docstring)."""
    if root is None:
        return "unknown", ""
    if layout.unit_status(root, unit) == "done":
        return "done", ""
    workdir = pathlib.Path(root) / unit.name
    holder = lock.running(str(workdir)) if workdir.is_dir() else None
    if holder is not None:
        tasks = _tasks(workdir)
        where = f", task {tasks[0]} of {tasks[1]}" if tasks else ""
        return "running", f"{holder.host} pid {holder.pid} since {holder.since_text}{where}"
    error = layout.run_error(root, unit.runs[0], unit.changed)
    if (workdir / layout.ERROR_FILE).exists() and error:
        return "failed", error
    return ("partial", "") if (workdir / "config.json").exists() else ("todo", "")


def line(root: str | None, unit: layout.Unit, head: str) -> str:
    word, detail = status(root, unit)
    return f"{head} {word:<7} {unit.name}" + (f"  ({detail})" if detail else "")


def counts(root: str | None, units) -> dict[str, int]:
    out: dict[str, int] = {}
    for unit in units:
        word = status(root, unit)[0]
        out[word] = out.get(word, 0) + 1
    return out
