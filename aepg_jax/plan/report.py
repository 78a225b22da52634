"""The plan of a run on each target, printed as tables (one row per program), then the whole
run's projection; `--max_batch` bisects the global batch. Returns the first program that does
not fit as an error line (the caller exits 2 with it)."""

from __future__ import annotations

import copy
import re
from typing import TextIO

import ml_collections

from aepg_jax.config import schema
from aepg_jax.plan import analysis, programs, project, shapes, targets
from aepg_jax.plan.targets import GiB, Target

MFU = 0.4  # the utilisation of the second projected time


def _gib(x: float) -> str:
    return f"{x / GiB:.2f}"


def _hours(seconds: float) -> str:
    return f"{seconds / 3600:.2f} h" if seconds >= 360 else f"{seconds / 60:.1f} min"


def all_programs(run) -> list[programs.Program]:
    return programs.train_programs(run) + programs.eval_and_method_programs(run)


class Misfit(Exception):
    """A program does not fit the target: the message is the user's error line."""


def _advice(cfg) -> str:
    dtype = "" if cfg.model.dtype == "bfloat16" else ", model.dtype=bfloat16"
    return (
        f"lower optim.batch_size (or eval.batch_size){dtype}, or use more devices "
        "(--max_batch finds the largest batch that fits)"
    )


def cost_on(program: programs.Program, target: Target, cfg) -> analysis.Cost:
    """`program`'s cost on `target`; raises `Misfit` when it needs more than the HBM budget."""
    try:
        cost = analysis.compile_cost(program, target)
    except analysis.DoesNotFit as err:
        used = re.search(r"Used ([\d.]+\w?) of ([\d.]+\w?) hbm", str(err))
        need = f"{used.group(1)}B of {used.group(2)}B HBM" if used else "more than the HBM"
        raise Misfit(
            f"{program.name} does not fit on {target.label}: XLA needs {need} per chip "
            f"({target.chip.hbm / GiB:.0f} GiB); {_advice(cfg)}."
        ) from err
    if cost.peak > target.budget:
        raise Misfit(
            f"{program.name} does not fit on {target.label}: it needs {_gib(cost.peak)} GiB "
            f"per device, {_gib(target.budget)} GiB of {_gib(target.chip.hbm)} GiB HBM is "
            f"usable; {_advice(cfg)}."
        )
    return cost


def _header(cfg, run, out: TextIO) -> None:
    counts = project.calls(run)
    print(
        f"run: method {cfg.method.name}, {run.num_tasks} tasks, global batch "
        f"{cfg.optim.batch_size} x {len(run.axis.seeds)} seed(s), {cfg.model.dtype}, "
        f"{cfg.model.image_size} px; calls per run: "
        + ", ".join(f"{n} {c:,}" for n, c in counts.items()),
        file=out,
    )


def plan_target(cfg, run, target: Target, out: TextIO) -> list[analysis.Cost]:
    """Compiles and prints every program of `run` on `target`; raises `Misfit`."""
    schema.validate(shapes.random_init(cfg), target.num_devices)
    chip = target.chip
    print(
        f"\n== {target.label}: {chip.description}, {chip.hbm / GiB:.1f} GiB HBM per chip ==",
        file=out,
    )
    cols = (
        "program",
        "args GiB",
        "temp GiB",
        "peak GiB",
        "of HBM",
        "GFLOP/img",
        "MB/img",
        "compile s",
        "collectives per step",
    )
    print(f"{cols[0]:<34}" + "".join(f"{c:>10}" for c in cols[1:-1]) + f"  {cols[-1]}", file=out)
    counts, costs = project.calls(run), []
    kinds = []
    for program in all_programs(run):
        kinds.append(program.kind)
        cost = cost_on(program, target, cfg)
        costs.append(cost)
        row = (
            _gib(cost.argument),
            _gib(cost.temp),
            _gib(cost.peak),
            f"{100 * cost.peak / chip.hbm:.0f}%",
            f"{cost.flops / cost.images / 1e9:.4g}",
            f"{cost.bytes_accessed / cost.images / 1e6:.4g}",
            f"{cost.seconds:.1f}",
        )
        name = f"{program.name} (x{counts.get(program.name, 0):,})"
        print(
            f"{name:<34}" + "".join(f"{c:>10}" for c in row) + f"  {cost.collectives_text()}",
            file=out,
        )
    p = project.project(run, costs, target)
    print(
        f"whole run: {p.flops / 1e15:.1f} PFLOP, {p.bytes_accessed / 1e12:.1f} TB accessed; "
        f"{_hours(p.at_peak)} at peak, {_hours(p.at_peak / MFU)} at {MFU:.0%} MFU, "
        f"HBM floor {_hours(p.hbm_floor)} ({target.num_devices} x "
        f"{target.peak(cfg.model.dtype) / target.num_devices / 1e12:.0f} TFLOP/s, "
        f"{chip.bandwidth / 1e12:.2f} TB/s)",
        file=out,
    )
    # A run compiles each program once (run-static shapes): its train phases are one program
    # (a `lax.cond`), the largest phase's compile time stands for it.
    train = [c.seconds for c, kind in zip(costs, kinds, strict=True) if kind == "train"]
    rest = [c.seconds for c, kind in zip(costs, kinds, strict=True) if kind != "train"]
    print(
        f"compilation per run: {len(rest) + bool(train)} programs, ~"
        f"{max(train, default=0.0) + sum(rest):.0f} s (each once, whatever the number of tasks)",
        file=out,
    )
    return costs


def with_batch(cfg, batch: int):
    new = copy.deepcopy(cfg)
    new.optim.batch_size = batch
    return new


def max_batch(cfg, sizes, target: Target, out: TextIO) -> int:
    """The largest global batch (a multiple of the device count) whose largest train step fits,
    by doubling then bisection; 0 if none does."""
    unit = target.num_devices
    by_data = set()  # batches refused for exceeding a task's training examples

    def fits(batch: int) -> bool:
        c = with_batch(cfg, batch * unit)
        try:
            run = shapes.shape_run(c, sizes)
            cost_on(programs.train_programs(run)[-1], target, c)
        except Misfit:
            return False
        except ValueError:  # more than a task's examples
            by_data.add(batch)
            return False
        return True

    lo, hi = 0, max(1, cfg.optim.batch_size // unit)
    while fits(hi):
        lo, hi = hi, hi * 2
        if hi * unit > 1 << 16:
            break
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (mid, hi) if fits(mid) else (lo, mid)
    why = " (larger ones exceed a task's training examples)" if lo + 1 in by_data else ""
    print(f"largest global batch that fits on {target.label}: {lo * unit}{why}", file=out)
    return lo * unit


def plan(
    cfg: ml_collections.ConfigDict,
    specs: list[str],
    sizes: tuple[int, int, int] | None,
    find_max_batch: bool,
    out: TextIO,
) -> str | None:
    """Plans `cfg` on every target of `specs`; the first misfit's error line, or None."""
    chosen = [targets.parse(spec) for spec in specs]  # a bad spec fails before any work
    run = shapes.shape_run(cfg, sizes)
    _header(cfg, run, out)
    problem = None
    for target in chosen:
        try:
            plan_target(cfg, run, target, out)
        except Misfit as err:
            print(f"  does not fit: {err}", file=out)
            problem = problem or str(err)
        if find_max_batch:
            max_batch(cfg, sizes, target, out)
        out.flush()
    return problem
