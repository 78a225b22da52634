"""Smoke test of `benchmarks/bench_seeds.py` (the step benchmark against PyTorch:
tests/test_bench_step.py)."""

import sys
from pathlib import Path

import pytest

BENCHMARKS = Path(__file__).resolve().parents[1] / "benchmarks"


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


if __name__ == "__main__":
    sys.exit(pytest.main([__file__]))
