"""Rehearse a paper dataset at its real size on the host: archive, prepare, cache, train, evaluate.

    python benchmarks/rehearse.py imagenet_r --archives=rehearsal/archives \
        --root=rehearsal [--skip_prepare] [--fresh_cache] [--steps=2] [--epochs=2]

For each dataset NAME (imagenet_r, food101, caltech_birds2011, cifar10, cifar100, clrs25,
domainnet, imagenet_a, objectnet, omnibenchmark, vtab; the files of
`benchmarks/make_synthetic_archives.py`): checks the archive(s) against
`<first archive>.checksums.tsv` (size and sha256; CLRS25's folder has no digest and is only
measured), prepares it with `python -m aepg_jax.prepare` in a TensorFlow-free child
(`bench_prepare.run_prepare`; `--skip_prepare` reuses `ROOT/prepared/NAME` and reports its
size), then runs the dataset's paper config (`CONFIGS`) end to end through `python -m
aepg_jax.main` in a child process. The continual configs: the real image size (224 px crops of
the 256 px decode-once cache), the paper's batch 256, every task and every evaluation, but
`max_steps_per_task=--steps` and a narrow random-init ViT. CIFAR (`configs/cifar_scratch.py`,
the from-scratch trainer): 32 px, batch 256, `--epochs` epochs of `max_steps_per_epoch=--steps`
steps, each followed by the evaluation of the whole test split and a checkpoint, with the
`resnet_small` preset (each epoch is a "task" in the tables). The host side is rehearsed, not
accuracy. The child records when each phase starts and ends (setup with the cache build, fit
check, training, evaluation, checkpoint per task); this process samples the child's RSS and
anonymous RSS (`/proc/<pid>/status` VmRSS, RssAnon) every `--interval` s. Per phase: wall time,
peak RSS, disk added (cache dir + workdir); per task: RSS and anonymous RSS when its evaluation
ends. Further `--config.*` flags go to the run. Prints Markdown tables and writes
`ROOT/rehearsal-NAME[-TAG].json` (`--run_config=CONFIG` runs that config instead of the dataset's,
with the continual limits). Cache and run directories live under ROOT (`ROOT/cache`,
`ROOT/runs/NAME`), never in the repository.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import subprocess
import sys
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import bench_prepare

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PILOT = ("imagenet_a", "objectnet", "omnibenchmark", "vtab")
CONFIGS = {
    "imagenet_r": "configs/imagenet_r.py:tasks=10,method=lae",
    "food101": "configs/food101.py:method=lae",
    "caltech_birds2011": "configs/cub200.py:method=lae",
    "cifar10": "configs/cifar_scratch.py:dataset=cifar10,model=resnet_small",
    "cifar100": "configs/cifar_scratch.py:dataset=cifar100,model=resnet_small",
    "clrs25": "configs/clrs25.py:method=lae",
    "domainnet": "configs/domainnet.py:method=lae",
    **{n: f"configs/pilot.py:dataset={n},method=lae" for n in PILOT},
}
# The from-scratch trainer (CIFAR): `--epochs` epochs of `--steps` steps, each followed by the
# evaluation of the whole test split and a checkpoint; the narrow ResNet is in CONFIGS.
SCRATCH = ("cifar10", "cifar100")
# Image folders: prepared into `prepared/NAME`, which is the run's data_dir.
FOLDERS = ("clrs25", *PILOT)
# A narrow ViT with the paper's 5 PEFT blocks (0-4): the data path is full size, the model is not.
NARROW = (
    "--config.model.init=random",
    "--config.model.hidden_size=64",
    "--config.model.depth=5",
    "--config.model.num_heads=2",
    "--config.model.mlp_dim=128",
)

# Run in the child: wraps the loop's phases so that each writes (phase, task, start, end, disk)
# to $REHEARSE_EVENTS, then `python -m aepg_jax.main ARGS`.
CHILD = """
import functools, json, os, runpy, sys, time
from aepg_jax.continual import evaluation, fit, setup, trainer
from aepg_jax.data import cache
from aepg_jax.runs import checkpointing
from aepg_jax.scratch import trainer as scratch
EVENTS, DIRS = os.environ["REHEARSE_EVENTS"], os.environ["REHEARSE_DIRS"].split(os.pathsep)
sys.path.insert(0, os.environ["REHEARSE_BENCHMARKS"])
import bench_prepare
def du():
    return sum(bench_prepare.du(d) for d in DIRS)
