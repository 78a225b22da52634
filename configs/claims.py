"""The embedded default with the method, the loss, the seed and the heads' init as arguments: the
runs of `python -m aepg_jax.sweep --experiment=field_claims` (aEPG against CE for every method
that trains with a loss, paired by seed, with the heads' initialisation as an axis).

configs/default.py unchanged (tiny ViT pretrained on Fashion-MNIST, shipped; digits in 5 tasks;
20 epochs per task, the PEFT modules frozen for the first 8 of every task after the first;
Adam 1e-3, batch 32) for every method; a method with its own parameters (e.g. l2p, sd_lora)
gets model.peft.kind=none, as in configs/demo.py. Offline.

Arguments (`configs/claims.py:key=value,...`, defaults in brackets):
  method [lae]          any continual method
  loss [aepg]           any loss of the registry (ce, epg, aepg, ...)
  seed [0]
  head_init [official]  method.head_init: official (the method's official code's), normal,
                        uniform, linear or trunc_normal (docs/algorithm.md §18)

With no argument it is configs/default.py's config with `method.head_init` given:

    python -m aepg_jax.main --config=configs/claims.py:method=l2p,loss=ce,head_init=normal \
      --workdir=runs/claims/l2p
"""

from aepg_jax import methods
from aepg_jax.config import arguments


def get_config(arg=None):
    a = arguments.parse_arg(
        arg, method="lae", loss="aepg", seed=0, head_init=methods.OFFICIAL_HEAD_INIT
    )
    c = arguments.sibling_config(__file__, "default.py")
    c.seed = a.seed
    c.method.name = a.method
    c.method.head_init = a.head_init
    c.loss.name = a.loss
    if not methods.get(a.method).uses_model_peft:
        c.model.peft.kind = "none"
    return c
