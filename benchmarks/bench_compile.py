"""Time to a result: what compiling costs the embedded default, at a base revision and here.

For each side (`--base`, a git revision checked out into a temporary `git worktree`, removed at
the end; and this working tree) the embedded default runs twice as a user types it,

    python -m aepg_jax.main --config=configs/default.py --workdir=<fresh>

first with a fresh, empty persistent compilation cache, then again on the same cache (a base
without its own cache setting gets jax's through `JAX_COMPILATION_CACHE_DIR` and min compile
time and entry size 0; this tree's through `AEPG_COMPILE_CACHE`). `JAX_LOG_COMPILES=1` logs every
program: each run's wall time, programs compiled (cache reads apart), seconds compiling (the
sum of "Finished XLA compilation" times, cache reads included), A_T, and the ratios: this
tree's first run over the base's, each side's second run over its first. The decoded data
cache and the shipped backbone are the user's (`~/.cache/aepg_jax`), built before the clock.

`--plan`: one ViT-B/16 train step (task 1's, `configs/imagenet_r.py:tasks=10`, random backbone,
batch 256) compiled for `--target` (default gpu:h100) as `python -m aepg_jax.plan` compiles it
(needs `.venv-aot`, `bash scripts/install.sh aot`): compile seconds in a fresh process with a
fresh cache and again on the same cache. A run before the fit check reused its compilation
compiled that step twice per run (the check's copy, then training's); this tree compiles it
once, and a second run reads it back.

    .venv/bin/python benchmarks/bench_compile.py [--base=de65503] [--plan] [--target=gpu:h100]
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import re
import shutil
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
COMPILED = re.compile(r"Finished XLA compilation of (.+?) in ([0-9.e-]+) sec")
HIT = re.compile(r"[Pp]ersistent compilation cache hit")
A_T = re.compile(r"^A_T \(%\)\s+([0-9.]+)", re.M)
# As `python -m aepg_jax.plan` sets up its process (plan/__main__.py), then task 1's step.
PLAN_STEP = """
import json, os, sys
os.environ.setdefault("JAX_PLATFORMS", "cpu")
os.environ["XLA_FLAGS"] = os.environ.get("XLA_FLAGS", "") + " --xla_gpu_enable_triton_gemm=false"
from aepg_jax.system import compiles, xla_cache
xla_cache.enable(xla_cache.directory(sys.argv[1]))
from aepg_jax.config import schema
from aepg_jax.plan import analysis, programs, shapes, targets
cfg = schema.from_file("configs/imagenet_r.py", "tasks=10")
cfg.model.init = "random"
program = programs.train_programs(shapes.shape_run(cfg))[0]
with compiles.Counter() as counter:
    cost = analysis.compile_cost(program, targets.parse(sys.argv[2]))
print(json.dumps({"program": program.name, "seconds": round(cost.seconds, 1),
                  "cache_reads": counter.cached}))
