"""Compilations and host memory per task of one continual run, each run in a fresh process.

    .venv/bin/python benchmarks/bench_compiles.py --tasks=2,5            # compilations
    AEPG_MALLOC=keep .venv/bin/python benchmarks/bench_compiles.py --tasks=5 --rss_224

For each task count, a child process runs `configs/default.py` (LAE + aEPG, tiny ViT on
digits) with `data.num_tasks` set and `max_steps_per_task=3` (`AEPG_FIT_CHECK=0`: the fit
check's own compiles left out) and prints what its results.json records under `compilations`
(`aepg_jax/system/compiles.py`: every XLA compilation, with the run's train step `jit(step)` and
evaluation `jit(eval_step)` apart). `--rss_224` runs the same config at 224 px with a random-init
tiny ViT of patch 16 (196 tokens), batch 32, `max_steps_per_task=4`, evaluation batch 64, and
prints `RssAnon` (MB, /proc/self/status) after each task's end hook and VmHWM at the end; the
allocator is `AEPG_MALLOC`'s (docs/performance.md).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

CHILD = r"""
import json, os, sys
sys.path.insert(0, {root!r})
from aepg_jax.config import schema
from aepg_jax.continual import trainer

def status(field):
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1]) // 1024  # kB -> MB
    return None

rss = []
original = trainer.end_task

def end_task(run, t, state):
    out = original(run, t, state)
    rss.append(status("RssAnon"))
    return out

trainer.end_task = end_task
cfg = schema.from_file(os.path.join({root!r}, "configs/default.py"), None)
cfg.data.num_tasks = {tasks}
cfg.max_steps_per_task = {steps}
cfg.data.cache_dir = os.path.join({workdir!r}, "cache")
for key, value in {overrides!r}.items():
    node = cfg
    *parents, leaf = key.split(".")
    for p in parents:
        node = node[p]
    node[leaf] = value
results = trainer.run(cfg, os.path.join({workdir!r}, "run"))
print(json.dumps({{"compilations": results["compilations"], "rss_anon_mb": rss,
                  "vm_hwm_mb": status("VmHWM")}}))
"""

RSS_224 = {
    "model.image_size": 224,
    "model.patch_size": 16,
    "model.init": "random",
    "data.store_size": 224,
    "optim.batch_size": 32,
    "eval.batch_size": 64,
}


def one(tasks: int, rss_224: bool) -> dict:
    with tempfile.TemporaryDirectory() as workdir:
        code = CHILD.format(
            root=ROOT,
            tasks=tasks,
            steps=4 if rss_224 else 3,
            workdir=workdir,
            overrides=RSS_224 if rss_224 else {},
        )
        env = {**os.environ, "AEPG_FIT_CHECK": "0"}
        done = subprocess.run(
            [sys.executable, "-c", code], env=env, capture_output=True, text=True, check=False
        )
        if done.returncode:
            sys.exit(f"error: the run with {tasks} tasks failed:\n{done.stderr[-3000:]}")
        return json.loads(done.stdout.strip().splitlines()[-1])


def _program(compilations: dict, name: str) -> str:
    found = compilations["programs"].get(name)
    return f"{found['count']} ({found['seconds']:.1f} s)" if found else "0"


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--tasks", default="2,5", help="task counts, one run (process) each")
    p.add_argument("--rss_224", action="store_true", help="the 224 px variant, RSS per task")
    args = p.parse_args()
    for tasks in map(int, args.tasks.split(",")):
        r = one(tasks, args.rss_224)
        c = r["compilations"]
        line = (
            f"tasks {tasks}: {c['count']} compilations, {c['seconds']:.1f} s; "
            f"train step {_program(c, 'jit(step)')}, eval {_program(c, 'jit(eval_step)')}"
        )
        if args.rss_224:
            rss = " / ".join(map(str, r["rss_anon_mb"]))
            line += f"; RssAnon after each task {rss} MB, VmHWM {r['vm_hwm_mb']} MB"
        print(line, flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
