"""The BENCHMARKS.md table "Accelerators, compiled without one": the continual run of a paper
config (default `configs/imagenet_r.py`, 10 tasks) per method and compute dtype, compiled for
TPU slices and GPUs on this CPU host (`aepg_jax.plan`), next to the minimal step of
`benchmarks/minimal_step.py` (same ViT, LoRA on K/V of blocks 0-4, Adam) on the same targets.

Per (method, dtype, target): task 1's train step compiled for the target (memory per device,
FLOPs and bytes per image, collectives, compile seconds) and the whole run's projection from the
host FLOP count of every program of the run (`plan.project.calls` x FLOPs per call; at peak and
at 40% MFU). Rows are appended to `--out` (JSON lines) as they finish, so an interrupted bench
keeps what it measured; `--render` prints the markdown table and the ours / minimal ratios.

    nice -n 10 python benchmarks/bench_plan.py --methods=lae --dtypes=float32,bfloat16 \
        --targets=tpu:v5e-16,tpu:v5p-8,tpu:v6e-4,gpu:h100,gpu:h100x8 --out=plan.jsonl
    python benchmarks/bench_plan.py --render --out=plan.jsonl
"""

from __future__ import annotations

import os

os.environ.setdefault("JAX_PLATFORMS", "cpu")
if "--xla_gpu_enable_triton_gemm" not in os.environ.get("XLA_FLAGS", ""):
    os.environ["XLA_FLAGS"] = (
        os.environ.get("XLA_FLAGS", "") + " --xla_gpu_enable_triton_gemm=false"
    ).strip()

import argparse
import json
import pathlib
import sys
import time

import jax

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))

import minimal_step

from aepg_jax.config import schema
from aepg_jax.plan import programs, project, report, shapes, targets

GiB = targets.GiB


def _row(kind, method, dtype, target, cost, projection=None) -> dict:
    row = {
        "kind": kind,
        "method": method,
        "dtype": dtype,
        "target": target.label.split(" (")[0],
        "devices": target.num_devices,
        "hbm_gib": round(target.chip.hbm / GiB, 1),
        "args_gib": round(cost.argument / GiB, 2),
        "temp_gib": round(cost.temp / GiB, 2),
        "peak_gib": round(cost.peak / GiB, 2),
        "gflop_per_image": round(cost.flops / cost.images / 1e9, 2),
        "mb_per_image": round(cost.bytes_accessed / cost.images / 1e6, 1),
        "collectives": cost.collectives_text(),
        "compile_s": round(cost.seconds, 1),
        "date": time.strftime("%Y-%m-%d"),
    }
    if projection is not None:
        row |= projection
    return row


def ours(cfg_path: str, tasks: int, method: str, dtype: str, specs: list[str], out) -> None:
    cfg = schema.from_file(cfg_path, f"tasks={tasks},method={method}")
    cfg.model.init = "random"
    cfg.model.dtype = dtype
    run = shapes.shape_run(cfg)
    progs = report.all_programs(run)
    counts = project.calls(run)
    run_flops = sum(counts.get(p.name, 0) * p.host_flops for p in progs)
    for spec in specs:
        target = targets.parse(spec)
        schema.validate(cfg, target.num_devices)
        try:
            cost = report.cost_on(progs[0], target, cfg)
        except report.Misfit as err:
            print(f"{method} {dtype} {spec}: {err}", flush=True)
            continue
        peak = target.peak(dtype)
        projection = {
            "run_pflop": round(run_flops / 1e15, 1),
            "tflops_peak": round(peak / 1e12),
            "min_at_peak": round(run_flops / peak / 60, 2),
            "min_at_40": round(run_flops / peak / 0.4 / 60, 2),
        }
        row = _row("ours", method, dtype, target, cost, projection)
        out.write(json.dumps(row) + "\n")
        out.flush()
        print(row, flush=True)


def minimal(model: str, batch: int, dtype: str, specs: list[str], out) -> None:
    step, args, donate = minimal_step.minimal_program(model, batch, dtype)
    layouts = (programs.REPLICATED,) * 3 + (programs.BATCH,) * 2
    program = programs.Program("minimal step", "train", step, args, layouts, donate, batch)
    cfg = schema.base_config(model)
    cfg.model.dtype = dtype
    for spec in specs:
        target = targets.parse(spec)
        try:
            cost = report.cost_on(program, target, cfg)
        except report.Misfit as err:
            print(f"minimal {dtype} {spec}: {err}", flush=True)
            continue
        row = _row("minimal", "-", dtype, target, cost)
        out.write(json.dumps(row) + "\n")
        out.flush()
        print(row, flush=True)


