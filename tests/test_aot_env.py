"""The planner's aot extra lives in .venv-aot: `python -m aepg_jax.plan` re-executes itself there
for TPU/GPU targets when this Python lacks it, or says in one line how to install it."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

from aepg_jax.plan import aot_env

ROOT = Path(__file__).resolve().parents[1]


def test_target_kinds_of_a_command_line():
    argv = ["plan", "--target=tpu:v5e:4x4", "--target", "gpu:h100x8:2", "--target=tpu:v5e-16"]
    assert aot_env.target_kinds(argv) == {"tpu", "gpu"}
    assert aot_env.target_kinds(["plan", "--target=cpu", "--config=x.py"]) == {"cpu"}


def _without_extra(monkeypatch):
    monkeypatch.setattr(aot_env, "installed", lambda module: False)
    monkeypatch.delenv("AEPG_PLAN_AOT_REEXEC", raising=False)


def test_a_cpu_target_needs_no_extra(monkeypatch, tmp_path):
    _without_extra(monkeypatch)
    aot_env.ensure(["plan", "--target=cpu"], root=tmp_path)  # returns


def test_missing_extra_is_one_line_naming_the_install_command(monkeypatch, tmp_path, capsys):
    _without_extra(monkeypatch)
    with pytest.raises(SystemExit) as exit_:
        aot_env.ensure(["plan", "--target=gpu:h100"], root=tmp_path)
    assert exit_.value.code == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("error: ")
    assert "jax_plugins.xla_cuda13" in err and "bash scripts/install.sh aot" in err


def test_the_planner_reexecutes_under_the_aot_venv(monkeypatch, tmp_path):
    _without_extra(monkeypatch)
    python = tmp_path / ".venv-aot" / "bin" / "python"
    python.parent.mkdir(parents=True)
    python.write_text("")
    calls = []

    class Replaced(Exception):  # os.execve never returns: the process is replaced
        pass

    def execve(*args):
        calls.append(args)
        raise Replaced

    monkeypatch.setattr(os, "execve", execve)
    argv = ["plan", "--config=c.py", "--target=tpu:v5e:4x4"]
    with pytest.raises(Replaced):
        aot_env.ensure(argv, root=tmp_path)
    ((path, args, env),) = calls
    assert path == python and args == [str(python), "-m", "aepg_jax.plan", *argv[1:]]
    assert env["AEPG_PLAN_AOT_REEXEC"] == "1"
    # Re-executed and still without the extra: one line, no loop.
    monkeypatch.setenv("AEPG_PLAN_AOT_REEXEC", "1")
    with pytest.raises(SystemExit):
        aot_env.ensure(argv, root=tmp_path)
    assert len(calls) == 1


def test_plan_command_without_the_extra_exits_2_in_one_line(tmp_path):
    """Through the real entry point, in a checkout copy with no .venv-aot."""
    if aot_env.installed("libtpu"):
        pytest.skip("this Python has the aot extra")
    env = {**os.environ, "AEPG_PLAN_AOT_REEXEC": "1"}  # as if .venv-aot lacked it too
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "aepg_jax.plan",
            "--config=configs/default.py",
            "--target=tpu:v5e:2x2",
        ],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "aot extra" in lines[0], proc.stderr
