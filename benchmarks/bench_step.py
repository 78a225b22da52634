"""Times our jitted ViT PEFT train step against an eager PyTorch/timm reference step on the CPU.

For each PEFT kind (LoRA, adapter, prefix; docs/algorithm.md §5, blocks 0-4) both sides run one
complete training step on the same uint8 batch (B, S, S, 3) with S = 256 for 224 px input:

* JAX: the real step of `aepg_jax.continual.steps.make_train_step`, jitted with the state
  donated, built as the task loop builds it (`steps.optimizer`, `setup.step_config` from
  `schema.base_config`): device-side RandomResizedCrop(224, scale (.05, 1)) + flip +
  normalisation, ViT forward, the task head, the loss (CE by default), gradients of the PEFT and
  head leaves only, Adam (optax, frozen backbone `set_to_zero`), plus the step's metrics
  (entropy, gradient norm). The host->device copy of the batch is inside the timed step.
* torch: timm `vit_base_patch16_224(pretrained=False)` (`--model vit_tiny`: a timm
  `VisionTransformer` of the tiny preset's sizes) with the same PEFT modules on blocks 0-4,
  backbone `requires_grad=False`, a Linear head, the same loss, `torch.optim.Adam` over the
  trainable parameters only, eager. Its augmentation runs in the timed step too, with torch ops
  on the uint8 batch: per image a torchvision-style RandomResizedCrop box (same scale/ratio
  rules), crop, `F.interpolate(bilinear, antialias=True)` to 224 (what torchvision does on
  tensors), flip p=.5, normalisation to [-1, 1].

`--torch-style timm` (default, the strongest eager baseline) keeps timm's fused
`scaled_dot_product_attention` wherever the math allows (not in prefix blocks, whose
compensation needs the softmax weights) and adds LoRA as a low-rank branch
`s (x A^T) B^T` like our model; `--torch-style lae` runs the LAE codebase's formulation
instead: explicit softmax attention in every block and LoRA merged into the fused qkv weight
(`F.linear(x, W_qkv + [0; s_k B_k A_k; s_v B_v A_v])`, LAE's `KVLoRA`).

The two sides alternate in one process: per PEFT kind, after building, compiling and
`--warmup` steps each, `--rounds` times N = `--steps` JAX steps then N torch steps, each step
timed alone; the reported figure is `batch / median step time` over all rounds. torch uses
`torch.set_num_threads(os.cpu_count())`; XLA's CPU client uses one device whose intra-op
thread pool spans all cores by default (XLA_FLAGS is printed when set). The model computes in
`--dtype float32` (default) or `bfloat16`: the JAX model computes in that dtype
(`model.dtype`: parameters, loss, head and logits stay float32); the torch step then runs its
forward pass and loss under `torch.autocast("cpu", dtype=torch.bfloat16)`.

    python benchmarks/bench_step.py --batch 8 --steps 5 --rounds 3 --peft lora,adapter,prefix \
        --image-size 224 --model vit_b16
    python benchmarks/bench_step.py --model vit_tiny            # quick check (seconds)
    python benchmarks/bench_step.py --model vit_tiny --jax-only # no torch needed

Memory: XLA's CPU runtime allocates its temporaries (about 1.4 GiB for a ViT-B/16 batch-8 step)
afresh every step; with glibc's defaults that costs ~0.4M page faults, ~1 CPU-s per step here.
The script applies `aepg_jax.system.memory.apply_default()` first, as `aepg_jax.main` does (freed
pages stay mapped; it applies to both sides); `AEPG_MALLOC=default` measures glibc's defaults.
The allocator state is printed with the results. Other processes' CPU use while timing is measured
and reported (a warning above 5%): on a shared 2-core machine it distorts the figures, torch's
most (its OpenMP threads stall when a core is taken).

torch and timm are optional (not project dependencies); without them the script prints the
install commands and exits with status 2 (`--jax-only` needs neither). The steps and timing are
`step_harness.py`'s (ours) and `torch_step.py`'s (the reference).
"""

from __future__ import annotations

