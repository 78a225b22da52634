"""Smoke tests of the user scripts in scripts/ that need no optional dependencies (compare_runs.py:
tests/test_metrics_report.py, compare_scratch.py: tests/test_scratch.py)."""

import runpy
import sys
from pathlib import Path

import pytest

SCRIPTS = Path(__file__).resolve().parents[1] / "scripts"


def test_plot_schedules_prints_table8_and_writes_png(tmp_path, capsys, monkeypatch):
    out = tmp_path / "alpha.png"
    monkeypatch.setattr(sys, "argv", ["plot_schedules.py", "--out", str(out), "--steps", "200"])
    runpy.run_path(str(SCRIPTS / "plot_schedules.py"), run_name="__main__")
    printed = capsys.readouterr().out
    table8 = {4: ("0.9820", "0.0180"), 6: ("0.9975", "0.0025"), 8: ("0.9997", "0.0003")}
    for tau, (start, end) in table8.items():
        assert f"{tau:>5} {start:>12} {end:>10}" in printed
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


if __name__ == "__main__":
    sys.exit(pytest.main([__file__]))
