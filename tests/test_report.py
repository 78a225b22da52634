"""The sweep's report page (`python -m aepg_jax.tables DIR --html=FILE`).

Fast: a fake sweep of four runs (CE and aEPG, two seeds; one aEPG seed not run) whose run
folders are written by hand as the trainer writes them (config.json, metrics.jsonl,
predictions.npz, and results.json recomputed from those predictions as `aepg_jax.evaluate`
does), parsed with `html.parser`: the paired forest plot first, the table with ours beside the
paper's and its (!) mark, one chart per finished run, the CE / aEPG A_t chart, the config
differences within a cell, nothing external, a bounded size. A fake `field_claims` sweep of SLCA
(CE and aEPG, 3 seeds): the forest plot first, the title saying 3 seeds, the rows without runs
counted in one line, every row label whole, CE and aEPG in two colours named in a legend.

Slow: two real runs of the demo sweep, the page rendered in headless Chromium (Debian's
`chromium`, `bash scripts/install.sh browser` installs it): the rendered DOM holds the tables
and both runs' charts, and a screenshot is not blank.
"""

from __future__ import annotations

import html
import html.parser
import json
import pathlib
import re
import shutil
import subprocess
import sys
import time

import numpy as np
import pytest

from aepg_jax import metrics
from aepg_jax.continual import plots
from aepg_jax.evaluate import evaluate
from aepg_jax.experiments import Column, Experiment, Grid, Row, Table, registry
from aepg_jax.runs import predictions
from aepg_jax.tables import tables

REPO = pathlib.Path(__file__).resolve().parents[1]
TASKS, CLASSES_PER_TASK, PER_TASK = 5, 2, 12

EXPERIMENT = Experiment(
    "fake_report",
    "Fake report",
    [Grid("configs/demo.py", "method=plain,loss=ce/aepg,seed=0/1")],
    [
        Table(
            "Fake (digits)",
            columns=[Column("A_5", {}, "A_T"), Column("Ã_5", {}, "avg_inc_acc")],
            rows=[
                Row("LoRA", {"loss": "ce"}, ["10.0±1.0", ""]),
                Row("LoRA + aEPG", {"loss": "aepg"}, ["", ""]),
            ],
        )
    ],
)


def _kept(rng: np.random.Generator, skill: float) -> dict[str, np.ndarray]:
    """Every evaluation's kept rows of one run: after task j, PER_TASK examples of each seen
    task, right with probability `skill` (confidence 0.5..1)."""
    rows = []
    for j in range(TASKS):
        for i in range(j + 1):
            label = i * CLASSES_PER_TASK + rng.integers(0, CLASSES_PER_TASK, PER_TASK)
            right = rng.random(PER_TASK) < skill
            wrong = (label + 1) % ((j + 1) * CLASSES_PER_TASK)
            top = np.stack([np.where(right, label, wrong), np.where(right, wrong, label)], 1)
            conf = rng.uniform(0.5, 1.0, PER_TASK)
            probs = np.stack([conf, 1 - conf], 1)
            p_true = np.where(right, conf, 1 - conf)
            ent = -(conf * np.log(conf) + (1 - conf) * np.log(np.maximum(1 - conf, 1e-9)))
            rows.append(
                {
                    "after_task": np.full(PER_TASK, j, np.int16),
                    "task": np.full(PER_TASK, i, np.int16),
                    "index": np.arange(PER_TASK, dtype=np.int32),
                    "label": label.astype(np.int16),
                    "logged_entropy": ent.astype(np.float32),
                    "model/top_classes": top.astype(np.int16),
                    "model/top_probs": probs.astype(np.float16),
                    "model/p_true": p_true.astype(np.float32),
                    "model/entropy": ent.astype(np.float16),
                    "model/task_pred": label.astype(np.int16),  # task-incremental: always right
                }
            )
    return {k: np.concatenate([r[k] for r in rows]) for k in rows[0]}


META = {
    "predictors": np.array(["model"]),
    "task_offsets": np.arange(TASKS) * CLASSES_PER_TASK,
    "task_sizes": np.full(TASKS, CLASSES_PER_TASK),
    "num_classes": TASKS * CLASSES_PER_TASK,
    "scenario": "class",
    "format": predictions.FORMAT,
}


