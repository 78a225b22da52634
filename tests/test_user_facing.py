"""What a new user meets first (issue 23): the shipped backbone of the default, alpha only where
a loss uses one, a corrected config after a failed start, Ctrl-C, tasks numbered 1..T, file
modes, compare_runs on a multi-seed workdir."""

from __future__ import annotations

import json
import os
import pathlib
import shutil
import signal
import stat
import subprocess
import sys
import time
import zipfile

import ml_collections
import pytest
from tiny import write_spec

from aepg_jax import losses, main
from aepg_jax.config import schema
from aepg_jax.continual import plots, results, trainer
from aepg_jax.data import loader
from aepg_jax.pretraining import pretrain
from aepg_jax.runs import records

ROOT = pathlib.Path(__file__).resolve().parents[1]


def _default(tmp_path) -> ml_collections.ConfigDict:
    cfg = schema.from_file(str(ROOT / "configs" / "default.py"))
    cfg.data.cache_dir = str(tmp_path / "cache")
    cfg.pretrain.cache_dir = str(tmp_path / "cache" / "pretrained")
    return cfg


def test_default_uses_the_shipped_backbone_and_reports_it(tmp_path, capsys):
    """The default's backbone comes from the package (fingerprint checked; nothing is
    pretrained); results.json names it and the machine; a CE run logs no alpha; the final table
    counts tasks from 1; results.json is 0644."""
    cfg = _default(tmp_path)
    shipped = pretrain.shipped_backbone(cfg)
    assert shipped is not None and os.path.dirname(shipped) == pretrain.ASSETS_DIR
    manifest = pretrain.shipped_manifest()[os.path.basename(shipped)]
    assert pretrain.file_fingerprint(shipped) == manifest["sha256"]
    cfg.loss.name = "ce"
    cfg.method.name = "plain"  # neither changes the backbone; one predictor compiles faster
    cfg.data.num_tasks = 1  # one compiled step and evaluation: the backbone is what is tested
    cfg.max_steps_per_task = 2
    cfg.log_every_steps = 1
    old = os.umask(0o022)
    try:
        out = trainer.run(cfg, str(tmp_path / "run"))
    finally:
        os.umask(old)
    assert not os.path.exists(cfg.pretrain.cache_dir)  # no pretraining happened
    saved = json.loads((tmp_path / "run" / "results.json").read_text())
    assert saved["backbone_source"] == {
        "path": shipped,
        "shipped": True,
        "sha256": manifest["sha256"],
    }
    assert saved["backbone_fingerprint"] == out["backbone_fingerprint"]
    assert len(saved["backbone_fingerprint"]) == 64
    env = saved["environment"]
    assert env["jax"] and env["jaxlib"] and env["cpu_model"]
    assert stat.S_IMODE(os.stat(tmp_path / "run" / "results.json").st_mode) == 0o644
    train = [r for r in records.read_metrics(tmp_path / "run") if r["type"] == "train"]
    assert len(train) == 2 and not any("alpha" in r for r in train)
    printed = capsys.readouterr().out
    assert "i=1 " in printed and "j=1" in printed and "i=0" not in printed


def test_shipped_backbone_fingerprint_mismatch_is_refused(tmp_path, monkeypatch):
    cfg = _default(tmp_path)
    name = pretrain.backbone_name(cfg)
    manifest = pretrain.shipped_manifest()
    manifest[name] = {**manifest[name], "sha256": "0" * 64}
    fake = tmp_path / "backbones.json"
    fake.write_text(json.dumps(manifest))
    monkeypatch.setattr(pretrain, "SHIPPED_MANIFEST", str(fake))
    with pytest.raises(ValueError, match=r"does not match its fingerprint.*shipped=False"):
        pretrain.pretrain_backbone(cfg, loader.data_mesh())
    cfg.pretrain.shipped = False  # the documented way out: pretrain locally
    assert pretrain.shipped_backbone(cfg) is None
    cfg.pretrain.shipped = True
    cfg.pretrain.epochs = 3  # other settings: no shipped file, pretraining as before
    assert pretrain.shipped_backbone(cfg) is None