import argparse
import dataclasses
import gc
import os
import shlex
import statistics
import sys
from collections.abc import Sequence
from typing import Any

import _timm_import
from step_harness import (
    LOSSES,
    MODELS,
    PEFT_KINDS,
    ForeignLoad,
    machine_lines,
    make_batch,  # noqa: F401  (part of this script's API)
    our_step,
    run_config,  # noqa: F401
    time_steps,
)
from torch_step import TORCH_STYLES, load_torch_and_timm, make_torch_runner

from aepg_jax.system import memory

FOREIGN_LOAD_WARN = 0.05


def bench_jax(
    kind: str = "lora",
    model: str = "vit_tiny",
    batch: int = 8,
    steps: int = 3,
    rounds: int = 1,
    warmup: int = 1,
    image_size: int | None = None,
    num_classes: int = 20,
    loss: str = "ce",
) -> float:
    """Images per second of our train step alone: `batch / median step time` after warm-up."""
    runner = our_step(model, kind, batch, image_size, num_classes, loss)
    time_steps(runner, warmup)
    times = [t for _ in range(rounds) for t in time_steps(runner, steps)]
    return batch / statistics.median(times)


@dataclasses.dataclass
class Result:
    """Step times of one PEFT kind (seconds; per round, all rounds)."""

    kind: str
    batch: int
    jax_times: list[list[float]]
    torch_times: list[list[float]]
    jax_setup_s: float
    torch_setup_s: float
    foreign_load: float | None = None  # other processes' share of the CPU while timing

    @staticmethod
    def _ips(batch: int, rounds: list[list[float]]) -> float:
        return batch / statistics.median([t for r in rounds for t in r])

    @property
    def jax_ips(self) -> float:
        return self._ips(self.batch, self.jax_times)

    @property
    def torch_ips(self) -> float | None:
        return self._ips(self.batch, self.torch_times) if self.torch_times else None


def _machine_lines(torch: Any, timm: Any, args: argparse.Namespace) -> list[str]:
    lines = machine_lines(args.kept_pages)
    if torch is not None:
        stubbed = ", ".join(_timm_import.stubbed_packages()) or "none"
        lines.append(
            f"torch {torch.__version__} (threads {torch.get_num_threads()}, interop "
            f"{torch.get_num_interop_threads()}), timm {timm.__version__} "
            f"(stubbed: {stubbed}); torch style: {args.torch_style}"
        )
    lines.append(
        f"compute dtype {args.dtype} (torch: autocast when bfloat16); loss "
        f"{args.loss}; {args.num_classes}-class head; steps={args.steps} x rounds={args.rounds}, "
        f"warmup={args.warmup}"
    )
    return lines


def _ms(seconds: float) -> str:
    ms = 1e3 * seconds
    return f"{ms:.0f}" if ms >= 100 else f"{ms:.1f}"


