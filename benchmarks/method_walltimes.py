"""Every registered method's first look: the embedded default's wall time, relative to plain's.

    .venv/bin/python benchmarks/method_walltimes.py [--methods=plain,ranpac] [--root=DIR]
        [--shared_cache]

For each method M (plain first, then the registry's order, then plain again), a child process
runs what a user types,

    python -m aepg_jax.main --config=configs/default.py --config.method.name=M --workdir=W

with W = `<root>/M` (`--root`: a new temporary directory by default; each run starts in an empty
workdir), from the repository root. Each run gets a fresh, empty persistent compilation cache
(`AEPG_COMPILE_CACHE=<root>/xla_M`): it compiles every program, as a user's first run does;
`--shared_cache` leaves the user's cache on instead (a second look: programs compiled before are
read back). Printed per method: the wall time of the whole command (what `time` reports as
`real`), its ratio to plain's (the mean of the two plain runs of the same invocation: the
machine's load drifts), the run's own `wall_time_s`, its compilations (`compilations` of
results.json: programs compiled, of them read from the cache, seconds compiling) and A_T.
Machine, date and load averages are printed first and last.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from aepg_jax import methods  # noqa: E402


def machine_line() -> str:
    load = " ".join(f"{x:.2f}" for x in os.getloadavg())
    return (
        f"date: {datetime.datetime.now().astimezone().isoformat(timespec='seconds')}; machine: "
        f"{platform.node()}, os.cpu_count()={os.cpu_count()}, {platform.platform()}, Python "
        f"{platform.python_version()}; load average (1, 5, 15 min): {load}"
    )


def run_one(name: str, root: str, shared_cache: bool) -> dict:
    """One user command for method `name`: its wall time and what results.json records."""
    workdir = os.path.join(root, name)
    cmd = [
        sys.executable,
        "-m",
        "aepg_jax.main",
        "--config=configs/default.py",
        f"--config.method.name={name}",
        f"--workdir={workdir}",
    ]
    env = dict(os.environ)
    if not shared_cache:
        env["AEPG_COMPILE_CACHE"] = os.path.join(root, f"xla_{name}")
    log = os.path.join(root, f"{name}.log")
    start = time.perf_counter()
    with open(log, "w") as out:
        code = subprocess.run(
            cmd, cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT
        ).returncode
    wall = time.perf_counter() - start
    if code:
        return {"wall": wall, "error": f"exit status {code} (log: {log})"}
    with open(os.path.join(workdir, "results.json")) as f:
        results = json.load(f)
    return {"wall": wall, "results": results}


def row(name: str, r: dict, plain: float) -> str:
    if "error" in r:
        return f"| {name} | {r['wall']:.1f} s | {r['wall'] / plain:.2f}x | {r['error']} | | |"
    res, c = r["results"], r["results"]["compilations"]
    compiles = f"{c['count']} ({c.get('cached', 0)} cached), {c['seconds']:.1f} s"
    return (
        f"| {name} | {r['wall']:.1f} s | {r['wall'] / plain:.2f}x | {res['wall_time_s']:.1f} s "
        f"| {compiles} | {res['A_T']:.2f} |"
    )


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--methods", default=",".join(methods.NAMES), help="comma-separated names")
    p.add_argument("--root", default=None, help="where the workdirs go (default: a temp dir)")
    p.add_argument("--shared_cache", action="store_true", help="the user's compilation cache")
    args = p.parse_args()
    names = [n for n in args.methods.split(",") if n and n != "plain"]
    unknown = [n for n in names if n not in methods.NAMES]
    if unknown:
        sys.exit(f"error: --methods: unknown {', '.join(unknown)}; use {', '.join(methods.NAMES)}.")
    root = os.path.abspath(args.root or tempfile.mkdtemp(prefix="method_walltimes_"))
    os.makedirs(root, exist_ok=True)
    cache = "the user's (shared)" if args.shared_cache else "a fresh one per run"
    print(machine_line())
    print(f"workdirs under {root}; compilation cache: {cache}", flush=True)
    measured = {}
    order = ["plain", *names, "plain"]
    for i, name in enumerate(order):
        key = "plain (last)" if i == len(order) - 1 else name
        if key == "plain (last)":  # a second plain run: its own, empty workdir
            os.rename(os.path.join(root, "plain"), os.path.join(root, "plain_first"))
            os.rename(os.path.join(root, "plain.log"), os.path.join(root, "plain_first.log"))
            if not args.shared_cache:
                os.rename(os.path.join(root, "xla_plain"), os.path.join(root, "xla_plain_first"))
        measured[key] = run_one(name, root, args.shared_cache)
        print(f"{key}: {measured[key]['wall']:.1f} s", flush=True)
    plains = [measured["plain"]["wall"], measured["plain (last)"]["wall"]]
    plain = sum(plains) / 2
    print(f"\nplain: {plains[0]:.1f} s first, {plains[1]:.1f} s last; ratios to {plain:.1f} s")
    print("| method | wall time | / plain | run's wall_time_s | compilations | A_T (%) |")
    print("|---|---|---|---|---|---|")
    for key, r in measured.items():
        print(row(key, r, plain))
    print(machine_line())
    return 0 if all("error" not in r for r in measured.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