@pytest.mark.slow  # builds a wheel in an isolated build environment (PyPI)
def test_the_wheel_ships_the_backbone(tmp_path):
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "-q",
         "-w", str(tmp_path), str(ROOT)],
        check=True, cwd=tmp_path, capture_output=True,
    )  # fmt: skip
    (wheel,) = tmp_path.glob("aepg_jax-*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    for shipped in pretrain.shipped_manifest():
        assert f"aepg_jax/assets/{shipped}" in names
    assert "aepg_jax/assets/backbones.json" in names


def test_alpha_is_logged_only_for_losses_that_use_one():
    assert losses.fixed_alpha("mix", alpha=0.2) == 0.2
    assert losses.fixed_alpha("mix") == 0.5  # its default
    assert losses.fixed_alpha("aepg") is None and losses.fixed_alpha("ce") is None
    assert losses.uses_alpha("aepg") and losses.uses_alpha("mix")
    assert not losses.uses_alpha("ce") and not losses.uses_alpha("focal")


def test_task_boundaries_are_where_tasks_end():
    train = [
        {"type": "train", "task": t, "step": s}
        for t in (0, 1)
        for s in range(t * 30 + 10, t * 30 + 31, 10)
    ]
    evals = [{"type": "eval", "task": 0, "step": 30}, {"type": "eval", "task": 1, "step": 60}]
    assert plots._task_boundaries(train, evals) == [30.0]
    assert plots._task_boundaries(train) == [30.0]  # the last logged step of the task


def test_final_table_counts_tasks_from_one():
    res = {
        "accuracy_matrix": [[90.0, 80.0], [None, 70.0]],
        "predictors": ["model"],
        "A_T": 75.0,
    }
    lines = results.final_table(res).splitlines()
    assert lines[1].split() == ["j=1", "j=2"]
    assert lines[2].startswith("i=1") and lines[3].startswith("i=2")


def test_results_files_get_the_usual_mode(tmp_path):
    old = os.umask(0o022)
    try:
        path = records.write_results(tmp_path, {"a": 1})
        other = records.write_results(tmp_path, {"a": 1}, "results_seeds.json")
    finally:
        os.umask(old)
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o644
    assert stat.S_IMODE(os.stat(other).st_mode) == 0o644


def test_a_corrected_config_is_accepted_until_the_first_checkpoint(tmp_path):
    cfg = _default(tmp_path)
    workdir = str(tmp_path / "run")
    cfg.data.data_dir = "/no/such/dir"  # a failed start: config.json written, nothing trained
    main.check_or_save_config(cfg, workdir)
    cfg.data.data_dir = None  # corrected
    main.check_or_save_config(cfg, workdir)
    saved = json.loads((tmp_path / "run" / "config.json").read_text())
    assert saved["data"]["data_dir"] is None
    os.makedirs(tmp_path / "run" / "checkpoints" / "10")  # now the run has a checkpoint
    cfg.data.data_dir = "/elsewhere"  # where the data is does not change the run's result
    main.check_or_save_config(cfg, workdir)
    cfg.optim.epochs += 1  # this does
    with pytest.raises(ValueError, match=r"holds a run with another config \(differs in: optim"):
        main.check_or_save_config(cfg, workdir)


def _seed_run(directory: pathlib.Path, seed: int, a_t: float) -> None:
    config = {"seed": seed, "num_seeds": 1, "loss": {"name": "ce"}, "method": {"name": "lae"}}
    res = {"config": config, "seed": seed, "A_t": [a_t], "A_T": a_t, "avg_inc_acc": a_t}
    records.write_results(directory, res)


def test_compare_runs_takes_a_num_seeds_workdir(tmp_path, capsys, monkeypatch):
    for seed, a_t in ((3, 50.0), (4, 54.0)):
        _seed_run(tmp_path / "multi" / f"seed_{seed}", seed, a_t)
    records.write_results(tmp_path / "multi", {"seeds": [3, 4]}, "results_seeds.json")
    _seed_run(tmp_path / "single", 0, 60.0)
    monkeypatch.syspath_prepend(str(ROOT / "scripts"))
    import compare_runs

    monkeypatch.setattr(sys, "argv", ["compare_runs.py", str(tmp_path / "multi")])
    compare_runs.main()
    printed = capsys.readouterr().out
    row = next(line for line in printed.splitlines() if line.startswith("ce / lae"))
    assert row.split()[3] == "2" and "52.00 +- 2.83" in row
    assert (tmp_path / "compare.png").is_file()  # beside the run, not in the current directory
    monkeypatch.setattr(sys, "argv", ["compare_runs.py", str(tmp_path / "single")])
    compare_runs.main()
    assert "60.00 (1 seed)" in capsys.readouterr().out


def _interrupt_run(tmp_path, overrides: dict) -> subprocess.CompletedProcess:
    """Starts a tiny run, sends SIGINT once it has logged a training step, returns its end."""
    config = write_spec(tmp_path / "spec.json", tmp_path / "cache", overrides)
    workdir = tmp_path / "run"
    proc = subprocess.Popen(
        [sys.executable, "-m", "aepg_jax.main", f"--config={config}", f"--workdir={workdir}"],
        cwd=ROOT,
        env={**os.environ, "JAX_PLATFORMS": "cpu"},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    deadline = time.time() + 240
    metrics = workdir / "metrics.jsonl"
    while time.time() < deadline and proc.poll() is None:
        if metrics.is_file() and '"train"' in metrics.read_text():
            break
        time.sleep(0.2)
    assert proc.poll() is None, "the run ended before it could be interrupted"
    proc.send_signal(signal.SIGINT)
    stdout, stderr = proc.communicate(timeout=120)
    return subprocess.CompletedProcess(proc.args, proc.returncode, stdout, stderr)


def _message_lines(stderr: str) -> list[str]:
    """stderr without the progress bars' redraws."""
    parts = (p.strip() for line in stderr.splitlines() for p in line.split("\r"))
    return [p for p in parts if p and "step/s" not in p and "it/s" not in p and "img/s" not in p]


@pytest.mark.parametrize(
    "method",
    ["plain", pytest.param("coda_prompt", marks=pytest.mark.slow)],
)
def test_ctrl_c_prints_one_line_and_exits_130(tmp_path, method):
    overrides = {"method.name": method, "max_steps_per_task": 100_000, "optim.epochs": 1000}
    done = _interrupt_run(tmp_path, overrides)
    lines = _message_lines(done.stderr)
    assert done.returncode == 130, done.stderr[-3000:]
    assert "Traceback" not in done.stderr
    assert len(lines) == 1, lines
    assert lines[0].startswith("interrupted at task 1/3, step "), lines
    assert lines[0].endswith("; run the same command to resume")
    shutil.rmtree(tmp_path / "cache", ignore_errors=True)
