r"""Train from scratch (paper Table 4, Fig. 4): ResNet-50 on CIFAR-10/100, alpha CE + (1-alpha) EPG.

Arguments (`configs/cifar_scratch.py:key=value,...`, defaults in brackets):
  dataset [cifar100]  cifar10 | cifar100 (TFDS)
  alpha [0.2]         loss.alpha of the fixed mix `alpha CE + (1 - alpha) EPG` (0: EPG, 1: CE)
  loss [mix]          any loss of the registry (aepg anneals alpha_t over the whole run)
  seed [0]            the run's seed (the paper averages 3 seeds)
  model [resnet50]    resnet50 | resnet18 | resnet_small

docs/algorithm.md §9, §16: SGD momentum 0.9, batch 256, 350 epochs, lr 0.1 x0.1 after epochs
150 and 225 (the paper's text; its table says 100, 225:
`--config.optim.milestones='(100,225)'`), no weight decay, RandomCrop(32, padding 4) + flip,
per-channel mean/std of the training split. The last partial batch of each epoch is dropped
(195 steps of 256 per epoch).

Data: TFDS `cifar10` / `cifar100`, prepared once, offline, from the downloaded python tarball
(https://www.cs.toronto.edu/~kriz/cifar-100-python.tar.gz): `python -m aepg_jax.prepare
cifar100 --source=cifar-100-python.tar.gz --data_dir=DIR` (or `tfds build cifar100
--file_format=array_record --data_dir=DIR` with TensorFlow); add `--config.data.data_dir=DIR`
unless DIR is TFDS's default.

The paper's runs of this config are data (`aepg_jax/experiments/paper.py`, experiments `table4`,
`fig4`); list them with their `aepg_jax.main` commands (`--where=key=value,...` narrows the list,
e.g. `--where=seed=0`):

    python -m aepg_jax.sweep --experiment=paper --where=config=cifar_scratch --list
    python -m aepg_jax.sweep --experiment=table4 --list      # or another experiment above

One of them:

    # Table 4: CIFAR-100, alpha 0.2, seed 0.
    python -m aepg_jax.main --config=configs/cifar_scratch.py:dataset=cifar100,alpha=0.2,seed=0 \
      --workdir=runs/scratch/cifar100-a0.2-s0

Run a whole experiment, resumably, and set our numbers beside the paper's (docs/paper.md):

    python -m aepg_jax.sweep --experiment=table4 --workdir=runs/table4
    python -m aepg_jax.tables runs/table4

    # The 3 seeds of one cell as one vmapped program (results_seeds.json: mean +- std).
    python -m aepg_jax.main --config=configs/cifar_scratch.py:dataset=cifar100,alpha=0.2 \
      --config.num_seeds=3 --workdir=runs/scratch/cifar100-a0.2-3seeds

    # Fig. 4: test accuracy and entropy of the alpha sweep in one picture.
    python scripts/compare_scratch.py runs/table4/cifar_scratch/*dataset=cifar100* \
      --out fig4_cifar100.png
"""

from aepg_jax.config import arguments
from aepg_jax.scratch import config as scratch_config

DATASETS = ("cifar10", "cifar100")


def get_config(arg=None):
    a = arguments.parse_arg(
        arg, dataset="cifar100", alpha=0.2, loss="mix", seed=0, model="resnet50"
    )
    if a.dataset not in DATASETS:
        raise ValueError(f"dataset={a.dataset!r}: use one of {', '.join(DATASETS)}.")
    c = scratch_config.base_config(a.model)
    c.seed = a.seed
    c.data.source = "tfds"
    c.data.name = a.dataset
    c.loss.name = a.loss
    c.loss.alpha = a.alpha
    return c