CALLS = {}
def timed(phase, fn, task_arg=None):
    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        start = time.time()
        out = fn(*args, **kwargs)
        calls = CALLS[phase] = CALLS.get(phase, -1) + 1
        task = calls if task_arg == () else None if task_arg is None else args[task_arg]
        with open(EVENTS, "a") as f:
            f.write(json.dumps({"phase": phase, "task": task, "start": start,
                                "end": time.time(), "disk": du()}) + "\\n")
        return out
    return wrapper
cache.load_or_build = timed("cache build", cache.load_or_build)
setup.build = timed("setup", setup.build)
fit.check_programs = timed("fit check", fit.check_programs, 2)
trainer.train_task = timed("training steps", trainer.train_task, 4)
evaluation.evaluate = timed("evaluation", evaluation.evaluate, 2)
# The from-scratch trainer: an epoch is a "task", evaluated on the whole test split after it.
scratch._Run.__init__ = timed("setup", scratch._Run.__init__)
scratch._Run.train_epoch = timed("training steps", scratch._Run.train_epoch, 2)
scratch._Run.evaluate = timed("evaluation", scratch._Run.evaluate, ())
Ck = checkpointing.Checkpointer
Ck.save = timed("checkpoint", Ck.save)
Ck.wait = timed("checkpoint", Ck.wait)
sys.argv = ["aepg_jax.main", *sys.argv[1:]]
try:
    runpy.run_module("aepg_jax.main", run_name="__main__", alter_sys=True)
finally:  # an accelerator's peak (None on the CPU, whose memory is the RSS above)
    import jax
    stats = jax.local_devices()[0].memory_stats() or {}
    if "peak_bytes_in_use" in stats:
        with open(EVENTS, "a") as f:
            f.write(json.dumps({"phase": "device memory",
                                "device": jax.local_devices()[0].device_kind,
                                "peak_bytes": stats["peak_bytes_in_use"],
                                "limit_bytes": stats.get("bytes_limit")}) + "\\n")
