"""The field's methods end to end at real size, each with its official settings.

    python benchmarks/rehearse_methods.py --root=ROOT [--methods=simplecil,aper,ease,ranpac,...]
        [--dataset=imagenet_r|imagenet_a] [--tasks=10] [--steps=20] [--width=vit_ti]

For each method, the ImageNet-R aEPG seed-0 run of its experiment (`aper` for SimpleCIL and
APER, `ease`, `ranpac`, `sd_lora`, `slca`: the overrides of its official code, batch size, SGD,
adapters, [0, 1] inputs, class order) goes through `benchmarks/rehearse.py imagenet_r` on the
synthetic ImageNet-R (`benchmarks/make_synthetic_archives.py`, written to ROOT/archives when
absent, prepared once into ROOT/prepared): 224 px crops of the 256 px cache, every task and
every evaluation over the whole seen test set, the method's class-statistics passes over every
task's training split, a random-init ViT at `--width` (ViT-Ti: 192 wide, 3 heads, MLP 768,
depth 12), `--tasks` tasks (the published ImageNet-R splits are 10 tasks, APER's 40) and at
most `--steps` training steps per task. The pretrained weights are left out (nothing is
downloaded); the host and device side is rehearsed, not accuracy. `--dataset=imagenet_a` runs
the same settings on PILOT's ImageNet-A folder (7,500 images) instead.
Prints one row per method (exit, wall, peak RSS, the accelerator's
peak memory where there is one, compilations) and writes ROOT/rehearsal-DATASET-METHOD.json
and ROOT/results-METHOD.json.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)

from aepg_jax.experiments import layout, registry, spec  # noqa: E402

# Which experiment holds each method's ImageNet-R runs, and the runs' selection.
EXPERIMENTS = {
    "simplecil": ("aper", "config=imagenet_r,method=simplecil,seed=0"),
    "aper": ("aper", "config=imagenet_r,method=aper,loss=aepg,seed=0"),
    "ease": ("ease", "config=imagenet_r,method=ease,loss=aepg,seed=0"),
    "ranpac": ("ranpac", "config=imagenet_r,method=ranpac,loss=aepg,seed=0"),
    "sd_lora": ("sd_lora", "config=imagenet_r,method=sd_lora,loss=aepg,seed=0,tasks=10"),
    "slca": ("slca", "config=imagenet_r,method=slca,loss=aepg,seed=0"),
    "hide_prompt": ("hide_prompt", "config=imagenet_r,method=hide_prompt,loss=aepg,seed=0"),
}
# The datasets: their config (the method's ImageNet-R settings are applied to it) and archive.
DATASETS = {
    "imagenet_r": ("configs/imagenet_r.py:", "imagenet-r.tar"),
    "imagenet_a": ("configs/pilot.py:dataset=imagenet_a,", "imagenet-a"),
}
WIDTHS = {
    "vit_ti": ("hidden_size=192", "num_heads=3", "mlp_dim=768", "depth=12"),
    "vit_s": ("hidden_size=384", "num_heads=6", "mlp_dim=1536", "depth=12"),
    "vit_b": ("hidden_size=768", "num_heads=12", "mlp_dim=3072", "depth=12"),
}


def official_flags(method: str, tasks: int, dataset: str = "imagenet_r") -> list[str]:
    """`--run_config=...` and the `--config.*` overrides of `method`'s ImageNet-R run, on
    `dataset`'s config at `tasks` tasks and without published weights."""
    experiment, where = EXPERIMENTS[method]
    runs = spec.filter_runs(registry.get(experiment).runs(), where)
    if not runs:
        raise SystemExit(f"error: {experiment} has no run with {where}")
    unit = layout.units(runs[:1])[0]
    config = re.sub(r"tasks=\d+", f"tasks={tasks}", unit.config_arg)
    config = config.replace("configs/imagenet_r.py:", DATASETS[dataset][0])
    flags = [f for f in unit.overrides() if not f.startswith("--config.model.weights=")]
    return [f"--run_config={config}", *flags]


