"""Tests of benchmarks/bench_step.py: the JAX-only path, the missing-torch exit, the torch side."""

import importlib
import math
import sys
from pathlib import Path

import pytest

BENCHMARKS = Path(__file__).resolve().parents[1] / "benchmarks"


@pytest.fixture
def bench(monkeypatch):
    """The `bench_step` script as a module (it imports its sibling `_timm_import`)."""
    monkeypatch.syspath_prepend(str(BENCHMARKS))
    return importlib.import_module("bench_step")


@pytest.mark.slow  # CI: the table test below times the same JAX step
def test_bench_jax_vit_tiny_reports_positive_throughput(bench):
    ips = bench.bench_jax("lora", model="vit_tiny", batch=4, steps=2, rounds=1, warmup=1)
    assert math.isfinite(ips) and ips > 0


@pytest.mark.parametrize("dtype", ["float32", pytest.param("bfloat16", marks=pytest.mark.slow)])
def test_jax_only_main_prints_table_without_torch(bench, capsys, dtype):
    args = ["--model", "vit_tiny", "--peft", "prefix", "--jax-only", "--steps", "1"]
    results = bench.main([*args, "--rounds", "1", "--dtype", dtype])
    out = capsys.readouterr().out
    assert len(results) == 1 and results[0].torch_ips is None and results[0].jax_ips > 0
    assert "command: " in out and "os.cpu_count()=" in out and f"compute dtype {dtype}" in out
    assert "vit_tiny  prefix" in out


def test_missing_torch_prints_install_commands_and_exits_2(bench, monkeypatch, capsys):
    def missing():
        raise bench._timm_import.TorchMissingError(["torch", "timm"])

    monkeypatch.setattr(bench._timm_import, "import_timm", missing)
    with pytest.raises(SystemExit) as exc:
        bench.main(["--model", "vit_tiny", "--peft", "lora"])
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert "missing: torch, timm" in err
    for command in (
        "pip install torch==2.13.0",
        "pip install --no-deps timm",
        "pip install pyyaml huggingface_hub safetensors",
    ):
        assert command in err
    assert "Traceback" not in err


def test_torch_reference_step_runs_for_each_peft_kind(bench):
    missing = bench._timm_import.missing_packages()
    if missing:
        pytest.skip(f"optional benchmark dependencies not installed: {', '.join(missing)}")
    torch, timm = bench.load_torch_and_timm()
    for kind, style in (("lora", "lae"), ("adapter", "timm"), ("prefix", "timm")):
        runner = bench.make_torch_runner(
            torch, timm, model="vit_tiny", kind=kind, batch=2, loss="aepg", style=style
        )
        before = {n: p.detach().clone() for n, p in runner.model.named_parameters()}
        times = bench.time_steps(runner, 2)
        assert len(times) == 2 and all(t > 0 for t in times)
        changed = {n for n, p in runner.model.named_parameters() if not torch.equal(p, before[n])}
        trainable = {n for n, p in runner.model.named_parameters() if p.requires_grad}
        assert changed and changed <= trainable  # the backbone stays frozen
        assert any(n.startswith("head.") for n in changed)
        assert any(n.startswith("blocks.0.attn.") for n in changed)  # PEFT in block 0 trains
        peft_names = ("lora_", "down.", "up.", "adapter_s", "prefix")
        assert all(
            n.startswith("head.") or any(f".attn.{m}" in n for m in peft_names) for n in trainable
        )


if __name__ == "__main__":
    sys.exit(pytest.main([__file__]))