"""


def check_archive(archive: str) -> dict:
    """Size and sha256 of `archive` and of every file listed beside it in its checksums file
    (lines `name\\tsize\\tsha256`, the files in `archive`'s directory); a folder (CLRS25, no
    published digest) is only counted."""
    start = time.time()
    if os.path.isdir(archive):
        return {
            "phase": "archive check (folder: size only)",
            "wall_s": time.time() - start,
            "ok": True,
            "disk_gib": bench_prepare.du(archive) / 2**30,
        }
    ok, disk = True, 0
    with open(f"{archive}.checksums.tsv") as f:
        rows = [line.split() for line in f if line.strip()]
    for filename, size, digest in rows:
        path = os.path.join(os.path.dirname(archive), filename)
        h = hashlib.sha256()
        with open(path, "rb") as f:
            while chunk := f.read(1 << 22):
                h.update(chunk)
        ok = ok and os.path.getsize(path) == int(size) and h.hexdigest() == digest
        disk += os.path.getsize(path)
    return {
        "phase": "archive check",
        "wall_s": time.time() - start,
        "ok": ok,
        "disk_gib": disk / 2**30,
    }


def _status(pid: int) -> tuple[int, int] | None:
    """(VmRSS, RssAnon) of `pid` in bytes, or None once it is gone."""
    try:
        with open(f"/proc/{pid}/status") as f:
            fields = dict(line.split(":", 1) for line in f if ":" in line)
        return tuple(int(fields[k].split()[0]) * 1024 for k in ("VmRSS", "RssAnon"))
    except (OSError, KeyError, ValueError):
        return None


def run_flags(
    name: str, root: str, steps: int, epochs: int, config: str | None = None
) -> list[str]:
    """The flags that make `name`'s paper config (or `config`) a rehearsal: narrow model,
    capped steps."""
    data_dir = os.path.join(root, "prepared", *((name,) if name in FOLDERS else ()))
    if name in SCRATCH and config is None:
        limits = [
            f"--config.max_steps_per_epoch={steps}",
            f"--config.optim.epochs={epochs}",
            "--config.checkpoint_every_epochs=1",
        ]
    else:
        limits = [*NARROW, f"--config.max_steps_per_task={steps}"]
    return [f"--config={config or CONFIGS[name]}", *limits, f"--config.data.data_dir={data_dir}"]


def run_config(name: str, root: str, flags: list[str], extra: list[str], interval: float) -> dict:
    """Runs the paper config of `name` in a child, sampling its RSS; returns phases and tasks."""
    workdir, cache_dir = os.path.join(root, "runs", name), os.path.join(root, "cache")
    shutil.rmtree(workdir, ignore_errors=True)  # a fresh run, not a resumed one
    os.makedirs(workdir)
    events_path = os.path.join(root, f"rehearsal-{name}.events.jsonl")
    if os.path.exists(events_path):
        os.remove(events_path)
    # The dataset's own cache (other datasets' caches in ROOT/cache are not its disk use).
    dirs = [os.path.join(cache_dir, name), workdir]
    disk_start = sum(bench_prepare.du(d) for d in dirs)
    env = dict(
        os.environ,
        REHEARSE_EVENTS=events_path,
        REHEARSE_DIRS=os.pathsep.join(dirs),
        REHEARSE_BENCHMARKS=os.path.dirname(os.path.abspath(__file__)),
    )
    args = [
        *flags,
        f"--config.data.cache_dir={cache_dir}",
        f"--workdir={workdir}",
        *extra,
    ]
    samples: list[tuple[float, int, int]] = []
    start = time.time()
    child = subprocess.Popen([sys.executable, "-c", CHILD, *args], cwd=REPO, env=env)
    done = threading.Event()

    def sample() -> None:
        while True:
            s = _status(child.pid)
            if s is not None:
                samples.append((time.time(), *s))
            if done.wait(interval):
                return

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    _, status, usage = os.wait4(child.pid, 0)
    done.set()
    sampler.join()
    child.returncode = os.waitstatus_to_exitcode(status)
    wall = time.time() - start
    events = []
    if os.path.exists(events_path):
        with open(events_path) as f:
            events = [json.loads(line) for line in f]
    device = [e for e in events if e["phase"] == "device memory"]
    events = [e for e in events if e["phase"] != "device memory"]
    results_path = os.path.join(workdir, "results.json")
    results = json.load(open(results_path)) if os.path.exists(results_path) else {}
    return {
        "exit": child.returncode,
        "wall_s": wall,
        "peak_rss_gib": usage.ru_maxrss / 2**20,
        "compilations": results.get("compilations"),
        "device": device[0] if device else None,
        "start": start,
        **summarise(events, samples, start, disk_start),
    }


def summarise(
    events: list[dict], samples: list[tuple[float, int, int]], start: float, disk_start: int = 0
) -> dict:
    """Per phase (summed over tasks) and per task: wall, peak RSS in the windows, disk added."""
    gib = 2**30

    def peak(t0: float, t1: float) -> float | None:
        inside = [s[1] for s in samples if t0 <= s[0] <= t1]
        return max(inside) / gib if inside else None

    def at(t: float) -> tuple[float, float] | None:
        before = [s for s in samples if s[0] <= t]
        return (before[-1][1] / gib, before[-1][2] / gib) if before else None

    phases: dict[str, dict] = {}
    disk_before = disk_start
    for e in sorted(events, key=lambda e: e["end"]):
        p = phases.setdefault(
            e["phase"],
            {"phase": e["phase"], "wall_s": 0.0, "calls": 0, "peak_rss_gib": None, "disk_gib": 0.0},
        )
        p["wall_s"] += e["end"] - e["start"]
        p["calls"] += 1
        # None where no sample fell inside the phase's calls (shorter than --interval).
        inside = [v for v in (p["peak_rss_gib"], peak(e["start"], e["end"])) if v is not None]
        p["peak_rss_gib"] = max(inside, default=None)
        p["disk_gib"] += max(e["disk"] - disk_before, 0) / gib
        disk_before = e["disk"]
    # `setup` includes the cache build: its own row keeps the rest (model init, trackers).
    if "setup" in phases and "cache build" in phases:
        phases["setup"]["wall_s"] -= phases["cache build"]["wall_s"]
        phases["setup"]["disk_gib"] = max(
            phases["setup"]["disk_gib"] - phases["cache build"]["disk_gib"], 0.0
        )
    tasks = []
    for e in sorted((e for e in events if e["phase"] == "evaluation"), key=lambda e: e["task"]):
        rss = at(e["end"])
        tasks.append(
            {
                "task": e["task"] + 1,
                "time_s": e["end"] - start,
                "rss_gib": rss and rss[0],
                "anon_gib": rss and rss[1],
                "peak_rss_gib": peak(start, e["end"]),
            }
        )
    end_rss = samples[-1][1:] if samples else (0, 0)
    return {
        "phases": list(phases.values()),
        "tasks": tasks,
        "last_rss_gib": end_rss[0] / gib,
        "last_anon_gib": end_rss[1] / gib,
        "samples": len(samples),
        # (seconds since start, RSS GiB, anonymous RSS GiB): what the per-task rows summarise.
        "series": [(round(t - start, 2), r / gib, a / gib) for t, r, a in samples],
    }


def rehearse(name: str, args: argparse.Namespace) -> dict:
    """Every phase of `name`; a dict ready for JSON."""
    sources = [os.path.join(args.archives, a) for a in bench_prepare.ARCHIVES[name]]
    archive = sources[0]
    data_dir = os.path.join(args.root, "prepared")
    reused = args.skip_prepare and os.path.isdir(os.path.join(data_dir, name))
    if reused and not os.path.exists(archive):  # removed after preparing, to free the disk
        rows = [{"phase": "archive check (archive removed)", "wall_s": 0.0, "ok": True}]
    else:
        rows = [check_archive(archive)]
    prepared = os.path.join(data_dir, name)
    if args.skip_prepare and os.path.isdir(prepared):
        rows.append(
            {
                "phase": "preparation (reused)",
                "wall_s": 0.0,
                "disk_gib": bench_prepare.du(prepared) / 2**30,
                "records": bench_prepare._count(prepared),
            }
        )
    else:
        p = bench_prepare.run_prepare(name, sources, data_dir)
        rows.append(
            {
                "phase": "preparation",
                "wall_s": p["wall_s"],
                "peak_rss_gib": p["peak_rss_gib"],
                "disk_gib": p["prepared_gib"],
                "peak_disk_gib": p["peak_disk_gib"],
                "records": p["records"],
                "exit": p["exit"],
            }
        )
        if p["exit"] != 0:
            return {"dataset": name, "phases": rows, "run": None}
    if args.fresh_cache:
        shutil.rmtree(os.path.join(args.root, "cache", name), ignore_errors=True)
    flags = run_flags(name, args.root, args.steps, args.epochs, args.run_config)
    run = run_config(name, args.root, flags, args.extra, args.interval)
    return {"dataset": name, "phases": rows + run.pop("phases"), "run": run}


def _size(gib: float | None) -> str:
    """GiB, or MiB below 0.1 GiB (a checkpoint of the narrow model is a few MiB)."""
    if gib is None:
        return ""
    return f"{gib:.2f} GiB" if gib >= 0.1 or gib == 0 else f"{gib * 1024:.1f} MiB"


def _compiles(c: dict | None) -> str:
    """The run's compilations (results.json): all programs, and the train/eval steps."""
    if not c:
        return "compilations not reported"
    steps = {k: v["count"] for k, v in c["programs"].items() if k.endswith("step)")}
    return f"{c['count']} compilations ({c['seconds']:.1f} s), of which {steps}"


