r"""DomainNet: 345 classes in 6 domains, class- or domain-incremental, ViT-B/16 augreg.

Arguments (`configs/domainnet.py:key=value,...`, defaults in brackets):
  scenario [class]  class: 5 tasks of 69 classes, every domain mixed in each (CODA-Prompt's and
                    InfLoRA's DomainNet benchmark, `data.scenario=class`) | domain: 6 tasks, one
                    domain each, every task over all 345 classes (`data.scenario=domain`)
  tasks [None]      None: 5 (class) or 6 (domain, one task per domain)
  peft [lora] / method [lae] / loss [aepg] / seed [0] / schedule / tau / alpha / gamma /
  smoothing / beta / noise / settings [reference] / weights [None]
                    as in configs/imagenet_r.py (configs/README.md, "argument" table)

Data: TFDS-style `domainnet` (one dataset of the 6 domains, each example with its domain id),
prepared once, offline, with `python -m aepg_jax.prepare domainnet` (docs/data.md); add
`--config.data.data_dir=DIR` unless DIR is TFDS's default. Images are cached at 256 px and
tested at Resize(256) + CenterCrop(224), as the references. Weights: the augreg
`B_16-i21k-300ep-...-res_224.npz` (configs/README.md), passed with
`--config.model.checkpoint=$CKPT` (required), or a published backbone with `weights=NAME`.

    CKPT=/path/to/B_16-i21k-300ep-...-res_224.npz

The baselines' runs of this config are data (`aepg_jax/experiments/baselines.py`, experiments
`coda_prompt`, `inflora`); list them with their `aepg_jax.main` commands:

    python -m aepg_jax.sweep --experiment=coda_prompt --where=config=domainnet --list
    python -m aepg_jax.sweep --experiment=inflora --where=config=domainnet --list

One of them (CODA-P with CODA-Prompt's DomainNet schedule, 5 epochs per task), and the
domain-incremental scenario:

    python -m aepg_jax.main --config=configs/domainnet.py:method=coda_prompt,loss=ce,seed=0 \
      --config.optim.epochs=5 --config.model.checkpoint=$CKPT --workdir=runs/domainnet/codap
    python -m aepg_jax.main --config=configs/domainnet.py:scenario=domain,method=lae,seed=0 \
      --config.model.checkpoint=$CKPT --workdir=runs/domainnet/domain-lae
"""

from aepg_jax.config import arguments

SCENARIOS = {"class": 5, "domain": 6}  # scenario -> its default number of tasks


def get_config(arg=None):
    a = arguments.parse_arg(
        arg, scenario="class", tasks=(None, int), weights=(None, str), **arguments.PAPER_ARGS
    )
    if a.scenario not in SCENARIOS:
        raise ValueError(f"scenario={a.scenario!r} is unknown; use one of {', '.join(SCENARIOS)}.")
    tasks = SCENARIOS[a.scenario] if a.tasks is None else a.tasks
    c = arguments.paper_data_config(a, "tfds", "domainnet", tasks)
    c.data.scenario = a.scenario
    return c
