"""What each experiment costs on one GPU: GPU-hours and peak memory per run and per experiment,
from the planner (`python -m aepg_jax.plan`, docs/planning.md), compiled without a GPU.

    bash scripts/install.sh aot        # the planner's venv, .venv-aot (docs/planning.md)
    .venv/bin/python benchmarks/paper_costs.py --out=costs.jsonl   # compiles: about an hour
    .venv/bin/python benchmarks/paper_costs.py --out=costs.jsonl --render

Every run of the experiments (`--experiments`, default the paper's tables and figures and the
baselines' papers) is loaded as the sweep would run it. Runs with the same backbone, PEFT,
method, batch sizes and seeds form a group (their task counts, heads and a method's
hyper-parameters, such as a prompt pool's size, may differ); the first run of
each group is compiled for each `--targets` GPU (`plan/report.py`'s `cost_on`, every program of
the run: task 1's step, the last task's head-only and PEFT steps, the evaluation, a method's own
passes). Per run:

  peak memory = the largest peak of its group's first run's programs on that GPU (arguments +
                outputs - aliased + temporaries, per device, XLA's buffer assignment)
  GPU-hours   = sum over the run's programs of calls x images per call x FLOPs per image
                / (the GPU's peak FLOP/s at the run's dtype x 40% MFU) / 3600

with the calls and images per call of the run's own programs (`plan/project.py`: its task
split and step counts) and the FLOPs per image of the program of the same role in its group's
first run (lowered on the host, as the planner counts them). The GPU's peak is the
planner's (`plan/targets.py` CHIPS: H100 SXM 494.5 TFLOP/s TF32, A100 SXM 156 TFLOP/s TF32,
f32 matmuls at XLA's default precision). Host work (decoding images, checkpoints) is not
counted; the first epoch of each dataset also decodes its images into the cache.

The from-scratch runs (trainer `scratch`, Table 4 and Fig. 4) are not planned by
`aepg_jax.plan`; here their train step (`scratch/train_step.py`, the ResNet and SGD of the
config) and evaluation step are compiled the same way: calls = epochs x steps per epoch, and
epochs x test batches.

`--render` prints the markdown tables of docs/paper.md ("What a run costs") from the JSON
lines: per experiment, the runs, GPU-hours (all runs, and the longest run) per GPU, and the
largest peak; then per group its peak per GPU and whether it fits a 24 GB card (jax
preallocates 75% of a GPU's memory, `XLA_PYTHON_CLIENT_MEM_FRACTION`: 16.8 GiB of 24 GB).
"""

from __future__ import annotations

import argparse
import collections
import json
import math
import os
import re
import sys
import time

# Compile-only GPU targets need the planner's venv (`bash scripts/install.sh aot`): without its
# CUDA plugin here, this script re-executes itself with .venv-aot's Python.
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from aepg_jax.plan import aot_env

if __name__ == "__main__" and "--render" not in sys.argv:
    _gpu = any("gpu:" in a for a in sys.argv[1:]) or not any(
        a.startswith("--memory_targets") for a in sys.argv[1:]
    )
    if _gpu and not aot_env.installed(aot_env.MODULES["gpu"]):
        _python = aot_env.aot_python()
        if not _python.is_file():
            sys.exit(f"error: GPU targets need the planner's venv: {aot_env.INSTALL}.")
        os.execv(_python, [str(_python), os.path.abspath(__file__), *sys.argv[1:]])
os.environ.setdefault("JAX_PLATFORMS", "cpu")
if "--xla_gpu_enable_triton_gemm" not in os.environ.get("XLA_FLAGS", ""):
    os.environ["XLA_FLAGS"] = (
        os.environ.get("XLA_FLAGS", "") + " --xla_gpu_enable_triton_gemm=false"
    ).strip()

import jax
import jax.numpy as jnp
import numpy as np

from aepg_jax import losses, schedules
from aepg_jax.config import schema
from aepg_jax.continual.programs import plan_task
from aepg_jax.data import datasets, loader
from aepg_jax.experiments import layout, registry
from aepg_jax.models import resnet
from aepg_jax.plan import programs, report, shapes, targets
from aepg_jax.plan.targets import GiB
from aepg_jax.scratch import config as scratch_config
from aepg_jax.scratch import train_step as ts
from aepg_jax.scratch import trainer as scratch_trainer
from aepg_jax.sweep import preflight

MFU = report.MFU
CARD_24GB = 0.75 * 24e9  # bytes jax preallocates on a 24 GB card
DEFAULT_EXPERIMENTS = (
    "table1,table2,table3,table4,table6,table8,fig1,fig2,fig3a,fig3b,fig4,fig5,fig6,"
    "backbones,coda_prompt,inflora,pilot"
)
# Fields that leave a run's programs as they are (what it reads, where it writes, its seed).
_NOT_SHAPE = {"init", "checkpoint", "hub", "weights", "seed"}


