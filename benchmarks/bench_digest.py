"""Cost of the checkpoint integrity digests at ViT-B/16 PEFT size, against the save itself.

    python benchmarks/bench_digest.py [--preset vit_b16] [--kind lora] [--classes 200] [--repeats 3]

The saved `TrainState` of an LAE run holds the trainable tree (PEFT + heads) four times over:
the parameters, Adam's two moments and LAE's offline PEFT. This builds random arrays of those
shapes (from `jax.eval_shape`, the real leaf names), then times, alternately in one process:
`tree_digest` of the tree (what a save adds), an Orbax save of it without digests (the
baseline), and the digest check of a restore. Prints seconds and the digest / save ratios.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time

import jax
import numpy as np
import orbax.checkpoint as ocp

from aepg_jax.models import partition, vit
from aepg_jax.runs import checkpointing


def state_like(preset: str, kind: str, classes: int) -> dict:
    """Random float32 arrays shaped as an LAE run's saved state (4 copies of the trainable)."""
    cfg = vit.model_config(preset, peft={"kind": kind})
    shapes = jax.eval_shape(lambda: vit.init_params(cfg, jax.random.key(0), (classes,)))
    trainable, _ = partition.split(
        shapes, partition.label_params(shapes), (partition.PEFT, partition.HEAD)
    )
    rng = np.random.default_rng(0)

    def fill(leaf):
        return rng.standard_normal(leaf.shape, dtype=np.float32)

    return {name: jax.tree.map(fill, trainable) for name in ("params", "mu", "nu", "offline")}


def _timed(fn) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--preset", default="vit_b16", choices=sorted(vit.PRESETS))
    parser.add_argument("--kind", default="lora")
    parser.add_argument("--classes", type=int, default=200, help="classes of the head")
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()

    tree = state_like(args.preset, args.kind, args.classes)
    nbytes = sum(leaf.nbytes for leaf in jax.tree.leaves(tree))
    print(f"{args.preset} {args.kind}, head {args.classes}: saved state {nbytes / 2**20:.1f} MiB")
    digest, save = [], []
    with tempfile.TemporaryDirectory() as tmp:
        checkpointer = ocp.StandardCheckpointer()
        for i in range(args.repeats):
            digest.append(_timed(lambda: checkpointing.tree_digest(tree)))
            save.append(_timed(lambda i=i: checkpointer.save(f"{tmp}/{i}", tree)))
            checkpointer.wait_until_finished()
        checkpointer.close()
    d, s = statistics.median(digest), statistics.median(save)
    print(f"digest {d:.3f} s, Orbax save {s:.3f} s (medians of {args.repeats})")
    print(f"digest / save: {d / s:.3f}  ({nbytes / 2**20 / d:.0f} MiB/s hashed)")


if __name__ == "__main__":
    main()