"""


def run_default(tree: str, workdir: str, cache: str, own_cache: bool) -> dict:
    """One `aepg_jax.main` run of the default from `tree` with the persistent cache `cache`."""
    env = dict(os.environ, JAX_LOG_COMPILES="1", PYTHONPATH=tree)
    env.pop("AEPG_COMPILE_CACHE", None)
    if own_cache:
        env["AEPG_COMPILE_CACHE"] = cache
    else:  # jax's own settings, for a tree that sets no cache itself
        env.update(
            JAX_COMPILATION_CACHE_DIR=cache,
            JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS="0",
            JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES="0",
        )
    cmd = [sys.executable, "-m", "aepg_jax.main", "--config=configs/default.py"]
    start = time.monotonic()
    proc = subprocess.run(
        [*cmd, f"--workdir={workdir}"], cwd=tree, env=env, capture_output=True, text=True
    )
    wall = time.monotonic() - start
    log = proc.stdout + proc.stderr
    if proc.returncode:
        raise SystemExit(f"{tree}: the run failed ({proc.returncode}):\n{log[-3000:]}")
    times = [float(s) for _, s in COMPILED.findall(log)]
    hits = len(HIT.findall(log))
    a_t = A_T.search(log)
    return {
        "wall_s": round(wall, 1),
        "programs": len(times) - hits,
        "cache_reads": hits,
        "compile_s": round(sum(times), 2),
        "A_T": float(a_t.group(1)) if a_t else None,
        "cache_mb": round(du(cache) / 2**20, 2),
    }


def du(path: str) -> int:
    return sum(os.path.getsize(os.path.join(d, f)) for d, _, files in os.walk(path) for f in files)


def own_cache(tree: str) -> bool:
    return os.path.exists(os.path.join(tree, "aepg_jax", "system", "xla_cache.py"))


def side(name: str, tree: str, tmp: str) -> dict:
    cache = os.path.join(tmp, f"{name}-xla")
    runs = {}
    for label in ("first", "second"):
        runs[label] = run_default(
            tree, os.path.join(tmp, f"{name}-{label}"), cache, own_cache(tree)
        )
        print(f"{name:5s} {label:6s} {json.dumps(runs[label])}", flush=True)
    return runs


def plan_step(target: str, tmp: str) -> dict:
    python = os.path.join(ROOT, ".venv-aot", "bin", "python")
    if not os.path.exists(python):
        raise SystemExit("--plan needs .venv-aot: bash scripts/install.sh aot")
    cache = os.path.join(tmp, "plan-xla")
    out = {}
    for label in ("first", "second"):
        cmd = [python, "-c", PLAN_STEP, cache, target]
        proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True)
        if proc.returncode:
            raise SystemExit(f"the plan's compile failed:\n{proc.stderr[-3000:]}")
        out[label] = json.loads(proc.stdout.strip().splitlines()[-1])
        print(f"plan  {label:6s} {json.dumps(out[label])}", flush=True)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--base", default="de65503", help="the git revision to compare with")
    parser.add_argument("--plan", action="store_true", help="also the planner's ViT-B/16 step")
    parser.add_argument("--target", default="gpu:h100")
    parser.add_argument("--skip_default", action="store_true", help="only --plan")
    args = parser.parse_args()
    print(
        f"# {datetime.datetime.now(datetime.UTC):%Y-%m-%d %H:%M} UTC, {platform.node()}, "
        f"{os.cpu_count()} CPUs, load average {os.getloadavg()}",
        flush=True,
    )
    tmp = tempfile.mkdtemp(prefix="bench_compile_")
    base = os.path.join(tmp, "base")
    result = {}
    try:
        if not args.skip_default:
            subprocess.run(
                ["git", "worktree", "add", "--detach", base, args.base],
                cwd=ROOT,
                check=True,
                capture_output=True,
            )
            result["base"] = side("base", base, tmp)
            result["here"] = side("here", ROOT, tmp)
            b, h = result["base"], result["here"]
            here_s, base_s = h["first"]["compile_s"], b["first"]["compile_s"]
            print(
                f"first run compile s, here / base: {here_s:.1f} / {base_s:.1f} = "
                f"{here_s / base_s:.0%}"
            )
            for name, s in (("base", b), ("here", h)):
                print(
                    f"{name}: second / first run compile s: {s['second']['compile_s']:.1f} / "
                    f"{s['first']['compile_s']:.1f} = "
                    f"{s['second']['compile_s'] / s['first']['compile_s']:.0%}; wall "
                    f"{s['second']['wall_s']:.0f} s / {s['first']['wall_s']:.0f} s"
                )
        if args.plan:
            result["plan"] = plan_step(args.target, tmp)
            p = result["plan"]
            print(
                f"plan: {p['first']['program']} for {args.target}: "
                f"{p['first']['seconds']:.0f} s compiling (a run before: twice, "
                f"{2 * p['first']['seconds']:.0f} s; now once), on the same cache "
                f"{p['second']['seconds']:.1f} s"
            )
        print(f"# load average at the end {os.getloadavg()}")
        print(json.dumps(result))
    finally:
        if os.path.exists(base):
            subprocess.run(["git", "worktree", "remove", "--force", base], cwd=ROOT, check=False)
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
