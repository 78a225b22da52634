"""Tests for aepg_jax.checkpoints: augreg .npz loading, timm parity, errors, inspect CLI.

The fixtures come from tests/make_timm_fixture.py (a tiny random timm ViT written in the
augreg layout, checked there against timm's own loader); no torch is needed here.
"""

from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from aepg_jax.checkpoints import augreg
from aepg_jax.checkpoints import inspect as inspect_cli
from aepg_jax.models import partition, vit

FIXTURES = Path(__file__).parent / "fixtures"
WEIGHTS = FIXTURES / "timm_tiny_vit.npz"
IO = FIXTURES / "timm_tiny_vit_io.npz"


@pytest.fixture(scope="module")
def io():
    with np.load(IO) as data:
        return {k.removeprefix("fixture/"): data[k] for k in data.files}


@pytest.fixture(scope="module")
def weights():
    return augreg.read_npz(WEIGHTS)


def _config(io, kind="none", image_size=None):
    fields = {
        k: int(io[k])
        for k in ("patch_size", "hidden_size", "depth", "num_heads", "mlp_dim", "image_size")
    }
    if image_size:
        fields["image_size"] = image_size
    return vit.model_config("vit_tiny", peft={"kind": kind}, **fields)


def _init(io, kind="none", image_size=None, seed=0):
    cfg = _config(io, kind, image_size)
    return cfg, vit.init_params(cfg, jax.random.key(seed), (int(io["num_classes"]),))


def _write(path, arrays):
    with open(path, "wb") as f:
        np.savez(f, **arrays)
    return path


def test_matches_timm_outputs(io, weights):
    cfg, params = _init(io)
    params = augreg.load_backbone(WEIGHTS, params)
    # The converter ignores the file's head (we train our own); put timm's in for the check.
    params["head"]["task_0"] = {
        "kernel": jnp.asarray(weights["head/kernel"]),
        "bias": jnp.asarray(weights["head/bias"]),
    }
    logits, out = vit.build(cfg, (10,)).apply(
        {"params": params}, jnp.asarray(io["images"]), return_tokens=True
    )
    np.testing.assert_allclose(out["tokens"], io["tokens"], atol=1e-5, rtol=1e-5)
    np.testing.assert_allclose(out["features"], io["features"], atol=1e-5, rtol=1e-5)
    np.testing.assert_allclose(logits, io["logits"], atol=1e-5, rtol=1e-5)


def test_every_backbone_leaf_comes_from_the_file(io, weights):
    _, params = _init(io)
    loaded = augreg.load_backbone(WEIGHTS, params)
    renamed = augreg.to_linen_names(weights)
    labels = partition.label_params(params)
    flat = {"/".join(k): v for k, v in partition._flat(loaded).items()}
    for name, label in {"/".join(k): v for k, v in partition._flat(labels).items()}.items():
        if label == partition.BACKBONE:
            np.testing.assert_array_equal(flat[name], renamed[name], err_msg=name)
    mha = "Transformer/encoderblock_1/MultiHeadDotProductAttention_1/query/kernel"
    np.testing.assert_array_equal(flat[mha.replace("_1/query", "_0/query")], weights[mha])


@pytest.mark.parametrize("kind", ["lora", "adapter", "prefix"])
def test_peft_and_head_keep_their_initial_values(io, kind):
    _, params = _init(io, kind, seed=3)
    loaded = augreg.load_backbone(WEIGHTS, params)
    labels = partition.label_params(params)
    kept, _ = partition.split(loaded, labels, partition.TRAINABLE)
    before, _ = partition.split(params, labels, partition.TRAINABLE)
    jax.tree.map(np.testing.assert_array_equal, kept, before)


@pytest.mark.parametrize("prefix", ["params/", "opt/target/"])
def test_container_prefixes(io, weights, tmp_path, prefix):
    path = _write(tmp_path / "prefixed.npz", {prefix + k: v for k, v in weights.items()})
    _, params = _init(io)
    jax.tree.map(
        np.testing.assert_array_equal,
        augreg.load_backbone(path, params),
        augreg.load_backbone(WEIGHTS, params),
    )


def test_linen_named_file_and_pre_logits(io, weights, tmp_path):
    """A file already in Linen names loads unchanged; `pre_logits` (original ViT) is ignored."""
    linen = dict(augreg.to_linen_names(weights))
    linen["pre_logits/kernel"] = np.zeros((32, 32), np.float32)
    linen["pre_logits/bias"] = np.zeros((32,), np.float32)
    path = _write(tmp_path / "linen.npz", linen)
    assert not augreg.is_pre_linen(augreg.read_npz(path))
    _, params = _init(io)
    jax.tree.map(
        np.testing.assert_array_equal,
        augreg.load_backbone(path, params),
        augreg.load_backbone(WEIGHTS, params),
    )


