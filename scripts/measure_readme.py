"""Re-measures every figure the README and docs/ quote from the embedded examples, in one go.

    nice -n 10 .venv/bin/python scripts/measure_readme.py [--out runs/readme] [--only NAME,...]

Each measurement is a command of `aepg_jax.main` (printed before it runs) with `num_seeds=5`
(seeds 0-4 vmapped as one program: each seed trains exactly as its single run would), read
back from its `results_seeds.json`; figures are mean +- sample sd (ddof=1) over the 5 seeds,
with each seed's value. A finished workdir is not run again (delete it to re-measure), so an
interrupted measurement resumes. The summary, with the machine (`aepg_jax.system.environment`) and
the date, is printed and written to `<out>/summary.md`; README.md and docs/ copy it.

Measurements (`--only`):
  default   the embedded default (LoRA + LAE), aEPG and CE: A_T, avg_inc_acc, forgetting
  timing    one run of the default (one seed) from a fresh workdir, wall time
  scratch   configs/scratch_default.py at alpha 0, 0.2, 1: test acc, test / train entropy
  inflora   the default with method.name=inflora, CE and aEPG: A_T
  prompts   the default with l2p, dualprompt, coda_prompt, CE and aEPG: A_T
  params    scripts/count_params.py (parameter counts, deterministic)
"""

from __future__ import annotations

import argparse
import datetime
import json
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

from aepg_jax.system import environment

PY = sys.executable
SEEDS = 5
MAIN = [PY, "-m", "aepg_jax.main"]


def run(cmd: list[str], lines: list[str]) -> float:
    """Runs `cmd` (its output to the terminal), returns its wall time in seconds."""
    shown = " ".join(c.replace(PY, ".venv/bin/python") for c in cmd)
    print(f"\n$ {shown}", flush=True)
    lines.append(f"    {shown}")
    start = time.time()
    subprocess.run(cmd, check=True)
    return time.time() - start


def mean_sd(values: list[float | None], digits: int = 2) -> str:
    v = np.array([x for x in values if x is not None], np.float64)
    return f"{v.mean():.{digits}f} +- {v.std(ddof=1):.{digits}f}"


REPORT_ONLY = False  # --report-only: summarise the finished runs, start none


def continual(out: Path, name: str, overrides: list[str], lines: list[str]) -> dict | None:
    """A `num_seeds` run of the default config with `overrides`; its results_seeds.json (None
    when it has not run and REPORT_ONLY)."""
    workdir = out / name
    summary = workdir / "results_seeds.json"
    if not summary.is_file() and REPORT_ONLY:
        lines.append(f"    ({workdir}: not measured)")
        return None
    if not summary.is_file():
        wall = run(
            [*MAIN, "--config=configs/default.py", f"--config.num_seeds={SEEDS}", *overrides,
             f"--workdir={workdir}"],
            lines,
        )  # fmt: skip
        (workdir / "wall_s.txt").write_text(f"{wall:.1f}\n")
    else:
        lines.append(f"    (already measured in {workdir})")
    return json.loads(summary.read_text())


def _wall(workdir: Path, result: dict) -> str:
    """The command's wall time (wall_s.txt), else the run's own `wall_time_s`."""
    path = workdir / "wall_s.txt"
    if path.is_file():
        return path.read_text().strip()
    return f"{result['wall_time_s']:.0f} (run's own)"


def continual_row(label: str, result: dict | None, out: Path, name: str) -> str:
    if result is None:
        return f"| {label} | not measured | | | | |"
    primary = result["predictors"][0]
    m = result["metrics"][primary]
    wall = _wall(out / name, result)
    values = ", ".join(f"{v:.2f}" for v in m["A_T"]["values"])
    return (
        f"| {label} | {mean_sd(m['A_T']['values'])} | {mean_sd(m['avg_inc_acc']['values'])} | "
        f"{mean_sd(m['forgetting']['values'])} | {values} | {wall} s |"
    )


HEADER = (
    "| run | A_T (%) | avg_inc_acc (%) | forgetting (%) | A_T per seed 0-4 | wall (5 seeds) |\n"
    "|---|---|---|---|---|---|"
)


def measure_default(out: Path, lines: list[str]) -> None:
    lines += ["", "## default: LoRA + LAE, aEPG vs CE (ensemble predictor)", ""]
    rows = []
    for loss in ("aepg", "ce"):
        name = f"default-{loss}"
        res = continual(out, name, [f"--config.loss.name={loss}"], lines)
        rows.append(continual_row(loss, res, out, name))
    lines += ["", HEADER, *rows]


