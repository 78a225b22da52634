"""Smoke tests of the benchmarks in benchmarks/ that need no optional dependencies (the step
benchmark against PyTorch: tests/test_bench_step.py)."""

import runpy
import sys
from pathlib import Path

import pytest

BENCHMARKS = Path(__file__).resolve().parents[1] / "benchmarks"


def test_bench_vit_compute_times_forward_and_backward(capsys, monkeypatch):
    monkeypatch.syspath_prepend(str(BENCHMARKS))
    import bench_vit_compute

    results = bench_vit_compute.main(["--preset", "vit_tiny", "--batch", "2", "--steps", "1"])
    assert set(results) == {"forward", "forward+backward"}
    assert all(seconds > 0 for seconds, _, _ in results.values())
    assert "img/s" in capsys.readouterr().out


def test_bench_breakdown_times_each_row_against_the_minimal_step(capsys, monkeypatch):
    monkeypatch.syspath_prepend(str(BENCHMARKS))
    monkeypatch.setenv("AEPG_MALLOC", "default")  # leave this worker's allocator alone
    import bench_breakdown

    rows = ["minimal", "ours -augment"]  # the minimal step and ours with a piece patched out
    medians = bench_breakdown.main(
        ["--model", "vit_tiny", "--rows", ",".join(rows), "--steps", "1", "--rounds", "1"]
    )
    assert list(medians) == rows and all(seconds > 0 for seconds in medians.values())
    table = capsys.readouterr().out
    minimal_line = next(line for line in table.splitlines() if line.startswith("minimal "))
    assert minimal_line.split()[3] == "1.00x"  # step s, img/s, then the ratio to itself
    assert "temp MiB" in table and "peak RSS" in table


@pytest.mark.slow
def test_bench_seeds_times_both_sides_and_seeds_agree(tmp_path, capsys, monkeypatch):
    monkeypatch.syspath_prepend(str(BENCHMARKS))
    import bench_seeds

    measured = bench_seeds.main(
        [
            "--num-seeds", "2", "--epochs", "1", "--tasks", "2", "--max-steps", "2",
            "--pretrain-dataset", "digits", "--pretrain-epochs", "1",
            "--cache-dir", str(tmp_path / "cache"),
        ]
    )  # fmt: skip
    out = capsys.readouterr().out
    assert set(measured) == {"sequential", "vmapped"}
    assert all(seconds > 0 for seconds, _ in measured.values())
    assert measured["sequential"][1] == pytest.approx(measured["vmapped"][1], abs=1e-6)
    assert "speed-up sequential / vmapped:" in out and "max |A_T difference|: 0.0000" in out


@pytest.mark.slow
def test_bench_loop_prints_both_modes(capsys, monkeypatch):
    monkeypatch.setattr(sys, "argv", ["bench_loop.py", "--steps", "4", "--steps-per-call", "2"])
    runpy.run_path(str(BENCHMARKS / "bench_loop.py"), run_name="__main__")
    out = capsys.readouterr().out
    assert "per-step loop" in out and "lax.scan chunks" in out and "ratio scan / per-step" in out


if __name__ == "__main__":
    sys.exit(pytest.main([__file__]))
