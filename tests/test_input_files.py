"""Weights and split files named by a config are checked at validation, before any data work:
one line each, with the paper's weights file name and its public URL."""

import os
import subprocess
import sys
from pathlib import Path

import jax
import layout_npz
import numpy as np
import pytest
from flax import traverse_util

from aepg_jax.config import input_files, schema
from aepg_jax.models import partition, vit
from aepg_jax.system import cli

ROOT = Path(__file__).resolve().parents[1]
WEIGHTS = ROOT / "tests" / "fixtures" / "timm_tiny_vit.npz"  # a real augreg-layout file


def _tiny_augreg_config(checkpoint):
    with np.load(ROOT / "tests" / "fixtures" / "timm_tiny_vit_io.npz") as io:
        fields = {
            k: int(io[f"fixture/{k}"])
            for k in ("patch_size", "hidden_size", "depth", "num_heads", "mlp_dim", "image_size")
        }
    c = schema.base_config("vit_tiny")
    c.model.update(fields)
    c.model.peft.blocks = tuple(range(fields["depth"]))
    c.model.init = "augreg"
    c.model.checkpoint = None if checkpoint is None else os.fspath(checkpoint)
    c.data.store_size = fields["image_size"]
    return c


def _one_problem(cfg) -> str:
    with pytest.raises(ValueError) as err:
        schema.validate(cfg)
    message = str(err.value)
    assert message.startswith("Invalid config: ") and "\n" not in message
    assert message.count("model.checkpoint") == 1, message
    return message


def test_the_layout_table_is_the_models_backbone():
    cfg = _tiny_augreg_config(WEIGHTS)
    shapes = jax.eval_shape(lambda: vit.init_params(cfg.model, jax.random.key(0), (3,)))
    labels = traverse_util.flatten_dict(partition.label_params(shapes), sep="/")
    flat = traverse_util.flatten_dict(shapes, sep="/")
    backbone = {k: flat[k].shape for k, label in labels.items() if label == partition.BACKBONE}
    table = input_files.backbone_shapes(cfg.model)
    assert table.keys() == backbone.keys()
    for key, shape in table.items():
        assert len(shape) == len(backbone[key])
        assert all(s is None or s == b for s, b in zip(shape, backbone[key], strict=True))


def test_a_real_augreg_file_passes_and_other_files_are_refused_in_one_line(tmp_path):
    schema.validate(_tiny_augreg_config(WEIGHTS))  # the timm-made augreg layout: accepted
    for checkpoint, expected in (
        (None, "needs model.checkpoint"),
        (tmp_path / "absent.npz", "does not exist"),
        (tmp_path / "page.npz", "not a readable .npz"),
        (layout_npz.paper_layout(), "not an augreg ViT checkpoint of the configured model"),
    ):
        if checkpoint == tmp_path / "page.npz":
            checkpoint.write_text("<html>403 Forbidden</html>")
        message = _one_problem(_tiny_augreg_config(checkpoint))
        assert expected in message, message
        assert input_files.AUGREG_FILE in message and input_files.AUGREG_URL in message
    # A B/16-shaped key list: accepted by the paper configs' model, shapes named otherwise.
    paper = schema.base_config("vit_b16")
    paper.model.init, paper.model.checkpoint = "augreg", layout_npz.paper_layout()
    assert input_files.checkpoint_problem(paper.model.checkpoint, paper.model) is None
    wrong = layout_npz.augreg_shapes(vit.model_config("vit_b16"))
    del wrong["Transformer/encoderblock_11/MlpBlock_3/Dense_1/bias"]
    path = layout_npz.write_layout_npz(tmp_path / "eleven.npz", wrong)
    problem = input_files.checkpoint_problem(path, paper.model)
    assert "missing Transformer/encoderblock_11/MlpBlock_0/Dense_1/bias" in problem


def test_split_file_must_exist_and_go_with_a_folder(tmp_path):
    c = schema.base_config("vit_tiny")
    c.data.split_file = str(tmp_path / "l2p_split.json")
    with pytest.raises(ValueError, match=r"data\.split_file=.*folder only"):
        schema.validate(c)
    c.data.source, c.data.data_dir = "folder", str(tmp_path)
    with pytest.raises(ValueError, match=r"data\.split_file=.*does not exist"):
        schema.validate(c)


def test_a_paper_run_without_its_weights_stops_at_validation_with_the_url(tmp_path):
    """Through `python -m aepg_jax.main`: refused before the (absent) data is looked at."""
    absent = tmp_path / input_files.AUGREG_FILE
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "aepg_jax.main",
            "--config=configs/imagenet_r.py",
            f"--config.model.checkpoint={absent}",
            f"--config.data.data_dir={tmp_path / 'no_data_here'}",
            f"--workdir={tmp_path / 'run'}",
        ],
        capture_output=True,
        text=True,
        cwd=ROOT,
        env={**os.environ, "JAX_PLATFORMS": "cpu"},
        timeout=300,
    )
    lines = [line for line in out.stderr.splitlines() if line.strip()]
    assert out.returncode == cli.EXIT_USER_ERROR, out.stderr[-2000:]
    assert len(lines) == 1 and lines[0].startswith("error: "), lines
    assert f"model.checkpoint={absent} does not exist" in lines[0]
    assert input_files.AUGREG_URL in lines[0]
    assert "no_data_here" not in lines[0]  # the data were never looked at
