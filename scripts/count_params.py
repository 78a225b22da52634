"""Prints parameter counts per partition (backbone / peft / head) for a model preset and every
PEFT kind, next to the closed-form PEFT count of `models.peft.num_params`.

    .venv/bin/python scripts/count_params.py [--preset vit_b16] [--classes 1000]

Shapes only (jax.eval_shape): nothing is allocated, so ViT-B/16 takes about a second.
"""

import argparse

import jax

from aepg_jax.models import partition, peft, vit


def counts(preset: str, kind: str, classes: int) -> dict[str, int]:
    """Scalars per label for `preset` with PEFT `kind` and one head of `classes` classes."""
    cfg = vit.model_config(preset, peft={"kind": kind})
    heads = (classes,) if classes else ()
    shapes = jax.eval_shape(lambda: vit.init_params(cfg, jax.random.key(0), heads))
    return partition.count(shapes, partition.label_params(shapes))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--preset", default="vit_b16", choices=sorted(vit.PRESETS))
    parser.add_argument("--classes", type=int, default=1000, help="classes of one task head")
    args = parser.parse_args()

    cfg = vit.model_config(args.preset)
    print(f"{args.preset}, peft blocks {list(cfg.peft.blocks)}, one head of {args.classes}")
    header = f"{'peft':<8} {'total':>12} {'backbone':>12} {'peft':>9} {'formula':>9} {'head':>9}"
    print(header)
    for kind in peft.PEFT_KINDS:
        c = counts(args.preset, kind, args.classes)
        formula = peft.num_params(
            vit.peft_from_config(vit.model_config(args.preset, peft={"kind": kind}).peft),
            cfg.hidden_size,
        )
        print(
            f"{kind:<8} {c['total']:>12,} {c['backbone']:>12,} {c.get('peft', 0):>9,} "
            f"{formula:>9,} {c.get('head', 0):>9,}"
        )


if __name__ == "__main__":
    main()