def test_position_embedding_is_resized_for_another_image_size(io, weights):
    cfg, params = _init(io, image_size=48)  # grid 4x4 in the file -> 6x6
    loaded = augreg.load_backbone(WEIGHTS, params)
    pos = loaded["Transformer"]["posembed_input"]["pos_embedding"]
    original = weights["Transformer/posembed_input/pos_embedding"]
    assert pos.shape == (1, 37, 32)
    np.testing.assert_array_equal(pos[:, :1], original[:, :1])  # cls slot kept
    grid = original[0, 1:].reshape(4, 4, 32)
    expected = jax.image.resize(grid, (6, 6, 32), "cubic").reshape(36, 32)
    np.testing.assert_allclose(pos[0, 1:], expected, rtol=1e-6, atol=1e-6)
    logits, _ = vit.build(cfg, (10,)).apply({"params": loaded}, jnp.zeros((2, 48, 48, 3)))
    assert logits.shape == (2, 10)


def test_missing_file():
    with pytest.raises(augreg.CheckpointError, match="does not exist"):
        augreg.read_npz("/nonexistent/B_16.npz")


def test_truncated_file(tmp_path, io):
    data = WEIGHTS.read_bytes()
    path = tmp_path / "truncated.npz"
    path.write_bytes(data[: len(data) // 2])
    _, params = _init(io)
    with pytest.raises(augreg.CheckpointError, match=r"not a readable \.npz file.*truncated"):
        augreg.load_backbone(path, params)


def test_renamed_key_is_reported_as_missing_and_unexpected(tmp_path, io, weights):
    broken = dict(weights)
    old = "Transformer/encoderblock_1/MlpBlock_3/Dense_0/kernel"
    broken[old.replace("Dense_0", "Dense_9")] = broken.pop(old)
    path = _write(tmp_path / "renamed.npz", broken)
    _, params = _init(io)
    with pytest.raises(augreg.CheckpointError) as err:
        augreg.load_backbone(path, params)
    message = str(err.value)
    assert "1 missing: Transformer/encoderblock_1/MlpBlock_0/Dense_0/kernel" in message
    assert "1 unexpected: Transformer/encoderblock_1/MlpBlock_0/Dense_9/kernel" in message


def test_wrong_architecture_is_a_shape_mismatch(io):
    cfg = _config(io)
    cfg.mlp_dim = 96
    params = vit.init_params(cfg, jax.random.key(0))
    with pytest.raises(
        augreg.CheckpointError,
        match=r"shape mismatch.*Dense_0/kernel: file "
        r"\(32, 128\) vs model \(32, 96\)",
    ):
        augreg.load_backbone(WEIGHTS, params)


def test_missing_block_is_reported(tmp_path, io, weights):
    cfg = _config(io)
    cfg.depth = 3
    params = vit.init_params(cfg, jax.random.key(0))
    with pytest.raises(augreg.CheckpointError, match=r"16 missing: Transformer/encoderblock_2"):
        augreg.load_backbone(WEIGHTS, params)


def test_infer_model_fields(io):
    assert augreg.infer_model_fields(WEIGHTS) == {
        "patch_size": 8,
        "hidden_size": 32,
        "num_channels": 3,
        "depth": 2,
        "num_heads": 2,
        "mlp_dim": 128,
        "image_size": 32,
    }


def test_inspect_cli(capsys, tmp_path):
    assert inspect_cli.main([str(WEIGHTS)]) == 0
    out = capsys.readouterr().out
    assert "naming:      pre-Linen (renamed on load)" in out
    assert "ignored:     head/bias, head/kernel" in out
    assert "loads:       yes" in out
    assert inspect_cli.main([str(WEIGHTS), "--image-size", "48"]) == 0
    assert "image_size=48" in capsys.readouterr().out

    truncated = tmp_path / "t.npz"
    truncated.write_bytes(WEIGHTS.read_bytes()[:1000])
    assert inspect_cli.main([str(truncated)]) == 1
    assert "not a readable .npz file" in capsys.readouterr().err


def test_inspect_cli_reports_an_incomplete_file(capsys, tmp_path, weights):
    partial = {k: v for k, v in weights.items() if "encoder_norm" not in k}
    path = _write(tmp_path / "partial.npz", partial)
    assert inspect_cli.main([str(path)]) == 1
    assert "loads:       NO" in capsys.readouterr().out
