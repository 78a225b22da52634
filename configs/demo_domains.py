"""The domain-incremental demo: configs/default.py's tiny ViT (pretrained on Fashion-MNIST,
shipped) and LoRA learning scikit-learn's digits domain by domain (`data.scenario=domain`,
docs/algorithm.md §17): `data.source=digits_domains`, four domains (original, inverted,
rotated by 90 degrees, noisy) of disjoint digits, one task each, every task over all 10 classes
with one head. Offline; one run took about a minute on the project's 2-core CPU (28-47 s of
training, 17-35 s compiling).

Arguments (`configs/demo_domains.py:key=value,...`, defaults in brackets):
  method [lae]   plain, lae, lwf, l2p, dualprompt or coda_prompt (InfLoRA is refused in this
                 scenario); a method with its own parameters gets model.peft.kind=none
  loss [aepg]    any loss of the registry (ce, epg, aepg, ...)
  seed [0]

    python -m aepg_jax.main --config=configs/demo_domains.py:method=lae --workdir=runs/domains

The run prints the accuracy matrix: a[i, j], domain i's test accuracy after learning domain j.
"""

from aepg_jax.config import arguments


def get_config(arg=None):
    c = arguments.sibling_config(__file__, "demo.py", arg)
    c.data.source = "digits_domains"
    c.data.scenario = "domain"
    c.data.num_tasks = 4  # one task per domain
    c.optim.epochs = 20
    c.optim.peft_freeze_epochs = 8
    return c
