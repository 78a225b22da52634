"""Model families (vit, dinov2, clip) against timm, named published weights, the inspect tool's
features, and short runs of each family on the embedded data.

Fixtures: tests/make_timm_family_fixtures.py (tiny random timm DINOv2 and CLIP models, made by
timm's own model functions) and tests/make_timm_fixture.py (the standard ViT); no torch here.
"""

import json
import os
from pathlib import Path

import jax
import numpy as np
import pytest
from test_input_files import _one_problem
from tiny import tiny_config

from aepg_jax.checkpoints import catalog, weights
from aepg_jax.checkpoints import inspect as inspect_cli
from aepg_jax.config import schema
from aepg_jax.continual import trainer
from aepg_jax.data import augment
from aepg_jax.models import vit

FIXTURES = Path(__file__).parent / "fixtures"
FILES = {
    "vit": FIXTURES / "timm_tiny_vit.safetensors",
    "dinov2": FIXTURES / "timm_tiny_dinov2.safetensors",
    "clip": FIXTURES / "timm_tiny_clip.safetensors",
}
ARCH = ("patch_size", "hidden_size", "depth", "num_heads", "mlp_dim", "image_size")


def _io(family):
    name = "timm_tiny_vit_io.npz" if family == "vit" else f"timm_tiny_{family}_io.npz"
    with np.load(FIXTURES / name) as data:
        return {k.removeprefix("fixture/"): data[k] for k in data.files}


def _config(family, checkpoint=None, **peft):
    io = _io(family)
    c = schema.base_config("vit_tiny")
    c.model.update({k: int(io[k]) for k in ARCH})
    c.model.family = family
    c.model.peft.blocks = tuple(range(int(io["depth"])))
    c.model.peft.update(peft)
    c.model.init = "augreg"
    c.model.checkpoint = os.fspath(checkpoint or FILES[family])
    c.data.store_size = int(io["image_size"])
    return c