def rehearse(method: str, args: argparse.Namespace) -> dict:
    """One method through benchmarks/rehearse.py in a child; its JSON and results.json."""
    archives = os.path.join(args.root, "archives")
    cmd = [
        sys.executable, os.path.join(REPO, "benchmarks", "rehearse.py"), args.dataset,
        f"--archives={archives}", f"--root={args.root}", "--skip_prepare",
        f"--steps={args.steps}", f"--tag={method}",
        *official_flags(method, args.tasks, args.dataset),
        "--config.model.init=random",
        *(f"--config.model.{w}" for w in WIDTHS[args.width]),
    ]  # fmt: skip
    print("$", " ".join(cmd), flush=True)
    start = time.time()
    code = subprocess.call(cmd, cwd=REPO)
    out = {"method": method, "exit": code, "wall_s": time.time() - start}
    path = os.path.join(args.root, f"rehearsal-{args.dataset}-{method}.json")
    if os.path.exists(path):
        out["rehearsal"] = json.load(open(path))
    results = os.path.join(args.root, "runs", args.dataset, "results.json")
    if os.path.exists(results):
        shutil.copy(results, os.path.join(args.root, f"results-{method}.json"))
        out["results"] = json.load(open(results))
    return out


def row(r: dict) -> str:
    """Markdown row: method, exit, wall, peak RSS, accelerator peak, compilations, A_T."""
    run = (r.get("rehearsal") or {}).get("run") or {}
    dev = run.get("device")
    comp = run.get("compilations") or {}
    acc = (r.get("results") or {}).get("A_T")
    cells = [
        r["method"],
        str(r["exit"]),
        f"{r['wall_s']:.0f} s",
        f"{run['peak_rss_gib']:.2f} GiB" if run else "",
        f"{dev['peak_bytes'] / 2**30:.2f} GiB ({dev['device']})" if dev else "none",
        f"{comp.get('count', '')} ({comp.get('seconds', 0):.0f} s)" if comp else "",
        "" if acc is None else f"{acc:.2f}",
    ]
    return "| " + " | ".join(cells) + " |"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--root", required=True)
    parser.add_argument("--methods", default="simplecil,aper,ease,ranpac")
    parser.add_argument("--dataset", choices=sorted(DATASETS), default="imagenet_r")
    parser.add_argument("--tasks", type=int, default=10)
    parser.add_argument("--steps", type=int, default=20, help="max_steps_per_task")
    parser.add_argument("--width", choices=sorted(WIDTHS), default="vit_ti")
    parser.add_argument("--scale", type=float, default=1.0, help="of the synthetic archive")
    args = parser.parse_args()
    args.root = os.path.abspath(args.root)  # the runs start in the repository
    methods = args.methods.split(",")
    if unknown := sorted(set(methods) - set(EXPERIMENTS)):
        raise SystemExit(f"error: --methods: unknown {unknown}; choose from {sorted(EXPERIMENTS)}")
    archive = os.path.join(args.root, "archives", DATASETS[args.dataset][1])
    prepared = os.path.join(args.root, "prepared", args.dataset)
    if not os.path.exists(archive) and not os.path.isdir(prepared):
        start = time.time()
        make = os.path.join(REPO, "benchmarks", "make_synthetic_archives.py")
        out = f"--out={os.path.dirname(archive)}"
        subprocess.check_call([sys.executable, make, args.dataset, out, f"--scale={args.scale}"])
        print(f"synthetic archive: {time.time() - start:.0f} s", flush=True)
    rows = [rehearse(m, args) for m in methods]
    print("\n| method | exit | wall | peak RSS | accelerator peak | compilations | A_T |")
    print("|---|---|---|---|---|---|---|")
    for r in rows:
        print(row(r))
    sys.exit(max(r["exit"] for r in rows))


if __name__ == "__main__":
    main()
