r"""Split CUB-200: 200 bird species in 10 tasks of 20, ViT-B/16 augreg with PEFT.

Arguments (`configs/cub200.py:key=value,...`, defaults in brackets):
  tasks [10]        tasks of 200 / tasks classes
  peft [lora]       lora | adapter | prefix
  method [lae]      plain | lwf | lae (the paper's), or any other method of aepg_jax.methods
                    (docs/methods.md)
  loss [aepg]       ce | epg | aepg | mix | focal | label_smoothing | confidence_penalty |
                    entropy_penalty
  seed [0]          the run's seed (the paper averages seeds 0-4 or 0-2)
  noise [0.0]       symmetric label-noise rate of the training labels (0.2 in Table 6)
  schedule [sigmoid] / tau [6.0] / alpha [0.5] / gamma [1.0] / smoothing [0.05] / beta
                    as in configs/imagenet_r.py

Data: TFDS `caltech_birds2011` (train / test), prepared once, offline, from the downloaded
archives: `python -m aepg_jax.prepare caltech_birds2011 --source=CUB_200_2011.tgz
--source=segmentations.tgz --data_dir=DIR` (configs/README.md: download URLs; `tfds build`
works too); add `--config.data.data_dir=DIR` unless DIR is TFDS's default. Weights: the augreg
`B_16-i21k-300ep-...-res_224.npz` of the paper's footnote (see configs/README.md), passed with
`--config.model.checkpoint=$CKPT` (required).

    CKPT=/path/to/B_16-i21k-300ep-...-res_224.npz

The paper's runs of this config are data (`aepg_jax/experiments/paper.py`, experiments `table2`,
`table3`, `table6`); list them with their `aepg_jax.main` commands (`--where=key=value,...` narrows
the list, e.g. `--where=seed=0`):

    python -m aepg_jax.sweep --experiment=paper --where=config=cub200 --list
    python -m aepg_jax.sweep --experiment=table2 --list      # or another experiment above

One of them:

    # Table 2: LAE + aEPG with Adapter, seed 0.
    python -m aepg_jax.main --config=configs/cub200.py:peft=adapter,method=lae,loss=aepg,seed=0 \
      --config.model.checkpoint=$CKPT --workdir=runs/cub200/t2_adapter-aepg-0

Run a whole experiment, resumably, and set our numbers beside the paper's (docs/paper.md):

    python -m aepg_jax.sweep --experiment=table2 --workdir=runs/table2 \
      --config.model.checkpoint=$CKPT
    python -m aepg_jax.tables runs/table2
"""

from aepg_jax.config import arguments


def get_config(arg=None):
    a = arguments.parse_arg(arg, tasks=10, **arguments.PAPER_ARGS)
    c = arguments.paper_config(a)
    c.data.source = "tfds"
    c.data.name = "caltech_birds2011"
    c.data.num_tasks = a.tasks
    return c
