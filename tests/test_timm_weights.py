"""timm's `.safetensors` weights and `hf-hub:` ids: the same parameters and logits as the augreg
`.npz` of the same weights, one-line refusals at validation, offline resolution from the cache.

The fixtures come from tests/make_timm_fixture.py (one tiny random timm ViT, written by timm's
safetensors call and in the augreg `.npz` layout); no torch is needed here.
"""

import json
import os
import socket
import struct
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from test_input_files import _one_problem, _tiny_augreg_config
from tiny import tiny_config

from aepg_jax.checkpoints import augreg, hub, timm, weights
from aepg_jax.checkpoints import inspect as inspect_cli
from aepg_jax.config import schema
from aepg_jax.continual import trainer
from aepg_jax.models import vit

FIXTURES = Path(__file__).parent / "fixtures"
NPZ = FIXTURES / "timm_tiny_vit.npz"
SAFETENSORS = FIXTURES / "timm_tiny_vit.safetensors"
IO = FIXTURES / "timm_tiny_vit_io.npz"


@pytest.fixture(scope="module")
def io():
    with np.load(IO) as data:
        return {k.removeprefix("fixture/"): data[k] for k in data.files}


def _logits(cfg, params, head, images):
    params = {**params, "head": {"task_0": head}}
    logits, _ = vit.build(cfg, (head["bias"].shape[0],)).apply(
        {"params": params}, images, return_tokens=True
    )
    return logits


def test_both_formats_give_identical_parameters_and_logits(io):
    cfg = _tiny_augreg_config(NPZ).model
    init = vit.init_params(cfg, jax.random.key(0), (10,))
    from_npz = weights.load_backbone(os.fspath(NPZ), init)
    from_st = weights.load_backbone(os.fspath(SAFETENSORS), init)
    leaves_npz, tree_npz = jax.tree.flatten(from_npz)
    leaves_st, tree_st = jax.tree.flatten(from_st)
    assert tree_npz == tree_st
    for a, b in zip(leaves_npz, leaves_st, strict=True):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    # Every backbone leaf changed from its initial value (nothing left unloaded).
    assert not np.array_equal(
        from_st["Transformer"]["encoderblock_1"]["MultiHeadDotProductAttention_0"]["value"][
            "kernel"
        ],
        init["Transformer"]["encoderblock_1"]["MultiHeadDotProductAttention_0"]["value"]["kernel"],
    )
    # timm's head, from each file, and timm's own logits for the fixture's images.
    raw = timm.read_safetensors(SAFETENSORS)
    head_st = {"kernel": jnp.asarray(raw["head.weight"].T), "bias": jnp.asarray(raw["head.bias"])}
    with np.load(NPZ) as data:
        head_npz = {
            "kernel": jnp.asarray(data["head/kernel"]),
            "bias": jnp.asarray(data["head/bias"]),
        }
    images = jnp.asarray(io["images"])
    logits_npz = _logits(cfg, from_npz, head_npz, images)
    logits_st = _logits(cfg, from_st, head_st, images)
    np.testing.assert_array_equal(np.asarray(logits_npz), np.asarray(logits_st))
    np.testing.assert_allclose(logits_st, io["logits"], atol=1e-5, rtol=1e-5)


def test_a_safetensors_file_passes_validation_and_bad_ones_are_one_line(tmp_path):
    schema.validate(_tiny_augreg_config(SAFETENSORS))
    data = SAFETENSORS.read_bytes()
    truncated = tmp_path / "truncated.safetensors"
    truncated.write_bytes(data[: len(data) - 1000])
    message = _one_problem(_tiny_augreg_config(truncated))
    assert f"is truncated: expected {len(data)} bytes, file has {len(data) - 1000}" in message

    # A tensor renamed: named as missing (our name) and unexpected (timm's name).
    tensors = timm.read_safetensors(SAFETENSORS)
    tensors["blocks.1.mlp.fc9.weight"] = tensors.pop("blocks.1.mlp.fc1.weight")
    renamed = _save(tmp_path / "renamed.safetensors", tensors)
    message = _one_problem(_tiny_augreg_config(renamed))
    assert "missing Transformer/encoderblock_1/MlpBlock_0/Dense_0/kernel" in message
    assert "unexpected blocks.1.mlp.fc9.weight" in message

    # A wrong width (another model's file): the differing shape is named.
    cfg = _tiny_augreg_config(SAFETENSORS)
    cfg.model.mlp_dim = 64
    message = _one_problem(cfg)
    assert "not a timm ViT checkpoint" in message
    assert "MlpBlock_0/Dense_0/kernel (32, 128) (model (32, 64))" in message


def _save(path, tensors):
    from safetensors.numpy import save_file

    save_file({k: np.ascontiguousarray(v) for k, v in tensors.items()}, os.fspath(path))
    return path


def test_a_truncated_file_is_one_error_line_when_loaded(tmp_path):
    path = tmp_path / "t.safetensors"
    path.write_bytes(SAFETENSORS.read_bytes()[:5000])
    with pytest.raises(augreg.CheckpointError) as err:
        timm.read_safetensors(path)
    whole = len(SAFETENSORS.read_bytes())
    assert "\n" not in str(err.value)
    assert f"is truncated: expected {whole} bytes, file has 5000" in str(err.value)
    header_cut = tmp_path / "header_cut.safetensors"
    header_cut.write_bytes(SAFETENSORS.read_bytes()[:20])  # inside the header
    n = struct.unpack("<Q", SAFETENSORS.read_bytes()[:8])[0]
    with pytest.raises(augreg.CheckpointError, match=f"expected {8 + n} bytes, file has 20"):
        timm.read_safetensors(header_cut)
    header = json.dumps({"x": {"dtype": "F32", "shape": [4], "data_offsets": [0, 16]}}).encode()
    short = tmp_path / "short.safetensors"
    short.write_bytes(struct.pack("<Q", len(header)) + header + b"\0" * 8)
    expected = f"expected {8 + len(header) + 16} bytes, file has {8 + len(header) + 8}"
    with pytest.raises(augreg.CheckpointError, match=expected):
        timm.safetensor_shapes(short)


