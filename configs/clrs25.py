r"""CLRS25 remote-sensing scenes: 25 classes in 5 tasks of 5, ViT-B/16 augreg with PEFT.

Arguments (`configs/clrs25.py:key=value,...`, defaults in brackets):
  tasks [5]         tasks of 25 / tasks classes
  peft [lora]       lora | adapter | prefix
  method [lae]      plain | lwf | lae (the paper's), or any other method of aepg_jax.methods
                    (docs/methods.md)
  loss [aepg]       ce | epg | aepg | mix | focal | label_smoothing | confidence_penalty |
                    entropy_penalty
  seed [0]          the run's seed (the paper averages seeds 0-4 or 0-2)
  tau [6.0]         sigmoid sharpness: 4 | 6 | 8 in Table 8
  noise [0.0]       symmetric label-noise rate of the training labels (0.2 in Table 6)
  schedule [sigmoid] / alpha [0.5] / gamma [1.0] / smoothing [0.05] / beta
                    as in configs/imagenet_r.py

Data (required): CLRS is not in TFDS. Unpack it (ROOT/<class>/*, 25 class directories, 600
images each, 256 px), check and copy it with `python -m aepg_jax.prepare clrs25 --source=ROOT
--data_dir=DIR`, and pass `--config.data.data_dir=DIR` (the data root; DIR/clrs25 or ROOT works
too); the config leaves data.data_dir unset and validation rejects it until you do. Train and
test are a stratified 80/20 split drawn by data.split_seed (0, the same for every run). Weights
(required): the augreg `B_16-i21k-300ep-...-res_224.npz` of the paper's footnote (see
configs/README.md), passed with `--config.model.checkpoint=$CKPT`.

    CKPT=/path/to/B_16-i21k-300ep-...-res_224.npz
    CLRS=/path/to/CLRS

The paper's runs of this config are data (`aepg_jax/experiments/paper.py`, experiments `table2`,
`table3`, `table6`, `table8`); list them with their `aepg_jax.main` commands
(`--where=key=value,...` narrows the list, e.g. `--where=seed=0`):

    python -m aepg_jax.sweep --experiment=paper --where=config=clrs25 --list
    python -m aepg_jax.sweep --experiment=table2 --list      # or another experiment above

One of them:

    # Table 2: LAE + aEPG with Adapter, seed 0.
    python -m aepg_jax.main --config=configs/clrs25.py:peft=adapter,method=lae,loss=aepg,seed=0 \
      --config.data.data_dir=$CLRS --config.model.checkpoint=$CKPT \
      --workdir=runs/clrs25/t2_adapter-aepg-0

Run a whole experiment, resumably, and set our numbers beside the paper's (docs/paper.md):
with every dataset prepared into one data root $DATA (clrs25/ beside the TFDS datasets), one
sweep runs all of Table 2's runs, CLRS25's included:

    python -m aepg_jax.sweep --experiment=table2 --workdir=runs/table2 \
      --config.model.checkpoint=$CKPT --config.data.data_dir=$DATA
    python -m aepg_jax.tables runs/table2
"""

from aepg_jax.config import arguments


def get_config(arg=None):
    a = arguments.parse_arg(arg, tasks=5, **arguments.PAPER_ARGS)
    c = arguments.paper_config(a)
    c.data.source = "folder"
    c.data.name = "clrs25"  # labels the decoded-image cache; data.data_dir comes from the user
    c.data.num_tasks = a.tasks
    return c
