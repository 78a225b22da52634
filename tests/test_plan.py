"""`aepg_jax.plan`: the run's programs compiled for targets without them.

CI (no compile, no extra): the run's call counts, the known datasets' task split, FLOPs per
image against an analytic count, a bad target's error line. Slow, on the host CPU as the
target: multi-seed temporaries and FLOPs, the printed tables, bf16 LoRA gradients all-reduced
in f32 on 8 devices. Slow, needing the `aot` extra (skipped without it): the tiny ViT compiled
for a TPU slice and an H100, a 4-host TPU slice with the mesh over all its processes, an
oversized run refused with exit code 2 and one line.
"""

import importlib.util
import json
import os
import pathlib
import subprocess
import sys
import textwrap

import pytest
import tiny

ROOT = pathlib.Path(__file__).resolve().parents[1]


def _installed(module: str) -> bool:
    """Whether `module` can be imported (find_spec of a submodule raises when its parent is
    missing: `jax_plugins` exists only once a plugin is installed)."""
    try:
        return importlib.util.find_spec(module) is not None
    except ModuleNotFoundError:
        return False


HAS_TPU = _installed("libtpu")
HAS_GPU = _installed("jax_plugins.xla_cuda13")
needs_tpu = pytest.mark.skipif(not HAS_TPU, reason="needs the aot extra (libtpu)")
needs_gpu = pytest.mark.skipif(not HAS_GPU, reason="needs the aot extra (jax-cuda13-plugin)")


def _cfg(tmp_path, **overrides):
    return tiny.tiny_config(tmp_path, **overrides)


# A ViT tiny in depth (2) and tokens (17) but wide, so that matmuls are >98% of its FLOPs
# (at width 32 the elementwise work is a quarter of them).
WIDE = {"model.hidden_size": 1024, "model.mlp_dim": 4096, "model.num_heads": 4}