def host_flops(cfg_path: str, tasks: int, methods: list[str], dtype: str, batch: int, out):
    """FLOPs per image of task 1's step, ours per method and the minimal step's, from the
    programs lowered for the host (no compile: the global count every target shares)."""
    step, args, donate = minimal_step.minimal_program("vit_b16", batch, dtype)
    layouts = (programs.REPLICATED,) * 3 + (programs.BATCH,) * 2
    minimal_prog = programs.Program("minimal step", "train", step, args, layouts, donate, batch)
    base = minimal_prog.host_flops / batch
    for method in methods:
        cfg = schema.from_file(cfg_path, f"tasks={tasks},method={method}")
        cfg.model.init, cfg.model.dtype = "random", dtype
        program = report.all_programs(shapes.shape_run(cfg))[0]
        ours_flops = program.host_flops / program.images
        row = {
            "kind": "host_flops",
            "method": method,
            "dtype": dtype,
            "batch": program.images,
            "gflop_per_image": round(ours_flops / 1e9, 3),
            "minimal_gflop_per_image": round(base / 1e9, 3),
            "ratio": round(ours_flops / base, 4),
            "date": time.strftime("%Y-%m-%d"),
        }
        out.write(json.dumps(row) + "\n")
        out.flush()
        print(row, flush=True)


def render(path: str) -> None:
    rows = [json.loads(line) for line in pathlib.Path(path).read_text().splitlines() if line]
    host = [r for r in rows if r["kind"] == "host_flops"]
    rows = [r for r in rows if r["kind"] != "host_flops"]
    print(
        "| method | dtype | target | args / temp / peak GiB per device (HBM) | GFLOP/img | "
        "MB/img | collectives per step | run PFLOP | run min at peak / 40% MFU | compile s |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        proj = "- | -"
        if r["kind"] == "ours":
            chip = next(c for n, c in targets.CHIPS.items() if n in r["target"].lower())
            peak = r["devices"] * (chip.peak_bf16 if r["dtype"] == "bfloat16" else chip.peak_f32)
            minutes = r["run_pflop"] * 1e15 / peak / 60
            proj = f"{r['run_pflop']} | {minutes:.1f} / {minutes / 0.4:.1f}"
        name = r["method"] if r["kind"] == "ours" else "minimal step"
        print(
            f"| {name} | {r['dtype']} | {r['target']} | {r['args_gib']} / {r['temp_gib']} / "
            f"{r['peak_gib']} ({r['hbm_gib']}) | {r['gflop_per_image']} | {r['mb_per_image']} | "
            f"{r['collectives']} | {proj} | {r['compile_s']} |"
        )
    mins = {(r["dtype"], r["target"]): r for r in rows if r["kind"] == "minimal"}
    if host:
        print("\n| method | dtype | batch | GFLOP/img ours | minimal | ours / minimal |")
        print("|---|---|---|---|---|---|")
        for r in host:
            print(
                f"| {r['method']} | {r['dtype']} | {r['batch']} | {r['gflop_per_image']} | "
                f"{r['minimal_gflop_per_image']} | {r['ratio']:.3f} |"
            )
    print("\n| method | dtype | target | FLOPs ours / minimal | bytes ours / minimal |")
    print("|---|---|---|---|---|")
    for r in rows:
        m = mins.get((r["dtype"], r["target"]))
        if r["kind"] == "ours" and m:
            print(
                f"| {r['method']} | {r['dtype']} | {r['target']} | "
                f"{r['gflop_per_image'] / m['gflop_per_image']:.3f} | "
                f"{r['mb_per_image'] / m['mb_per_image']:.3f} |"
            )


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--config", default="configs/imagenet_r.py")
    p.add_argument("--tasks", type=int, default=10)
    p.add_argument("--methods", default="lae,coda_prompt,inflora,l2p")
    p.add_argument("--dtypes", default="float32,bfloat16")
    p.add_argument("--targets", default="tpu:v5e-16,tpu:v5p-8,tpu:v6e-4,gpu:h100,gpu:h100x8")
    p.add_argument("--minimal", action="store_true", help="the minimal step only")
    p.add_argument("--model", default="vit_b16")
    p.add_argument("--batch", type=int, default=256, help="the minimal step's global batch")
    p.add_argument("--out", default="plan.jsonl")
    p.add_argument("--render", action="store_true")
    p.add_argument("--host_flops", action="store_true", help="FLOP ratios only, no compile")
    a = p.parse_args()
    if a.render:
        render(a.out)
        return
    specs = a.targets.split(",")
    with open(a.out, "a") as out:
        for dtype in a.dtypes.split(","):
            if a.host_flops:
                host_flops(a.config, a.tasks, a.methods.split(","), dtype, a.batch, out)
                continue
            if a.minimal:
                minimal(a.model, a.batch, dtype, specs, out)
                continue
            for method in a.methods.split(","):
                ours(a.config, a.tasks, method, dtype, specs, out)
    jax.clear_caches()


if __name__ == "__main__":
    main()