def _table(results: Sequence[Result], model: str) -> list[str]:
    header = (
        f"{'model':<9} {'peft':<8} {'batch':>5} {'JAX img/s':>10} {'torch img/s':>12} "
        f"{'JAX/torch':>10} {'JAX ms (round medians)':>28} {'torch ms (round medians)':>28} "
        f"{'JAX setup s':>12} {'torch setup s':>14} {'other load':>10}"
    )
    lines = [header, "-" * len(header)]
    for r in results:
        per_round = lambda rounds: "/".join(_ms(statistics.median(x)) for x in rounds)
        torch_ips = r.torch_ips
        lines.append(
            f"{model:<9} {r.kind:<8} {r.batch:>5} {r.jax_ips:>10.2f} "
            f"{(f'{torch_ips:.2f}' if torch_ips else '-'):>12} "
            f"{(f'{r.jax_ips / torch_ips:.2f}x' if torch_ips else '-'):>10} "
            f"{per_round(r.jax_times):>28} {(per_round(r.torch_times) or '-'):>28} "
            f"{r.jax_setup_s:>12.1f} {(f'{r.torch_setup_s:.1f}' if torch_ips else '-'):>14} "
            f"{(f'{100 * r.foreign_load:.0f}%' if r.foreign_load is not None else '?'):>10}"
        )
    return lines


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--steps", type=int, default=5, help="timed steps per side per round")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--warmup", type=int, default=1, help="untimed steps per side first")
    parser.add_argument("--peft", default=",".join(PEFT_KINDS), help="comma-separated kinds")
    parser.add_argument("--image-size", type=int, default=None, help="default: the preset's")
    parser.add_argument("--model", choices=MODELS, default="vit_b16")
    parser.add_argument("--num-classes", type=int, default=20)
    parser.add_argument("--loss", choices=LOSSES, default="ce", help="the same on both sides")
    parser.add_argument("--torch-style", choices=TORCH_STYLES, default="timm")
    parser.add_argument("--jax-only", action="store_true", help="skip the torch side")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--dtype", choices=("float32", "bfloat16"), default="float32")
    args = parser.parse_args(argv)
    kinds = [k.strip() for k in args.peft.split(",") if k.strip()]
    bad = [k for k in kinds if k not in PEFT_KINDS]
    if bad or not kinds:
        parser.error(f"--peft {args.peft!r}: choose from {', '.join(PEFT_KINDS)}")
    for name in ("batch", "steps", "rounds", "num_classes"):
        if getattr(args, name) < 1:
            parser.error(f"--{name.replace('_', '-')} must be >= 1")
    if args.warmup < 0:
        parser.error("--warmup must be >= 0")
    args.kinds = kinds
    return args


def main(argv: Sequence[str] | None = None) -> list[Result]:
    args = parse_args(argv)
    # What `aepg_jax.main` does before JAX's backend starts (AEPG_MALLOC; both sides share it).
    args.kept_pages = memory.apply_default()
    torch = timm = None
    if not args.jax_only:
        torch, timm = load_torch_and_timm()
        torch.set_num_threads(os.cpu_count() or 1)
    command = shlex.join([sys.executable, sys.argv[0], *(sys.argv[1:] if argv is None else argv)])
    print(f"command: {command}")
    for line in _machine_lines(torch, timm, args):
        print(line)
    common = dict(
        model=args.model,
        batch=args.batch,
        image_size=args.image_size,
        num_classes=args.num_classes,
        loss=args.loss,
        seed=args.seed,
        dtype=args.dtype,
    )
    results = []
    for kind in args.kinds:
        jax_runner = our_step(kind=kind, **common)
        torch_runner = None
        if torch is not None:
            torch_runner = make_torch_runner(
                torch, timm, kind=kind, style=args.torch_style, **common
            )
        runners = [r for r in (jax_runner, torch_runner) if r is not None]
        for runner in runners:
            time_steps(runner, args.warmup)
        times: dict[str, list[list[float]]] = {r.name: [] for r in runners}
        load = ForeignLoad()
        for _ in range(args.rounds):
            for runner in runners:
                times[runner.name].append(time_steps(runner, args.steps))
        result = Result(
            kind,
            args.batch,
            times["jax"],
            times.get("torch", []),
            jax_runner.setup_s,
            torch_runner.setup_s if torch_runner else 0.0,
            load.fraction(),
        )
        results.append(result)
        ratio = f", ratio {result.jax_ips / result.torch_ips:.2f}x" if result.torch_ips else ""
        torch_part = f", torch {result.torch_ips:.2f} img/s" if result.torch_ips else ""
        print(f"[{kind}] JAX {result.jax_ips:.2f} img/s{torch_part}{ratio}", flush=True)
        if result.foreign_load is not None and result.foreign_load > FOREIGN_LOAD_WARN:
            print(
                f"WARNING [{kind}]: other processes used {100 * result.foreign_load:.0f}% of the "
                "CPU while timing; the figures are not trustworthy (rerun on an idle machine).",
                flush=True,
            )
        del jax_runner, torch_runner, runners
        gc.collect()
    print()
    for line in _table(results, args.model):
        print(line)
    print(
        "img/s = batch / median step time over all rounds; ms columns: median step time of "
        "each round (JAX/torch alternate within a round); other load: CPU share used by other "
        "processes while timing."
    )
    return results


if __name__ == "__main__":
    main()