def analytic_flops(cfg, classes: int) -> float:
    """Matmul FLOPs per image of a train step: forward, plus the backward to the activations
    and the trainable leaves (LoRA A, B and the head), nothing into frozen weights or before
    the first LoRA block (whose queries and input need no gradient)."""
    m = cfg.model
    d, mlp, depth, r = m.hidden_size, m.mlp_dim, m.depth, m.peft.lora_rank
    patches = (m.image_size // m.patch_size) ** 2
    n = patches + 1
    lora = sorted(b for b in m.peft.blocks if b < depth)
    fwd = 2 * patches * m.patch_size**2 * 3 * d  # patch embedding
    fwd += depth * (8 * n * d * d + 4 * n * d * mlp + 4 * n * n * d)  # qkv, out, mlp, attention
    fwd += len(lora) * 2 * (4 * n * d * r) + 2 * d * classes  # LoRA on K and V; head (cls)
    bwd = 4 * d * classes
    for b in range(lora[0], depth):
        bwd += 4 * n * d * mlp + 2 * n * d * d  # MLP and output projection
        if b == lora[0]:  # dS, dK, dV; LoRA dB, dh, dA per branch
            bwd += 6 * n * n * d + 2 * 6 * n * d * r
        else:  # dS, dQ, dK, dV; q/k/v input; LoRA dB, dh, dA, dx per branch
            bwd += 8 * n * n * d + 6 * n * d * d + 2 * 8 * n * d * r
    return fwd + bwd


def test_calls_follow_the_runs_step_counts(tmp_path):
    from aepg_jax.plan import project, shapes

    run = shapes.shape_run(_cfg(tmp_path))  # 3 digits tasks, 8 steps each, 2 of 4 epochs frozen
    calls = project.calls(run)
    assert calls["train task 1"] == 8
    assert calls["train task 3 head-only"] == 2 * 4  # tasks 2 and 3: int(8 * 2 / 4) each
    assert calls["train task 3"] == 2 * 4
    tests = [len(t.test_indices) for t in run.data.tasks.tasks]
    assert sum(tests) == 360  # digits' 20% split
    per_task = [-(-n // 64) for n in tests]  # eval.batch_size 64, padded
    assert calls["eval after task 3"] == per_task[0] * 3 + per_task[1] * 2 + per_task[2]


def test_known_dataset_sizes_give_the_papers_task_split(tmp_path):
    from aepg_jax.config.schema import from_file
    from aepg_jax.plan import project, shapes

    cfg = from_file(str(ROOT / "configs/imagenet_r.py"), "tasks=10,method=lae")
    data = shapes.run_data(cfg)
    assert [len(t.train_indices) for t in data.tasks.tasks] == [2400] * 10
    assert list(data.tasks.head_sizes) == [20] * 10
    cfg.model.depth, cfg.model.peft.blocks = 1, (0,)  # the counts need no ViT-B trees
    calls = project.calls(shapes.shape_run(cfg))
    assert calls["train task 1"] == 9 * 50  # 2400 // 256 steps x 50 epochs


def test_host_flops_per_image_match_the_analytic_count(tmp_path):
    from aepg_jax.plan import programs, shapes

    cfg = _cfg(tmp_path, **WIDE)
    run = shapes.shape_run(cfg)
    program = programs.train_programs(run)[0]
    per_image = program.host_flops / program.images
    want = analytic_flops(cfg, run.head_sizes[0])
    assert per_image == pytest.approx(want, rel=0.02)


@pytest.mark.slow
def test_two_seeds_need_more_temporaries_and_the_same_flops_per_seed(tmp_path):
    from aepg_jax.plan import analysis, programs, shapes, targets

    host = targets.parse("cpu")
    costs = []
    for seeds in (1, 2):
        run = shapes.shape_run(_cfg(tmp_path, num_seeds=seeds))
        program = programs.train_programs(run)[0]
        costs.append((analysis.compile_cost(program, host), program.images))
    (one, images_one), (two, images_two) = costs
    assert images_two == 2 * images_one
    assert two.temp > one.temp
    assert two.flops / images_two == pytest.approx(one.flops / images_one, rel=1e-3)


def _plan(args, cwd, timeout=900):
    return subprocess.run(
        [sys.executable, "-m", "aepg_jax.plan", *args],
        capture_output=True,
        text=True,
        cwd=cwd,
        timeout=timeout,
        env={**os.environ, "ALLOW_MULTIPLE_LIBTPU_LOAD": "1"},
    )


def _config_arg(tmp_path, **overrides):
    return f"--config={tiny.write_spec(tmp_path / 'spec.json', tmp_path, overrides)}"


def test_a_bad_target_is_one_error_line(tmp_path):
    r = _plan([_config_arg(tmp_path), "--target=tpu:v9:2x2"], ROOT)
    assert r.returncode == 2, r.stderr
    lines = [line for line in r.stderr.splitlines() if line.startswith("error:")]
    assert len(lines) == 1 and "--target=tpu:v9:2x2 is not a target" in lines[0], r.stderr


@pytest.mark.slow
def test_the_host_target_prints_the_tables_and_a_projection(tmp_path):
    r = _plan([_config_arg(tmp_path), "--target=cpu"], ROOT)
    assert r.returncode == 0, r.stderr
    for name in ("train task 1 (x8)", "train task 3 head-only (x8)", "eval after task 3"):
        assert name in r.stdout
    assert "whole run:" in r.stdout and "at 40% MFU" in r.stdout


@pytest.mark.slow
@needs_tpu
@needs_gpu
def test_tiny_vit_compiles_for_a_tpu_slice_and_an_h100(tmp_path):
    # A fresh process: the CUDA plugin offers compile-only GPUs only under JAX_PLATFORMS=cpu.
    script = textwrap.dedent(
        f"""
        import json, pathlib, sys
        sys.path.insert(0, {str(ROOT / "tests")!r})
        import tiny
        from aepg_jax.plan import analysis, programs, shapes, targets
        cfg = tiny.tiny_config(pathlib.Path({str(tmp_path)!r}), **{WIDE!r})
        program = programs.train_programs(shapes.shape_run(cfg))[0]
        for spec in ("tpu:v5e:2x2", "gpu:h100x2"):
            c = analysis.compile_cost(program, targets.parse(spec))
            print(json.dumps([spec, c.argument, c.peak, c.flops / c.images,
                              sorted(map(list, c.collectives))]))
        """
    )
    env = {**os.environ, "JAX_PLATFORMS": "cpu", "ALLOW_MULTIPLE_LIBTPU_LOAD": "1"}
    r = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, cwd=ROOT, env=env
    )
    assert r.returncode == 0, r.stderr[-3000:]
    rows = [json.loads(line) for line in r.stdout.splitlines() if line.startswith("[")]
    assert [row[0] for row in rows] == ["tpu:v5e:2x2", "gpu:h100x2"]
    want = analytic_flops(tiny.tiny_config(tmp_path, **WIDE), 4)  # task 1: digits 0-3
    for spec, argument, peak, flops_per_image, collectives in rows:
        assert argument > 0 and peak > 0, spec  # (TPU: temporaries may fit in VMEM)
        assert flops_per_image == pytest.approx(want, rel=0.02), spec
        assert ["all-reduce", "f32"] in collectives, (spec, collectives)


@pytest.mark.slow
@needs_tpu
def test_a_multi_host_tpu_slice_compiles_over_all_its_processes(tmp_path):
    import numpy as np
    from jax.sharding import Mesh

    from aepg_jax.plan import programs, shapes, targets

    target = targets.parse("tpu:v5e:4x4")
    assert target.hosts == 4 and target.num_devices == 16
    run = shapes.shape_run(_cfg(tmp_path))
    program = programs.train_programs(run)[0]
    mesh = Mesh(np.asarray(target.devices), ("data",))
    compiled = program.lower(mesh).compile()
    batch_sharding = compiled.input_shardings[0][2]["image"]
    assert {d.process_index for d in batch_sharding.device_set} == {0, 1, 2, 3}
    assert len(batch_sharding.device_set) == 16
    assert "all-reduce" in compiled.as_text()


@pytest.mark.slow
@needs_tpu
def test_an_oversized_run_exits_2_with_one_line(tmp_path):
    # A tiny ViT at 224 px (1,025 tokens of width 32) at batch 4096 needs far more than 16 GiB.
    overrides = {
        "model.image_size": 224,
        "model.patch_size": 7,
        "data.store_size": 224,
        "optim.batch_size": 4096,
        "eval.batch_size": 64,
    }
    args = [
        _config_arg(tmp_path, **overrides),
        "--target=tpu:v5e:1x1",
        "--num_train=50000",
        "--num_test=1000",
        "--num_classes=10",
    ]
    r = _plan(args, ROOT)
    assert r.returncode == 2, r.stdout + r.stderr
    lines = [line for line in r.stderr.splitlines() if line.startswith("error:")]
    assert len(lines) == 1, r.stderr
    assert "train task 1 does not fit on v5e-1" in lines[0] and "optim.batch_size" in lines[0]


@pytest.mark.slow
@pytest.mark.parametrize("peft", ["lora", "adapter", "prefix", "inflora"])
def test_bf16_peft_gradients_are_all_reduced_in_float32(tmp_path, peft):
    """On 8 forced CPU devices, in the HLO right after SPMD partitioning (later CPU passes turn
    every bfloat16 reduction into float32, hiding it): no bfloat16 all-reduce in the step.
    `inflora`: the method's own current-task LoRA pair (B_t), the model's PEFT off."""
    dump = tmp_path / "dump"
    overrides = {"model.dtype": "bfloat16", "model.peft.kind": peft}
    if peft == "inflora":
        overrides.update({"method.name": "inflora", "model.peft.kind": "none"})
    script = textwrap.dedent(
        f"""
        import os, sys, glob
        os.environ["XLA_FLAGS"] = ("--xla_force_host_platform_device_count=8 "
            "--xla_dump_to={dump} --xla_dump_hlo_pass_re=spmd-partitioning")
        os.environ["JAX_PLATFORMS"] = "cpu"
        import jax, numpy as np, pathlib
        from jax.sharding import Mesh
        sys.path.insert(0, {str(ROOT)!r})
        sys.path.insert(0, {str(ROOT / "tests")!r})
        import tiny
        from aepg_jax.plan import analysis, programs, shapes
        overrides = {overrides!r}
        cfg = tiny.tiny_config(pathlib.Path({str(tmp_path)!r}), **overrides)
        program = programs.train_programs(shapes.shape_run(cfg))[0]
        program.lower(Mesh(np.asarray(jax.devices()), ("data",))).compile()
        (path,) = glob.glob("{dump}/*jit_run_step*after_spmd-partitioning*")
        print(sorted(analysis.collectives(open(path).read())))
        """
    )
    r = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, cwd=ROOT)
    assert r.returncode == 0, r.stderr
    kinds = r.stdout.strip().splitlines()[-1]
    assert "('all-reduce', 'f32')" in kinds and "bf16" not in kinds, kinds


def test_pilot_folder_sizes_and_class_order_give_pilots_task_split(tmp_path):
    """data.source=folder keyed by data.name: ImageNet-A's 200 classes in PILOT's 10 tasks, the
    classes in PILOT's order (numpy_legacy, seed 1993)."""
    from aepg_jax.config.schema import from_file
    from aepg_jax.plan import shapes

    cfg = from_file(str(ROOT / "configs/imagenet_r.py"), "tasks=10,method=lae")
    cfg.data.source, cfg.data.name, cfg.data.data_dir = "folder", "imagenet_a", str(tmp_path)
    cfg.data.class_order_seed, cfg.data.class_order_rng = 1993, "numpy_legacy"
    data = shapes.run_data(cfg)
    assert list(data.tasks.head_sizes) == [20] * 10
    assert sum(len(t.train_indices) for t in data.tasks.tasks) == 5_981
    assert sum(len(t.test_indices) for t in data.tasks.tasks) == 1_519
    assert data.tasks.class_order[:4].tolist() == [168, 136, 51, 9]  # PILOT's logged order