def _config(unit: layout.Unit):
    return preflight.load_config(unit.config_arg, unit.overrides(()))


def group_key(cfg) -> str:
    """Runs with equal keys compile programs of nearly the same memory: the same backbone,
    PEFT, method, batch sizes and seeds (their heads, task counts and method hyper-parameters
    such as a prompt pool's size may differ)."""
    model = {k: v for k, v in cfg.model.to_dict().items() if k not in _NOT_SHAPE}
    if cfg.trainer != "continual":
        return json.dumps(["scratch", model, cfg.optim.batch_size, cfg.num_seeds], default=str)
    return json.dumps(
        [model, cfg.method.name, cfg.optim.batch_size, cfg.eval.batch_size, cfg.num_seeds],
        sort_keys=True,
        default=str,
    )


def role(name: str) -> str:
    """A program's role in any run: `train task 1`, `train task N head-only`, `train task N`,
    `eval after task N`, or a method program's own name (numbers replaced)."""
    return name if name == "train task 1" else re.sub(r"\d+", "N", name)


def describe(cfg) -> str:
    m = cfg.model
    if cfg.trainer != "continual":
        return f"scratch ResNet (blocks {list(m.stage_sizes)}), batch {cfg.optim.batch_size}"
    peft = m.peft.kind if m.peft.kind != "none" else "no PEFT"
    return (
        f"{cfg.method.name}, {peft}, batch {cfg.optim.batch_size}, {m.image_size} px, {m.dtype}, "
        f"{m.get('family', 'vit')} width {m.hidden_size} patch {m.patch_size}"
    )


# -- the continual trainer: the planner's own programs -------------------------------------------


def continual_programs(cfg):
    run = shapes.shape_run(cfg)
    return run, report.all_programs(run)


def continual_work(cfg, per_image: dict[str, float], passes: dict[str, int]) -> float:
    """The run's FLOPs: calls x images per call of each program role x its group's FLOPs per
    image of that role. The calls are `plan/project.py`'s, counted from the run's task split
    (`shapes.run_data`, no arrays built); `passes`: the group's method programs' passes over
    each task's training data."""
    tasks = shapes.run_data(cfg).tasks.tasks
    plans = [plan_task(cfg, task) for task in tasks]
    seeds, e = cfg.num_seeds, cfg.eval.batch_size
    b = cfg.optim.batch_size * seeds
    work = {"train task 1": plans[0].total_steps * b}
    if len(tasks) > 1:
        work["train task N head-only"] = sum(p.freeze_steps for p in plans[1:]) * b
        work["train task N"] = sum(p.total_steps - p.freeze_steps for p in plans[1:]) * b
    per_task = [loader.num_batches(len(t.test_indices), e, False) for t in tasks]
    evals = sum(sum(per_task[: t + 1]) for t in range(len(tasks)))
    work["eval after task N"] = evals * e * seeds
    train_batches = sum(loader.num_batches(len(t.train_indices), e, False) for t in tasks)
    for name, n in passes.items():
        work[role(name)] = n * seeds * train_batches * e
    return sum(images * per_image[r] for r, images in work.items() if images)


# -- the from-scratch trainer --------------------------------------------------------------------


def scratch_programs(cfg) -> tuple[dict[str, int], list[programs.Program]]:
    """The scratch trainer's train and eval steps as planner programs, and their calls."""
    train, test, classes = shapes.SIZES[datasets.size_key(cfg.data)]
    o = cfg.optim
    steps = scratch_trainer.steps_per_epoch(train, cfg)
    tx, lr = ts.make_optimizer(
        o.learning_rate,
        o.momentum,
        o.nesterov,
        o.weight_decay,
        tuple(o.milestones),
        o.lr_decay,
        steps,
    )
    model = resnet.build(scratch_config.resnet_spec(cfg), classes)
    size = cfg.data.image_size
    mean, std = (0.5,) * 3, (0.25,) * 3
    step = ts.make_train_step(
        model.apply,
        losses.get_loss(cfg.loss.name, **schema.loss_kwargs(cfg)),
        losses.is_annealed(cfg.loss.name),
        schedules.get_schedule(cfg.schedule.name, o.epochs * steps, **schema.schedule_kwargs(cfg)),
        tx,
        lr,
        ts.AugmentConfig(cfg.data.pad, cfg.data.flip_prob, mean, std),
    )

    def init():
        keys = jax.random.PRNGKey(0)[None]
        variables = resnet.init_seeds(model, keys, size)
        variables = jax.tree.map(lambda x: x[0], variables)
        return ts.TrainState(
            variables["params"],
            variables["batch_stats"],
            tx.init(variables["params"]),
            jnp.zeros([], jnp.int32),
            jax.random.PRNGKey(1),
        )

    state = jax.eval_shape(init)
    b = o.batch_size
    batch = {
        "image": jax.ShapeDtypeStruct((b, size, size, 3), jnp.uint8),
        "label": jax.ShapeDtypeStruct((b,), jnp.int32),
    }
    evaluate = ts.make_eval_step(model.apply, mean, std)
    e = cfg.eval.batch_size
    eval_batch = {
        "image": jax.ShapeDtypeStruct((e, size, size, 3), jnp.uint8),
        "label": jax.ShapeDtypeStruct((e,), jnp.int32),
        "mask": jax.ShapeDtypeStruct((e,), jnp.bool_),
    }
    rep, bat = programs.REPLICATED, programs.BATCH
    progs = [
        programs.Program("train step", "train", step, (state, batch), (rep, bat), (0,), b),
        programs.Program(
            "eval step",
            "eval",
            evaluate,
            (state.params, state.batch_stats, eval_batch),
            (rep, rep, bat),
            (),
            e,
        ),
    ]
    calls = {"train step": o.epochs * steps, "eval step": o.epochs * math.ceil(test / e)}
    return calls, progs


