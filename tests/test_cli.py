"""Command-line mistakes end in one `error:` line naming what to change, exit code 2."""

from __future__ import annotations

import os
import pathlib
import subprocess
import sys

import pytest
import tqdm
from absl import flags
from ml_collections import config_flags

from aepg_jax.config import command_line
from aepg_jax.system import cli

ROOT = pathlib.Path(__file__).resolve().parents[1]


def _parse(argv: list[str], capsys) -> str:
    """Parses `argv` with fresh flags; returns the one error line printed on stderr."""
    fv = flags.FlagValues()
    config = config_flags.DEFINE_config_file("config", None, "", flag_values=fv, lock_config=True)
    with pytest.raises(SystemExit) as exit_info:
        command_line.parse_flags(["main", *argv], config, fv)
    assert exit_info.value.code == cli.EXIT_USER_ERROR
    lines = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: "), lines
    return lines[0]


def _main(tmp_path, *argv: str) -> str:
    """Runs `python -m aepg_jax.main` on the default config; returns its last stderr line."""
    out = subprocess.run(
        [sys.executable, "-m", "aepg_jax.main", "--config=configs/default.py", *argv],
        capture_output=True,
        text=True,
        cwd=ROOT,
        env={**os.environ, "JAX_PLATFORMS": "cpu"},
        timeout=300,
    )
    lines = [line for line in out.stderr.splitlines() if line.strip()]
    assert out.returncode == cli.EXIT_USER_ERROR, out.stderr[-2000:]
    assert not any("Traceback" in line for line in lines), lines
    assert lines[-1].startswith("error: "), lines
    return lines[-1]


def test_unknown_field_keeps_the_hint(tmp_path):
    line = _main(tmp_path, f"--workdir={tmp_path}", "--config.optim.learnign_rate=1e-3")
    assert line == (
        "error: --config.optim.learnign_rate: the config has no field 'learnign_rate'; "
        'did you mean "learning_rate"?'
    )


def test_missing_config_file(capsys):
    line = _parse(["--config=configs/no_such.py"], capsys)
    assert line == "error: --config=configs/no_such.py: no such config file."


def test_config_file_with_a_syntax_error(tmp_path, capsys):
    broken = tmp_path / "broken.py"
    broken.write_text("def get_config(:\n    pass\n")
    line = _parse([f"--config={broken}"], capsys)
    assert f"syntax error in {broken} line 1" in line


def test_config_argument_refused_by_get_config(capsys):
    line = _parse(["--config=configs/imagenet_r.py:taskz=10"], capsys)
    assert line.startswith("error: --config=configs/imagenet_r.py:taskz=10: ") and "tasks" in line


def test_value_of_the_wrong_type(tmp_path):
    line = _main(tmp_path, f"--workdir={tmp_path}", "--config.optim.learning_rate=fast")
    assert "optim.learning_rate" in line and "fast" in line


def test_error_line_is_not_glued_to_a_progress_bar(capsys):
    bar = tqdm.tqdm(total=10, desc="task 0")
    bar.update(3)
    with pytest.raises(SystemExit):
        cli.fail("boom")
    err = capsys.readouterr().err
    assert "\nerror: boom\n" in err or err.startswith("error: boom")


@pytest.mark.parametrize(
    "case",
    ["workdir_is_a_file", "negative_lwf_weight", "not_an_npz"],
)
def test_errors_after_parsing_are_one_line(tmp_path, case):
    """Through `python -m aepg_jax.main`: validation, workdir and checkpoint-file errors."""
    workdir, extra = tmp_path / "run", []
    if case == "workdir_is_a_file":
        workdir.write_text("not a directory")
        expected = "is an existing file; name a directory"
    elif case == "negative_lwf_weight":
        extra = ["--config.method.name=lwf", "--config.method.lwf_weight=-1"]
        expected = "method.lwf_weight=-1"
    else:
        fake = tmp_path / "weights.npz"
        fake.write_text("<html>not found</html>")
        extra = ["--config.model.init=augreg", f"--config.model.checkpoint={fake}"]
        expected = "model.checkpoint="
    line = _main(tmp_path, f"--workdir={workdir}", *extra)
    assert expected in line, line


def test_an_unknown_flag_names_the_config_fields_it_may_mean(capsys):
    line = _parse(["--config=configs/default.py", "--lr=0.1"], capsys)
    assert line.startswith("error: --lr is not a flag: ") and "--config.<section>.<field>" in line
    assert "did you mean --config.optim.learning_rate or " in line, line
    line = _parse(["--config=configs/scratch_default.py", "--momentum=0.8"], capsys)
    assert line.endswith("did you mean --config.optim.momentum?"), line


def test_a_missing_workdir_gets_our_message(capsys):
    fv = flags.FlagValues()
    config = config_flags.DEFINE_config_file("config", None, "", flag_values=fv, lock_config=True)
    flags.DEFINE_string("workdir", None, "", flag_values=fv)
    flags.mark_flags_as_required(["config", "workdir"], flag_values=fv)
    with pytest.raises(SystemExit) as exit_info:
        command_line.parse_flags(["main", "--config=configs/default.py"], config, fv)
    assert exit_info.value.code == cli.EXIT_USER_ERROR
    assert capsys.readouterr().err.splitlines() == [f"error: {command_line.REQUIRED['workdir']}"]


def test_repeated_wrappers_of_an_xla_error_are_said_once():
    nested = "Error dispatching computation: " * 9 + "UNKNOWN: Gloo AllReduce failed"
    assert cli.one_line(f"ValueError: {nested}") == (
        "Error dispatching computation: UNKNOWN: Gloo AllReduce failed"
    )


def test_a_shared_error_is_printed_by_process_0_alone(monkeypatch, capsys):
    """Under aepg_jax.launch every process meets the same config error: one line, not N."""
    for process_id, expected in (("1", []), ("0", ["error: bad config"])):
        monkeypatch.setenv("AEPG_PROCESS_ID", process_id)
        with pytest.raises(SystemExit):
            cli.fail("bad config", shared=True)
        assert capsys.readouterr().err.splitlines() == expected
    monkeypatch.setenv("AEPG_PROCESS_ID", "1")
    with pytest.raises(SystemExit):
        cli.fail("this process's own error")  # not shared: every process says its own
    assert capsys.readouterr().err.splitlines() == ["error: this process's own error"]


def test_help_lists_every_config_field_with_its_default(capsys):
    """`--help` exits 0 and prints every field of `schema.FIELDS` with its default, the model's
    fields and each method's own."""
    from aepg_jax import methods
    from aepg_jax.config import schema

    fv = flags.FlagValues()
    config = config_flags.DEFINE_config_file("config", None, "", flag_values=fv, lock_config=True)
    with pytest.raises(SystemExit) as exit_info:
        command_line.parse_flags(["main", "--help"], config, fv)
    assert exit_info.value.code == 0
    shown = capsys.readouterr().out
    assert "  data.num_tasks [5]  " in shown and "  loss.beta [None]  " in shown
    for name, _, meaning in schema.FIELDS:
        assert f"  {name} [" in shown and meaning in shown, name
    assert "lora_rank=4" in shown  # model.peft's defaults
    for method in methods.REGISTRY.values():
        assert all(f"{field}=" in shown for field in method.defaults), method.name
