"""Where our ViT train step loses time: a minimal JAX step, our step, and our step minus one piece.

All steps run in one process, alternated round by round on their own fixed batch, after
compiling and one warm-up step each; each figure is the median step time over all rounds, and
every row is reported as a ratio to the **minimal** step measured in the same run.

* `minimal` (`minimal_step.py`): a hand-written Flax ViT of the same sizes (separate q/k/v/out
  `nn.Dense` layers, tanh-approximate GELU, LoRA of our rank on K and V of our PEFT blocks, a
  Dense head), float32 images already on the device (no augmentation), softmax CE, `optax.adam`
  on LoRA + head only, frozen parameters a separate jit argument, trainable parameters and Adam
  state donated.
  `minimal_qv_all`: the same step with LoRA rank 8 on Q and V of every block.
* `ours`: the real `train_step.make_train_step` as the task loop builds it (uint8 256 px batch
  copied to the device each step, on-device RandomResizedCrop + flip + normalise, exact GELU,
  the partitioned optimizer with its gated PEFT label, the metrics), state donated.
* `ours -X`: the same with piece X turned off by patching it inside this script only
  (augment: a slice + normalise instead; exact_gelu: tanh GELU; partitioned_adam: plain Adam;
  grad_norm: 0; donate: no donation; all: augment, exact_gelu, partitioned_adam and grad_norm
  off). `ours +X` adds what a later task has: the head-only `lax.cond` of tasks >= 1, five
  heads, LAE's EMA (on five heads: task 4 of 5).
  `model_only` is our `vit.build` model inside the minimal step's code.
* `timm` (with `--timm`): `bench_step.py`'s eager PyTorch/timm step (augmentation included).

Our step, its switches and the timing are `step_harness.py`'s (as `bench_step.py`'s); the
minimal step is `minimal_step.py`'s, the timm step `torch_step.py`'s.

Per row also the page faults and system CPU seconds per step (`getrusage`) and XLA's temporary
buffer size: XLA:CPU allocates its temporaries afresh each execution, and with glibc's defaults
a large block is a fresh `mmap` whose pages fault in on first touch. The script first applies
`aepg_jax.system.memory.apply_default()` as `aepg_jax.main` does (glibc `mallopt`: no mmap for large
blocks, never trim; it applies to every row, timm's included); `AEPG_MALLOC=default` measures
glibc's defaults instead. `--rss` runs `minimal` and `ours` alone in fresh processes and reports
their peak RSS.

    python benchmarks/bench_breakdown.py                          # ViT-B/16, batch 8, all rows
    python benchmarks/bench_breakdown.py --rows minimal,ours,timm --timm
    python benchmarks/bench_breakdown.py --model vit_tiny --steps 3 --rounds 2   # seconds
    python benchmarks/bench_breakdown.py --rss
"""

from __future__ import annotations

import argparse
import os
import resource
import shlex
import statistics
import subprocess
import sys
import time
from collections.abc import Callable

import minimal_step
import step_harness

ROWS = (
    "minimal",
    "minimal_qv_all",
    "model_only",
    "ours",
    "ours -augment",
    "ours -exact_gelu",
    "ours -partitioned_adam",
    "ours -grad_norm",
    "ours -donate",
    "ours -all",
    "ours +head_only_cond",
    "ours +five_heads",
    "ours +lae_ema",
    "timm",
)

ALL_OFF = {"augment", "exact_gelu", "partitioned_adam", "grad_norm"}


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="vit_b16", choices=("vit_b16", "vit_tiny"))
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--steps", type=int, default=2, help="timed steps per row per round")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--rows", default=",".join(r for r in ROWS if r != "timm"))
    parser.add_argument("--timm", action="store_true", help="add the timm row (needs torch)")
    parser.add_argument("--rss", action="store_true", help="peak RSS of minimal and ours")
    args = parser.parse_args(argv)
    args.rows = [r.strip() for r in args.rows.split(",") if r.strip()]
    if args.timm and "timm" not in args.rows:
        args.rows.append("timm")
    unknown = [r for r in args.rows if r not in ROWS]
    if unknown or not args.rows:
        parser.error(f"--rows: unknown {unknown}; choose from {', '.join(ROWS)}")
    if min(args.batch, args.steps, args.rounds) < 1:
        parser.error("--batch, --steps and --rounds must be >= 1")
    return args


def ours_runner(
    model: str, batch: int, off: set[str], add: set[str]
) -> tuple[Callable[[], None], float]:
    """Our compiled train step (`step_harness.our_step`) with pieces off / added."""
    runner = step_harness.our_step(model, "lora", batch, off=off, add=add)
    run = runner.step
    run.compiled = runner.compiled  # for inspection (HLO, memory analysis)
    return run, minimal_step.temp_mib(runner.compiled)