# -- measuring and rendering ---------------------------------------------------------------------


def _hours(flops: float, chip: str, dtype: str) -> float:
    c = targets.CHIPS[chip]
    return flops / ((c.peak_bf16 if dtype == "bfloat16" else c.peak_f32) * MFU) / 3600


def _first_program(cfg) -> programs.Program:
    if cfg.trainer != "continual":
        return scratch_programs(cfg)[1][0]
    return continual_programs(cfg)[1][0]


def measure(
    names: list[str],
    chips: list[str],
    memory_specs: list[str],
    out,
    only: set[int] | None = None,
    flops: bool = True,
) -> None:
    """Pass 1: every run's FLOPs and GPU-hours (programs lowered on the host, no compile), one
    `run` row each; pass 2: each group's task-1 train step compiled for each memory target, one
    `peak` row per group (largest groups first, so that an interrupted pass 2 leaves the
    most-used figures)."""
    exps = registry.registry()
    members: dict[str, list[tuple[str, str, object]]] = collections.defaultdict(list)
    for name in names:
        for unit in layout.units(exps[name].runs(), False):
            cfg = _config(unit)
            members[group_key(cfg)].append((name, unit.name, cfg))
    groups = sorted(members.values(), key=len, reverse=True)
    print(f"{sum(map(len, groups))} runs in {len(groups)} groups", flush=True)
    first_programs = []
    for g, runs in enumerate(groups):
        cfg = runs[0][2]
        if only is not None and g not in only:
            first_programs.append(None)
            continue
        if not flops:
            first_programs.append((cfg, _first_program(cfg)))
            continue
        scratch = cfg.trainer != "continual"
        if scratch:
            calls, progs = scratch_programs(cfg)
            per_image = {p.name: p.host_flops / p.images for p in progs}
        else:
            run, progs = continual_programs(cfg)
            per_image = {role(p.name): p.host_flops / p.images for p in progs}
            passes = programs.method_passes(run)
        first_programs.append((cfg, progs[0]))
        done: dict[str, float] = {}
        for experiment, run_name, run_cfg in runs:
            if scratch:
                flops = sum(calls[p.name] * p.images * per_image[p.name] for p in progs)
            else:
                work_key = json.dumps(
                    [
                        run_cfg.data.to_dict(),
                        run_cfg.optim.to_dict(),
                        run_cfg.method.to_dict(),
                        run_cfg.max_steps_per_task,
                    ],
                    sort_keys=True,
                    default=str,
                )
                if work_key not in done:
                    done[work_key] = continual_work(run_cfg, per_image, passes)
                flops = done[work_key]
            dtype = run_cfg.model.get("dtype", "float32")
            row = {
                "kind": "run",
                "experiment": experiment,
                "run": run_name,
                "group": g,
                "pflop": flops / 1e15,
                "hours": {chip: _hours(flops, chip, dtype) for chip in chips},
                "date": time.strftime("%Y-%m-%d"),
            }
            out.write(json.dumps(row) + "\n")
        out.flush()
        print(f"group {g}: {describe(cfg)}, {len(runs)} runs: FLOPs done", flush=True)
    chosen = [targets.parse(s) for s in memory_specs]
    for g, found in enumerate(first_programs):
        if found is None:
            continue
        cfg, program = found
        peaks: dict[str, float | None] = {}
        for target in chosen:
            try:
                cost = report.cost_on(program, target, shapes.random_init(cfg))
                peaks[target.label.split(" (")[0]] = cost.peak / GiB
            except report.Misfit as err:
                print(f"  {err}", flush=True)
                peaks[target.label.split(" (")[0]] = None
        row = {"kind": "peak", "group": g, "describe": describe(cfg), "peak_gib": peaks}
        out.write(json.dumps(row | {"date": time.strftime("%Y-%m-%d")}) + "\n")
        out.flush()
        print(f"group {g}: {describe(cfg)}: peak {peaks}", flush=True)