def measure_methods(out: Path, lines: list[str], methods: tuple[str, ...], title: str) -> None:
    lines += ["", f"## {title}", ""]
    rows = []
    for method in methods:
        for loss in ("ce", "aepg"):
            name = f"default-{method}-{loss}"
            res = continual(
                out, name, [f"--config.method.name={method}", f"--config.loss.name={loss}"], lines
            )
            rows.append(continual_row(f"{method} / {loss}", res, out, name))
    lines += ["", HEADER, *rows]


def measure_timing(out: Path, lines: list[str]) -> None:
    lines += ["", "## timing: one default run (seed 0), fresh workdir, shipped backbone", ""]
    workdir = out / "default-timing"
    if workdir.exists():
        subprocess.run(["rm", "-rf", str(workdir)], check=True)
    wall = run([*MAIN, "--config=configs/default.py", f"--workdir={workdir}"], lines)
    res = json.loads((workdir / "results.json").read_text())
    lines += [
        "",
        f"wall time of the command: {wall:.0f} s (the run's own wall_time_s: "
        f"{res['wall_time_s']:.0f} s); A_T {res['A_T']:.2f}",
    ]


def measure_scratch(out: Path, lines: list[str]) -> None:
    lines += ["", "## scratch: configs/scratch_default.py, 5 seeds, after the 4 epochs", ""]
    rows = []
    for alpha in ("0", "0.2", "1"):
        workdir = out / f"scratch-a{alpha}"
        summary = workdir / "results_seeds.json"
        if not summary.is_file() and REPORT_ONLY:
            rows.append(f"| {alpha} | not measured | | | |")
            continue
        if not summary.is_file():
            wall = run(
                [*MAIN, f"--config=configs/scratch_default.py:alpha={alpha}",
                 f"--config.num_seeds={SEEDS}", f"--workdir={workdir}"],
                lines,
            )  # fmt: skip
            (workdir / "wall_s.txt").write_text(f"{wall:.1f}\n")
        res = json.loads(summary.read_text())
        per_seed = res["per_seed"]
        train_h = [
            mean_sd([r["train_entropy"][e] for r in per_seed], 3)
            for e in range(len(per_seed[0]["train_entropy"]))
        ]
        rows.append(
            f"| {alpha} | {mean_sd([r['final_test_acc'] for r in per_seed])}% | "
            f"{mean_sd([r['final_test_entropy'] for r in per_seed], 3)} | "
            + " / ".join(train_h)
            + f" | {_wall(workdir, res)} s |"
        )
    lines += [
        "",
        "| alpha | test acc | test entropy | train entropy after epochs 1 / 2 / 3 / 4 | wall |",
        "|---|---|---|---|---|",
        *rows,
    ]


def measure_params(out: Path, lines: list[str]) -> None:
    lines += ["", "## params: scripts/count_params.py", ""]
    cmd = [PY, "scripts/count_params.py"]
    lines.append("    .venv/bin/python scripts/count_params.py")
    text = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
    lines += ["", *[f"    {line}" for line in text.splitlines()]]


MEASUREMENTS = {
    "default": measure_default,
    "timing": measure_timing,
    "scratch": measure_scratch,
    "inflora": lambda out, lines: measure_methods(out, lines, ("inflora",), "InfLoRA"),
    "prompts": lambda out, lines: measure_methods(
        out, lines, ("l2p", "dualprompt", "coda_prompt"), "prompt methods"
    ),
    "params": measure_params,
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path("runs/readme"))
    parser.add_argument("--only", default=",".join(MEASUREMENTS), help="comma-separated names")
    parser.add_argument("--summary", type=Path, help="summary file [<out>/summary.md]")
    parser.add_argument(
        "--report-only", action="store_true", help="summarise finished runs only, start none"
    )
    args = parser.parse_args()
    global REPORT_ONLY
    REPORT_ONLY = args.report_only
    names = [n for n in args.only.split(",") if n]
    unknown = sorted(set(names) - set(MEASUREMENTS))
    if unknown:
        parser.error(f"unknown measurement(s) {', '.join(unknown)}; use {', '.join(MEASUREMENTS)}")
    args.out.mkdir(parents=True, exist_ok=True)
    summary = args.summary or args.out / "summary.md"
    env = environment.describe()
    date = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC")
    lines = [
        f"# README measurements, started {date}",
        "",
        f"machine: {env['cpu_model']}, {env['platform']}; jax {env['jax']}, jaxlib "
        f"{env['jaxlib']}, Python {env['python']}",
    ]
    for name in names:
        MEASUREMENTS[name](args.out, lines)
        summary.write_text("\n".join(lines) + "\n")  # after each: a partial summary
    end = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC")
    lines += ["", f"finished {end}"]
    summary.write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