@pytest.mark.parametrize("family", list(FILES))
def test_features_equal_timms_pre_logits(family):
    io = _io(family)
    cfg = _config(family).model
    params = weights.load_backbone(
        os.fspath(FILES[family]), vit.init_params(cfg, jax.random.key(0))
    )
    _, out = vit.build(cfg).apply({"params": params}, io["images"])
    np.testing.assert_allclose(out["features"], io["features"], atol=1e-5, rtol=1e-5)
    # The inspect tool gives the same features (image size from the images).
    feats = inspect_cli.features(os.fspath(FILES[family]), io["images"], family, num_heads=2)
    np.testing.assert_allclose(feats, io["features"], atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("family", ["dinov2", "clip"])
@pytest.mark.parametrize(
    "peft", [dict(kind="lora"), dict(kind="adapter"), dict(kind="prefix")], ids=str
)
def test_peft_modules_train_on_every_family(family, peft):
    """Each PEFT kind adds its parameters and changes the features once they are non-zero."""
    io = _io(family)
    cfg = _config(family, **peft).model
    params = weights.load_backbone(
        os.fspath(FILES[family]), vit.init_params(cfg, jax.random.key(0))
    )
    flat = jax.tree_util.tree_leaves_with_path(params)
    kind = peft["kind"]
    peft_leaves = [p for p, _ in flat if any(getattr(k, "key", None) == kind for k in p)]
    assert peft_leaves, f"no {kind} parameters in the {family} model"
    model = vit.build(cfg)
    bumped = jax.tree_util.tree_map_with_path(
        lambda p, x: x + 0.05 if any(getattr(k, "key", None) == kind for k in p) else x, params
    )
    base = model.apply({"params": params}, io["images"])[1]["features"]
    moved = model.apply({"params": bumped}, io["images"])[1]["features"]
    assert np.all(np.isfinite(moved)) and not np.allclose(base, moved)


@pytest.mark.parametrize(
    "file_family,model_family", [("clip", "vit"), ("dinov2", "vit"), ("vit", "clip")]
)
def test_a_file_of_another_family_is_refused_at_validation_in_one_line(file_family, model_family):
    cfg = _config(file_family)
    cfg.model.family = model_family
    message = _one_problem(cfg)
    assert f"holds a {file_family}-family ViT" in message
    assert f"set model.family={file_family}" in message


def test_an_unknown_family_and_weights_are_refused_in_one_line():
    cfg = _config("vit")
    cfg.model.family = "swin"
    with pytest.raises(ValueError, match=r"model.family='swin': use one of"):
        schema.validate(cfg)
    cfg = _config("vit")
    cfg.model.weights = "vit_huge.nothing"
    with pytest.raises(ValueError, match=r"model.weights='vit_huge.nothing' is unknown"):
        schema.validate(cfg)
    cfg = _config("vit")
    cfg.model.weights = "vit_base_patch16_clip_224.openai"
    with pytest.raises(ValueError, match=r"clip-family backbone.*set model.family=clip"):
        schema.validate(cfg)


def test_the_catalog_names_every_family_and_a_known_normalisation():
    assert {w.family for w in catalog.WEIGHTS.values()} == set(vit.FAMILIES)
    for w in catalog.WEIGHTS.values():
        assert w.normalize in augment.NORMALIZE_MODES
        assert w.hub_id == f"timm/{w.name}" and "." in w.name
    assert catalog.WEIGHTS["vit_base_patch16_clip_224.openai"].normalize == "clip"
    assert catalog.WEIGHTS["vit_base_patch14_dinov2.lvd142m"].patch_size == 14


def test_mean_std_normalisation_is_per_channel():
    pixels = np.full((1, 2, 2, 3), 255.0, np.float32)
    mean, std = augment.MEAN_STD["clip"]
    expected = (1.0 - np.asarray(mean)) / np.asarray(std)
    np.testing.assert_allclose(augment.normalize(pixels, "clip")[0, 0, 0], expected, rtol=1e-6)


def test_inspect_cli_writes_features_and_refuses_a_wrong_family(tmp_path, capsys):
    io = _io("clip")
    images = tmp_path / "images.npy"
    np.save(images, io["images"])
    out = tmp_path / "features.npy"
    argv = [os.fspath(FILES["clip"]), "--family=clip", f"--features={images}", f"--save={out}"]
    assert inspect_cli.main([*argv, "--num-heads=2"]) == 0
    np.testing.assert_allclose(np.load(out), io["features"], atol=1e-5, rtol=1e-5)
    assert inspect_cli.main([os.fspath(FILES["clip"]), "--family=vit", f"--features={images}"])
    err = capsys.readouterr().err
    assert "holds a clip-family ViT" in err and "--family=clip" in err and err.count("\n") == 1
    assert inspect_cli.main([os.fspath(FILES["dinov2"]), "--num-heads=2"]) == 0
    assert "family:      dinov2" in capsys.readouterr().out


@pytest.mark.parametrize(
    "family,name",
    [("clip", "vit_base_patch16_clip_224.openai"), ("dinov2", "vit_base_patch14_dinov2.lvd142m")],
)
def test_a_short_run_of_each_family_names_its_weights_and_sha256(tmp_path, family, name, capsys):
    cfg = tiny_config(tmp_path / "cache", **{"data.num_tasks": 2, "max_steps_per_task": 2})
    fixture = _config(family)
    cfg.model.update(fixture.model.to_dict())
    cfg.model.weights = name
    cfg.input.normalize = catalog.WEIGHTS[name].normalize
    cfg.data.store_size = fixture.data.store_size
    trainer.run(cfg, os.fspath(tmp_path / "run"))
    assert f"{name} ({family} family" in capsys.readouterr().out
    with open(tmp_path / "run" / "results.json") as f:
        results = json.load(f)
    source = results["backbone_source"]
    assert source["name"] == name and source["family"] == family
    assert source["sha256"] == weights.file_sha256(os.fspath(FILES[family]))
    assert np.isfinite(results["A_T"])