def _fmt_h(hours: float) -> str:
    return f"{hours:,.0f}" if hours >= 10 else f"{hours:.1f}" if hours >= 0.1 else f"{hours:.2f}"


def render(path: str) -> str:
    lines_in = [json.loads(line) for line in open(path) if line.strip()]
    rows = [r for r in lines_in if r["kind"] == "run"]
    peaks = {r["group"]: r for r in lines_in if r["kind"] == "peak"}
    chips = list(rows[0]["hours"])
    mem = sorted({k for r in peaks.values() for k in r["peak_gib"]})
    name = {c: targets.CHIPS[c].description.split(" ")[0] for c in chips}

    def peak(r) -> float | None:
        found = peaks.get(r["group"])
        values = [v for v in (found or {}).get("peak_gib", {}).values() if v is not None]
        return max(values) if values else None

    lines = [
        "| experiment | runs | "
        + " | ".join(f"GPU-h, {name[c]} (longest run)" for c in chips)
        + " | peak GiB | runs over 24 GB |",
        "|---|---:|" + "---:|" * len(chips) + "---:|---:|",
    ]
    by_exp: dict[str, list[dict]] = collections.defaultdict(list)
    for r in rows:
        by_exp[r["experiment"]].append(r)
    exps = registry.registry()
    for exp, rs in by_exp.items():
        expected = len(layout.units(exps[exp].runs(), False)) if exp in exps else len(rs)
        count = f"{len(rs)}" if len(rs) == expected else f"{len(rs)} of {expected}"
        hours = []
        for c in chips:
            each = [r["hours"][c] for r in rs]
            hours.append(f"{_fmt_h(sum(each))} ({_fmt_h(max(each))})")
        known = [p for p in map(peak, rs) if p is not None]
        top = f"{max(known):.1f}" if known else "?"
        over = sum(p * GiB > CARD_24GB for p in known)
        unknown = f" (+{len(rs) - len(known)} ?)" if len(known) < len(rs) else ""
        lines.append(
            f"| `{exp}` | {count} | " + " | ".join(hours) + f" | {top} | {over}{unknown} |"
        )
    seen: dict[str, dict] = {}
    for r in rows:
        seen.setdefault(r["run"], r)
    total = [_fmt_h(sum(r["hours"][c] for r in seen.values())) for c in chips]
    lines.append(f"| all, each run once | {len(seen)} | " + " | ".join(total) + " | | |")
    lines += [
        "",
        "| runs of | runs | " + " | ".join(f"peak GiB, {m}" for m in mem) + " | a 24 GB card |",
        "|---|---:|" + "---:|" * len(mem) + "---|",
    ]
    counts = collections.Counter(r["group"] for r in seen.values())
    for g, r in sorted(peaks.items()):
        values = [r["peak_gib"].get(m) for m in mem]
        fits = all(v is not None and v * GiB <= CARD_24GB for v in values)
        cells = " | ".join("does not fit" if v is None else f"{v:.2f}" for v in values)
        verdict = "fits" if fits else "does not fit"
        lines.append(f"| {r['describe']} | {counts[g]} | {cells} | {verdict} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--experiments", default=DEFAULT_EXPERIMENTS)
    p.add_argument("--chips", default="h100,a100", help="GPU-hours at these chips' peaks")
    p.add_argument(
        "--memory_targets", default="gpu:h100", help="compile task 1's step for these targets"
    )
    p.add_argument("--out", required=True, help="JSON lines, one per run (appended)")
    p.add_argument("--render", action="store_true", help="print the tables of --out; exit")
    p.add_argument("--groups", help="only these groups (numbers as printed), e.g. 0,1,2")
    p.add_argument("--memory_only", action="store_true", help="no FLOPs pass (no run rows)")
    args = p.parse_args(argv)
    if args.render:
        print(render(args.out))
        return 0
    with open(args.out, "a") as out:
        measure(
            args.experiments.split(","),
            args.chips.split(","),
            args.memory_targets.split(","),
            out,
            None if args.groups is None else {int(g) for g in args.groups.split(",")},
            not args.memory_only,
        )
    if not args.memory_only:  # peaks alone render with the run rows of a FLOPs pass
        print(render(args.out))
    return 0


if __name__ == "__main__":
    np.set_printoptions(precision=3)
    sys.exit(main())