def model_only_runner(model: str, batch: int) -> tuple[Callable[[], None], float]:
    """Our `vit.build` ViT (LoRA, 20-class head) inside the minimal step's code."""
    import jax
    import jax.numpy as jnp
    import optax

    from aepg_jax.config import schema
    from aepg_jax.models import head, partition, vit

    cfg = schema.base_config(model)
    cfg.model.peft.kind = "lora"
    params = vit.init_params(cfg.model, jax.random.PRNGKey(0))
    peft, frozen = partition.split(params, partition.label_params(params), partition.TRAINABLE)
    trainable = head.grow(peft, jax.random.PRNGKey(1), 20, cfg.model.hidden_size)
    net = vit.build(cfg.model, (20,))
    size = cfg.model.image_size
    images = jax.random.normal(jax.random.PRNGKey(1), (batch, size, size, 3))
    labels = jnp.arange(batch, dtype=jnp.int32) % 20

    def loss(params, x, y):
        logits, _ = net.apply({"params": params}, x)
        return optax.softmax_cross_entropy_with_integer_labels(logits, y).mean()

    grad_fn = partition.value_and_grad_trainable(loss)
    return minimal_step.adam_step_runner(grad_fn, trainable, frozen, images, labels)


def make_runner(row: str, model: str, batch: int) -> tuple[Callable[[], None], float | None]:
    """`(step, XLA temporaries MiB or None)` of one row."""
    if row in ("minimal", "minimal_qv_all"):
        return minimal_step.minimal_runner(model, batch, qv_all_blocks=row == "minimal_qv_all")
    if row == "model_only":
        return model_only_runner(model, batch)
    if row == "timm":
        import torch_step

        torch, timm = torch_step.load_torch_and_timm()
        torch.set_num_threads(os.cpu_count() or 1)
        return torch_step.make_torch_runner(torch, timm, model=model, batch=batch).step, None
    change = set(row.split()[1:2])
    piece = {c[1:] for c in change}
    if "-all" in change:
        return ours_runner(model, batch, ALL_OFF, set())
    return ours_runner(
        model, batch, piece if row.startswith("ours -") else set(), piece if "+" in row else set()
    )


def print_table(batch, samples, medians, temps, build_s) -> None:
    """One line per row: step time, images/s, ratio to `minimal`, faults, system time, temps."""
    base = medians.get("minimal")
    print(
        f"\n{'row':<24} {'step s':>7} {'img/s':>6} {'/ minimal':>9} {'faults':>8} "
        f"{'sys s':>6} {'temp MiB':>8} {'build s':>8}"
    )
    for row, seconds in medians.items():
        faults = statistics.median(s[1] for s in samples[row])
        system = statistics.median(s[2] for s in samples[row])
        ratio = f"{seconds / base:.2f}x" if base else "-"
        temp = f"{temps[row]:.0f}" if temps[row] is not None else "-"
        print(
            f"{row:<24} {seconds:7.3f} {batch / seconds:6.2f} {ratio:>9} "
            f"{faults:8.0f} {system:6.2f} {temp:>8} {build_s[row]:8.1f}"
        )
    print(
        "step s: median over rounds x steps; / minimal: step time over the minimal step's "
        "(lower is faster); faults, sys s: page faults and system CPU seconds per step; "
        "temp MiB: XLA's temporary buffers of one step"
    )


def peak_rss(args: argparse.Namespace) -> None:
    """Peak RSS (ru_maxrss) of a fresh process that builds one row and runs it."""
    for row in ("minimal", "ours"):
        command = [
            sys.executable,
            __file__,
            "--model",
            args.model,
            "--batch",
            str(args.batch),
            "--rows",
            row,
            "--steps",
            "2",
            "--rounds",
            "1",
        ]
        out = subprocess.run(command, capture_output=True, text=True, check=True).stdout
        rss = [line for line in out.splitlines() if line.startswith("peak RSS")]
        print(f"{row:<8} {rss[0] if rss else out}")


def main(argv: list[str] | None = None) -> dict[str, float]:
    args = parse_args(argv)
    if args.rss:
        peak_rss(args)
        return {}
    from aepg_jax.system import memory

    kept_pages = memory.apply_default()  # where aepg_jax.main applies it: before the backend
    import jax

    print(f"command: {shlex.join([sys.executable, *sys.argv])}")
    print(
        f"{args.model}, batch {args.batch}, {os.cpu_count()} CPUs, jax {jax.__version__}, "
        f"XLA_FLAGS={os.environ.get('XLA_FLAGS', '(unset)')}, "
        f"GLIBC_TUNABLES={os.environ.get('GLIBC_TUNABLES', '(unset)')}, "
        f"aepg_jax.system.memory keep_pages_mapped applied: {kept_pages} "
        f"(AEPG_MALLOC={os.environ.get('AEPG_MALLOC', '(unset: auto)')})"
    )
    runners, build_s, temps = {}, {}, {}
    for row in args.rows:
        start = time.perf_counter()
        runners[row], temps[row] = make_runner(row, args.model, args.batch)
        runners[row]()  # warm-up
        build_s[row] = time.perf_counter() - start
        print(f"built {row} ({build_s[row]:.1f} s)", flush=True)
    samples: dict[str, list[tuple[float, int, float]]] = {row: [] for row in runners}
    for r in range(args.rounds):
        for row, run in runners.items():
            samples[row] += step_harness.timed(run, args.steps)
        print(f"round {r + 1}/{args.rounds} done", flush=True)
    medians = {row: statistics.median(s[0] for s in samples[row]) for row in runners}
    print_table(args.batch, samples, medians, temps, build_s)
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(f"peak RSS {peak:.0f} MiB (whole process)")
    return medians


if __name__ == "__main__":
    main()