def _device(d: dict | None) -> str:
    """The accelerator's peak memory (its allocator's `peak_bytes_in_use`), if any."""
    return f", {d['device']} peak {d['peak_bytes'] / 2**30:.2f} GiB" if d else ""


def table(result: dict) -> str:
    """Markdown: one row per phase, then RSS per task."""
    f = lambda v, fmt: "" if v is None else format(v, fmt)
    lines = [
        f"{result['dataset']}",
        "| phase | calls | wall | peak RSS | disk added |",
        "|---|---|---|---|---|",
    ]
    for p in result["phases"]:
        lines.append(
            f"| {p['phase']} | {p.get('calls', 1)} | {f(p['wall_s'], '.1f')} s | "
            f"{_size(p.get('peak_rss_gib'))} | {_size(p.get('disk_gib'))} |"
        )
    run = result["run"]
    if run:
        lines += [
            "",
            f"run: exit {run['exit']}, wall {run['wall_s']:.0f} s, peak RSS "
            f"{run['peak_rss_gib']:.2f} GiB{_device(run.get('device'))}, "
            f"{_compiles(run['compilations'])}",
            "",
            "| task | at | RSS | anonymous RSS | peak RSS so far |",
            "|---|---|---|---|---|",
        ]
        for t in run["tasks"]:
            lines.append(
                f"| {t['task']} | {t['time_s']:.0f} s | {f(t['rss_gib'], '.2f')} GiB | "
                f"{f(t['anon_gib'], '.2f')} GiB | {f(t['peak_rss_gib'], '.2f')} GiB |"
            )
    return "\n".join(lines)


