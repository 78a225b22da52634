"""The demo experiment of `python -m aepg_jax.sweep --experiment=demo`: configs/default.py (tiny
ViT pretrained on Fashion-MNIST, digits in 5 tasks, LoRA) shortened to 2 epochs per task, with
the method, loss and seed as arguments. Offline; one run took 43 s on the project's 2-core CPU
(lightly loaded), later seeds of a sweep less (`aepg_jax.sweep` shares the compiled programs).

Arguments (`configs/demo.py:key=value,...`, defaults in brackets):
  method [lae]   any continual method (a method with its own parameters, e.g. coda_prompt, gets
                 model.peft.kind=none; the demo keeps default.py's optimiser for every method)
  loss [aepg]    any loss of the registry (ce, epg, aepg, ...)
  seed [0]

The demo's 18 runs (method plain / lae / coda_prompt x loss ce / aepg x seeds 0-2) are the
experiment `demo` of `aepg_jax/experiments/paper.py`; list them with their commands, run them,
and tabulate them with

    python -m aepg_jax.sweep --experiment=demo --list
    python -m aepg_jax.sweep --experiment=demo --workdir=runs/demo
    python -m aepg_jax.tables runs/demo

One of them:

    python -m aepg_jax.main --config=configs/demo.py:method=lae,loss=aepg,seed=0 \
      --workdir=runs/demo/lae
"""

from aepg_jax import methods
from aepg_jax.config import arguments


def get_config(arg=None):
    a = arguments.parse_arg(arg, method="lae", loss="aepg", seed=0)
    c = arguments.sibling_config(__file__, "default.py")
    c.seed = a.seed
    c.method.name = a.method
    c.loss.name = a.loss
    if not methods.get(a.method).uses_model_peft:
        c.model.peft.kind = "none"
    c.optim.epochs = 2
    c.optim.peft_freeze_epochs = 1
    return c
