"""Regenerates the pretrained backbone shipped with the package (`aepg_jax/assets/`).

    .venv/bin/python scripts/make_shipped_backbone.py [--config=configs/default.py]

Pretrains the config's backbone with the project's own pretraining (`pretrain.pretrain_backbone`,
`pretrain.shipped=False`, into a temporary cache), copies the `.npz` into `aepg_jax/assets/`
under the name its settings hash to, and records its fingerprint (`pretrain.file_fingerprint`),
test accuracy, the JAX versions, the CPU and the date in `aepg_jax/assets/backbones.json`.
Needs the pretraining data (Debian's `dataset-fashion-mnist` for the default). A backbone
pretrained on another machine can differ in its last bits; runs that use the shipped file do not.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import shutil
import tempfile

from aepg_jax.config import schema
from aepg_jax.data import loader
from aepg_jax.pretraining import pretrain
from aepg_jax.system import environment


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", default="configs/default.py", help="config file[:arg]")
    args = parser.parse_args()
    path, _, arg = args.config.partition(":")
    cfg = schema.from_file(path, arg or None)
    with tempfile.TemporaryDirectory() as tmp:
        cfg.pretrain.shipped = False
        cfg.pretrain.cache_dir = tmp
        made = pretrain.pretrain_backbone(cfg, loader.data_mesh())
        name = os.path.basename(made)
        os.makedirs(pretrain.ASSETS_DIR, exist_ok=True)
        shutil.copyfile(made, os.path.join(pretrain.ASSETS_DIR, name))
        with open(made[:-4] + ".json") as f:
            info = json.load(f)
    manifest = pretrain.shipped_manifest()
    manifest[name] = {
        "sha256": pretrain.file_fingerprint(os.path.join(pretrain.ASSETS_DIR, name)),
        "config": args.config,
        "pretrain": {
            k: v for k, v in cfg.pretrain.to_dict().items() if k not in ("cache_dir", "shipped")
        },
        "test_accuracy": info["test_accuracy"],
        "made_on": environment.describe(),
        "date": datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC"),
        "command": "scripts/make_shipped_backbone.py --config=" + args.config,
    }
    with open(pretrain.SHIPPED_MANIFEST, "w") as f:
        json.dump(manifest, f, indent=1, sort_keys=True)
        f.write("\n")
    print(f"wrote {os.path.join(pretrain.ASSETS_DIR, name)} ({manifest[name]['sha256'][:16]})")


if __name__ == "__main__":
    main()