def _fail(message: str) -> None:
    print(f"error: {message}", file=sys.stderr)
    sys.exit(2)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("names", nargs="+", help=f"of {sorted(CONFIGS)}")
    parser.add_argument("--archives", required=True)
    parser.add_argument(
        "--root", required=True, help="prepared/, cache/, runs/ and the JSON go here"
    )
    parser.add_argument("--skip_prepare", action="store_true", help="reuse ROOT/prepared/NAME")
    parser.add_argument("--fresh_cache", action="store_true", help="delete ROOT/cache/NAME first")
    parser.add_argument(
        "--steps", type=int, default=2, help="max_steps_per_task (max_steps_per_epoch for CIFAR)"
    )
    parser.add_argument("--epochs", type=int, default=2, help="optim.epochs of the CIFAR runs")
    parser.add_argument("--interval", type=float, default=0.5, help="RSS sampling period (s)")
    parser.add_argument("--run_config", help="run this --config instead of the dataset's")
    parser.add_argument("--tag", default="", help="suffix of ROOT/rehearsal-NAME[-TAG].json")
    args, args.extra = parser.parse_known_args()
    # the runs start in the repository: relative paths are the caller's
    args.root, args.archives = os.path.abspath(args.root), os.path.abspath(args.archives)
    unknown = sorted(set(args.names) - set(CONFIGS))
    if unknown:
        _fail(f"unknown dataset(s) {unknown}: choose from {sorted(CONFIGS)}")
    for name in args.names:
        if args.skip_prepare and os.path.isdir(os.path.join(args.root, "prepared", name)):
            continue  # prepared: the archives are not needed
        files = [os.path.join(args.archives, a) for a in bench_prepare.ARCHIVES[name]]
        if name not in FOLDERS:
            files.append(f"{files[0]}.checksums.tsv")
        for path in files:
            if not os.path.exists(path):
                _fail(
                    f"--archives: {path} not found "
                    "(benchmarks/make_synthetic_archives.py writes both)"
                )
    code = 0
    for name in args.names:
        result = rehearse(name, args)
        tag = f"-{args.tag}" if args.tag else ""
        with open(os.path.join(args.root, f"rehearsal-{name}{tag}.json"), "w") as f:
            json.dump(result, f, indent=1)
        print(table(result), flush=True)
        code = code or int(result["run"] is None or result["run"]["exit"] != 0)
    sys.exit(code)


if __name__ == "__main__":
    main()