def write_run(folder: pathlib.Path, config: dict, seed: int, skill: float) -> dict:
    """A finished run's folder as the trainer leaves it; returns its results."""
    folder.mkdir(parents=True)
    (folder / "config.json").write_text(json.dumps(config))
    rng = np.random.default_rng(seed)
    arrays = _kept(rng, skill)
    for j in range(TASKS):
        rows = arrays["after_task"] == j
        predictions.write(folder, j, {k: v[rows] for k, v in arrays.items()}, META)
    arrays = predictions.load(folder / predictions.FILE)
    tracker = evaluate.tracker_of(arrays)
    summary = metrics.summary(tracker, "model")
    lines = []
    for step in range(1, 5 * TASKS + 1):
        record = {"type": "train", "task": (step - 1) // 5, "step": step, "loss": 2.0 / step}
        record["entropy"] = 1.0 - step / 40
        if config["loss"]["name"] == "aepg":
            record["alpha"] = 1.0 - ((step - 1) % 5) / 4
        lines.append(record)
        if step % 5 == 0:
            lines.append({"type": "eval", "task": step // 5 - 1, "step": step, "entropy": 0.5})
    (folder / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in lines))
    results = {"config": config, "seed": seed, "predictors": ["model"], **summary}
    results["methods"] = {"model": summary}
    (folder / "results.json").write_text(json.dumps(results))
    return results


def write_sweep(root: pathlib.Path) -> dict[str, dict]:
    """CE seeds 0 and 1 and aEPG seed 0 finished; aEPG seed 1 not run."""
    out = {}
    for run in EXPERIMENT.runs():
        if (run.value("loss"), run.seed) == ("aepg", 1):
            continue
        config = tables._configs(run, ())[0]
        skill = 0.8 if run.value("loss") == "aepg" else 0.5
        out[run.name] = write_run(root / run.name, config, run.seed, skill)
    return out


class Collector(html.parser.HTMLParser):
    """Every start tag with its attributes, and the text inside each `<td>`."""

    def __init__(self):
        super().__init__()
        self.tags: list[tuple[str, dict]] = []
        self.cells: list[str] = []
        self._td: list[str] | None = None

    def handle_starttag(self, tag, attrs):
        self.tags.append((tag, dict(attrs)))
        if tag == "td":
            self._td = []

    def handle_endtag(self, tag):
        if tag == "td" and self._td is not None:
            self.cells.append("".join(self._td).replace("\u00a0", " ").strip())
            self._td = None

    def handle_data(self, data):
        if self._td is not None:
            self._td.append(data)

    def count(self, tag: str, cls: str | None = None) -> int:
        return sum(
            1
            for t, a in self.tags
            if t == tag and (cls is None or cls in (a.get("class") or "").split())
        )


@pytest.fixture(scope="module")
def fake_sweep(tmp_path_factory) -> tuple[pathlib.Path, dict[str, dict]]:
    root = tmp_path_factory.mktemp("sweep")
    return root, write_sweep(root)


def test_the_report_of_a_fake_sweep(fake_sweep):
    root, results = fake_sweep
    warnings: set[str] = set()
    text = tables.report_page(str(root), EXPERIMENT, tables.View(), warnings)
    page = Collector()
    page.feed(text)
    # aEPG - CE paired by seed comes first: its forest plot before any table
    assert text.index('<svg class="chart forest"') < text.index('<table class="results"')
    assert "<h1>Fake report · 2 seeds</h1>" in text
    # the table: ours beside the paper's, Δ flagged where |Δ| > max(1, 2 x paper ±)
    assert page.count("table", "results") == 1
    ce = [r["A_T"] for n, r in results.items() if "loss=ce" in n]
    ours = f"{np.mean(ce):.1f} ± {np.std(ce, ddof=1):.1f} (n=2)"
    i = page.cells.index("LoRA")
    assert page.cells[i + 1 : i + 3] == [ours, "10.0 ± 1.0"]
    diff = np.mean(ce) - 10.0
    assert abs(diff) > 2 and page.cells[i + 3] == f"{diff:+.1f} (!)"
    assert page.count("td", "flag") == 1
    aepg = results["demo/loss=aepg,method=plain,seed=0"]["A_T"]
    assert page.cells[page.cells.index("LoRA + aEPG") + 1] == f"{aepg:.1f} (1/2 done)"
    assert any("have runs without results" in w for w in warnings)
    # per finished run one chart: its heatmap, reliability diagram and curves (alpha for aEPG)
    assert page.count("details", "run") == 4
    assert page.count("svg", "run") == 3
    assert text.count(">alpha (weight of CE)</text>") == 1
    assert text.count(">reliability after task 5</text>") == 3
    # aEPG beside CE: one chart of A_t with both losses; ours beside paper
    assert page.count("svg", "loss-comparison") == 1
    assert page.count("svg", "comparison") == 1
    assert "LoRA (CE; seeds 0, 1)" in text and "LoRA + aEPG (aEPG; seed 0)" in text
    # hover: a point names its row, column, loss and seeds
    assert "<title>LoRA · A_5 · CE · seeds 0, 1: " in text
    # the config differences within the CE cell: the seed, each run's and the other's
    assert page.count("table", "config-diff") == 2
    assert "<code>seed</code></td><td" in text
    # self-contained: nothing fetched, no script
    assert "http" not in text and "<script" not in text and "<link" not in text
    refs = [a.get(k) or "" for _, a in page.tags for k in ("src", "href")]
    assert not any("//" in r for r in refs), refs
    assert 20_000 < len(text.encode()) < 300_000, len(text.encode())


SLCA = "method=slca,head_init=trunc_normal"


@pytest.fixture(scope="module")
def claims_page(tmp_path_factory) -> str:
    """The page of a fake `field_claims` sweep of SLCA with its official heads, CE and aEPG,
    seeds 0-2 (as three sweeps `--where=...,seed=s` record it)."""
    root = tmp_path_factory.mktemp("claims")
    experiment = registry.get("field_claims")
    wheres = tuple(f"{SLCA},seed={s}" for s in range(3))
    view = tables.View((), wheres, recorded=True)
    for run in experiment.runs():
        if view.selects(run):
            skill = 0.8 if run.value("loss") == "aepg" else 0.5
            write_run(root / run.name, tables._configs(run, ())[0], run.seed, skill)
    return tables.report_page(str(root), experiment, view, set())


def _texts(svg_text: str) -> list[str]:
    """The text nodes of an SVG (a wrapped label: one per line)."""
    return [html.unescape(t) for t in re.findall(r"<text[^>]*>([^<]*)</text>", svg_text)]


def test_the_page_of_a_field_claims_sweep_answers_ce_against_aepg(claims_page):
    text = claims_page
    title = re.search(r"<h1>(.*?)</h1>", text)[1]
    assert "3 seeds" in title
    # the forest plot is the page's first chart, and comes before the tables
    first = re.search(r'<svg class="([^"]*)"', text)[1]
    assert first == "chart forest" and text.index(first) < text.index('id="tables"')
    # only the rows that ran, the others counted in one line
    page = Collector()
    page.feed(text)
    rows = ["SLCA (official heads: trunc_normal)", "SLCA (official heads: trunc_normal) + aEPG"]
    labels = [c for c in page.cells if c.startswith(("SLCA", "LoRA", "LAE"))]
    assert labels == ["SLCA (official heads: trunc_normal): aEPG - CE", *rows]
    assert "— (no run selected)" not in text
    others = len(registry.get("field_claims").tables[0].rows) - 2
    assert f"{others} rows (LoRA (official heads: normal), " in text
    # every row label whole in the charts (wrapped onto lines, never cut)
    pair = "SLCA (official heads: trunc_normal): aEPG - CE"
    for cls, labels in (("forest", [pair]), ("comparison", rows)):
        (chart,) = re.findall(rf'<svg class="chart {cls}".*?</svg>', text, re.S)
        texts = _texts(chart)
        assert "…" not in "".join(texts)
        for label in labels:
            lines = plots.wrap(label).split("\n")
            assert len(lines) > 1 and all(line in texts for line in lines), (label, texts)
    # CE and aEPG in two colours, named in the comparison chart's legend
    (chart,) = re.findall(r'<svg class="chart comparison".*?</svg>', text, re.S)
    assert "ours, CE: mean ± std over seeds" in _texts(chart)
    assert "ours, aEPG: mean ± std over seeds" in _texts(chart)
    ce, aepg = plots.loss_color("ce"), plots.loss_color("aepg")
    assert ce != aepg and ce in text and aepg in text
    assert "SLCA (official heads: trunc_normal) + aEPG · A_5 · aEPG · seeds 0, 1, 2" in text


def test_the_tables_cli_writes_the_page(fake_sweep, tmp_path, capsys):
    fake = tmp_path / "fake.py"
    fake.write_text("from test_report import EXPERIMENT\n")
    out = tmp_path / "report.html"
    argv = [str(fake_sweep[0]), f"--experiment={fake}", f"--html={out}", "--no_plots"]
    assert tables.main(argv) == 0  # one run has no results yet: a warning
    err = capsys.readouterr().err
    assert f"wrote {out}" in err and "warning:" in err
    page = Collector()
    page.feed(out.read_text())
    assert page.count("svg", "run") == 3
    bad = tmp_path / "missing" / "report.html"
    with pytest.raises(SystemExit):
        tables.main([*argv[:2], f"--html={bad}", "--no_plots"])
    assert f"--html={bad} cannot be written" in capsys.readouterr().err


def _chromium() -> str:
    """Chromium's path; where it is missing, `bash scripts/install.sh browser` installs it (as
    root, from apt, as the SLURM tests' fixture does), else the test is skipped with the reason."""
    found = shutil.which("chromium") or shutil.which("chromium-browser")
    if found is None and (REPO / ".venv" / "bin" / "python").exists():
        done = subprocess.run(
            ["bash", "scripts/install.sh", "browser"], cwd=REPO, capture_output=True, text=True
        )
        found = shutil.which("chromium")
        if found is None:
            pytest.skip(f"chromium could not be installed: {done.stderr.strip()[-300:]}")
    if found is None:
        pytest.skip("chromium is missing: `bash scripts/install.sh browser` installs it.")
    return found


CHROMIUM_FLAGS = (
    "--headless",
    "--no-sandbox",  # as root
    "--disable-gpu",
    "--hide-scrollbars",
    "--host-resolver-rules=MAP * ~NOTFOUND",  # offline: any fetch would fail
)


@pytest.mark.slow
def test_demo_report_renders_in_headless_chromium(tmp_path):
    """Two demo runs (LoRA, CE and aEPG, seed 0), their report rendered in headless Chromium:
    1.8 min on the 2-core CPU shared with other jobs (load ~15; 4.5 min at load ~20), of which
    Chromium 5 s."""
    chromium = _chromium()
    root = tmp_path / "demo"
    where = "--where=method=plain,seed=0"
    cmd = [sys.executable, "-m", "aepg_jax.sweep", "--experiment=demo", f"--workdir={root}"]
    subprocess.run([*cmd, where], check=True, cwd=REPO, capture_output=True, text=True)
    page_file = tmp_path / "report.html"
    tab = [sys.executable, "-m", "aepg_jax.tables", str(root), where, f"--html={page_file}"]
    done = subprocess.run([*tab, "--no_plots"], cwd=REPO, capture_output=True, text=True)
    assert page_file.exists(), done.stderr
    uri = page_file.as_uri()
    start = time.perf_counter()
    dom = subprocess.run(
        [chromium, *CHROMIUM_FLAGS, "--dump-dom", uri],
        check=True,
        capture_output=True,
        text=True,
        timeout=120,
    ).stdout
    shot = tmp_path / "shot.png"
    subprocess.run(
        [chromium, *CHROMIUM_FLAGS, "--window-size=1280,1400", f"--screenshot={shot}", uri],
        check=True,
        capture_output=True,
        timeout=120,
    )
    print(f"chromium: {time.perf_counter() - start:.1f} s")
    rendered = Collector()
    rendered.feed(dom)
    assert rendered.count("table", "results") == 1
    assert rendered.count("svg", "run") == 2
    assert rendered.count("svg", "loss-comparison") == 1
    assert rendered.count("details", "run") == 2
    assert any("LoRA + aEPG" in c for c in rendered.cells)
    from matplotlib import image

    pixels = image.imread(shot)
    assert pixels.shape[:2] == (1400, 1280)
    assert pixels[..., :3].std() > 0.05  # not blank


def test_an_inline_chart_is_self_contained_and_names_its_points():
    fig = plots.plot_bands(
        {
            "panel": [
                plots.Band(
                    "CE",
                    [1, 2],
                    [50.0, 40.0],
                    [1.0, 2.0],
                    plots.loss_color("ce"),
                    "A_t: CE (seeds 0, 1)",
                )
            ]
        },
        xlabel="after task t",
        ylabel="A_t (%)",
    )
    styles: dict[str, str] = {}
    chart = plots.svg_text(fig, "chart bands", styles)
    assert chart.startswith('<svg class="chart bands" role="img"') and chart.endswith("</svg>")
    assert "http" not in chart and "<metadata" not in chart and "style=" not in chart
    assert "<title>A_t: CE (seeds 0, 1)</title>" in chart
    assert plots.loss_color("ce") in plots.style_sheet(styles)
    assert "after task t" in _texts(chart) and "A_t (%)" in _texts(chart)