def _fake_cache(root: Path, repo_id: str) -> Path:
    """A Hugging Face cache holding `repo_id`'s model.safetensors as the hub client lays it out
    (blob named by its sha256, snapshot symlink, refs/main)."""
    repo = root / f"models--{repo_id.replace('/', '--')}"
    sha = weights.file_sha256(os.fspath(SAFETENSORS))
    (repo / "blobs").mkdir(parents=True)
    (repo / "blobs" / sha).write_bytes(SAFETENSORS.read_bytes())
    snapshot = repo / "snapshots" / "0123456789abcdef0123456789abcdef01234567"
    snapshot.mkdir(parents=True)
    (snapshot / "model.safetensors").symlink_to(Path("../../blobs") / sha)
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text(snapshot.name)
    return snapshot / "model.safetensors"


@pytest.fixture
def no_sockets(monkeypatch):
    def refuse(*args, **kwargs):
        raise AssertionError("a socket was opened")

    monkeypatch.setattr(socket, "socket", refuse)
    monkeypatch.setattr(socket, "create_connection", refuse)


def _hub_cache(tmp_path, monkeypatch) -> Path:
    pytest.importorskip("huggingface_hub")
    import huggingface_hub.constants

    cache = tmp_path / "hub"
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", os.fspath(cache))
    return cache


def test_an_hf_hub_id_resolves_from_the_local_cache_offline(tmp_path, monkeypatch, no_sockets):
    cache = _hub_cache(tmp_path, monkeypatch)
    repo_id = "timm/vit_tiny_fixture.augreg_in21k_ft_in1k"
    expected = _fake_cache(cache, repo_id)
    checkpoint = f"hf-hub:{repo_id}"
    assert weights.local_path(checkpoint) == os.fspath(expected)
    schema.validate(_tiny_augreg_config(checkpoint))
    info = weights.identify(checkpoint, weights.local_path(checkpoint))
    assert info["sha256"] == weights.file_sha256(os.fspath(SAFETENSORS))
    assert info["paper_weights"] is True
    assert "the paper's weights" in weights.describe(info)

    other = "hf-hub:timm/vit_tiny_fixture.augreg2_in21k_ft_in1k"
    _fake_cache(cache, other.removeprefix("hf-hub:"))
    info = weights.identify(other, weights.local_path(other))
    assert info["paper_weights"] is False and "NOT the paper's" in weights.describe(info)

    missing = _one_problem(_tiny_augreg_config("hf-hub:timm/vit_small_patch16_224.augreg_in1k"))
    assert "not in the local Hugging Face cache" in missing
    assert "hf download timm/vit_small_patch16_224.augreg_in1k model.safetensors" in missing
    untagged = _one_problem(_tiny_augreg_config("hf-hub:timm/vit_base_patch16_224"))
    assert "augreg2_in21k_ft_in1k" in untagged and hub.PAPER_ID in untagged


def test_without_huggingface_hub_an_id_is_one_line_with_the_command(monkeypatch):
    import builtins

    real_import = builtins.__import__

    def no_hub(name, *args, **kwargs):
        if name.startswith("huggingface_hub"):
            raise ImportError(name)
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_hub)
    message = _one_problem(_tiny_augreg_config(f"hf-hub:{hub.PAPER_ID}"))
    assert "bash scripts/install.sh hub" in message
    assert f"hf download {hub.PAPER_ID} model.safetensors" in message


def test_inspect_reads_a_safetensors_file(capsys):
    assert inspect_cli.main([os.fspath(SAFETENSORS)]) == 0
    out = capsys.readouterr().out
    assert "format:      timm safetensors" in out
    assert "loads:       yes" in out
    assert "Transformer/encoderblock_0/MultiHeadDotProductAttention_0/query/kernel" in out


def test_a_run_from_an_hf_hub_id_says_which_weights_and_records_the_sha256(
    tmp_path, monkeypatch, capsys
):
    repo_id = "timm/vit_tiny_fixture.augreg2_in21k_ft_in1k"
    _fake_cache(_hub_cache(tmp_path, monkeypatch), repo_id)
    cfg = tiny_config(tmp_path / "cache", **{"data.num_tasks": 2, "max_steps_per_task": 2})
    fixture = _tiny_augreg_config(SAFETENSORS)
    cfg.model.update(fixture.model.to_dict())
    cfg.model.checkpoint = f"hf-hub:{repo_id}"
    cfg.data.store_size = fixture.data.store_size
    trainer.run(cfg, os.fspath(tmp_path / "run"))
    assert "augreg2_in21k_ft_in1k, NOT the paper's weights" in capsys.readouterr().out
    with open(tmp_path / "run" / "results.json") as f:
        source = json.load(f)["backbone_source"]
    assert source["sha256"] == weights.file_sha256(os.fspath(SAFETENSORS))
    assert source["format"] == "timm safetensors" and source["paper_weights"] is False
