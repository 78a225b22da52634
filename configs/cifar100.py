r"""Split CIFAR-100: 100 classes in 10 tasks of 10, images resized to 224 px, ViT-B/16 augreg.

The benchmark of CODA-Prompt's and InfLoRA's CIFAR-100 tables (experiments `coda_prompt`,
`inflora`, `aepg_jax/experiments/baselines.py`), with this project's methods and arguments.

Arguments (`configs/cifar100.py:key=value,...`, defaults in brackets):
  tasks [10]        tasks of 100 / tasks classes
  peft [lora] / method [lae] / loss [aepg] / seed [0] / schedule / tau / alpha / gamma /
  smoothing / beta / noise / settings [reference] / weights [None]
                    as in configs/imagenet_r.py (configs/README.md, "argument" table)

Data: TFDS `cifar100` (train 50,000 / test 10,000, 32 px), prepared once, offline:
`python -m aepg_jax.prepare cifar100 --source=cifar-100-python.tar.gz --data_dir=DIR`; add
`--config.data.data_dir=DIR` unless DIR is TFDS's default. The 32 px images are resized once to
224 px when cached (`data.store_size=224`, about 9 GB of cache for both splits): training
crops RandomResizedCrop(224) from them, testing sees the whole 224 px image, as the references'
Resize(224). Weights: the augreg `B_16-i21k-300ep-...-res_224.npz` (configs/README.md), passed
with `--config.model.checkpoint=$CKPT` (required), or a published backbone with `weights=NAME`.

    CKPT=/path/to/B_16-i21k-300ep-...-res_224.npz

The baselines' runs of this config are data (`aepg_jax/experiments/baselines.py` and
`field_methods.py`, experiments `coda_prompt`, `inflora`, `aper`, `ease`, `ranpac`, `sd_lora`,
`slca`, `hide_prompt`); list them with their `aepg_jax.main` commands:

    python -m aepg_jax.sweep --experiment=coda_prompt --where=config=cifar100 --list
    python -m aepg_jax.sweep --experiment=inflora --where=config=cifar100 --list
    python -m aepg_jax.sweep --experiment=aper --where=config=cifar100 --list
    python -m aepg_jax.sweep --experiment=ease --where=config=cifar100 --list
    python -m aepg_jax.sweep --experiment=ranpac --where=config=cifar100 --list
    python -m aepg_jax.sweep --experiment=sd_lora --where=config=cifar100 --list
    python -m aepg_jax.sweep --experiment=slca --where=config=cifar100 --list
    python -m aepg_jax.sweep --experiment=hide_prompt --where=config=cifar100 --list

One of them (CODA-P with CODA-Prompt's CIFAR-100 schedule, 20 epochs per task):

    python -m aepg_jax.main --config=configs/cifar100.py:method=coda_prompt,loss=ce,seed=0 \
      --config.optim.epochs=20 --config.model.checkpoint=$CKPT --workdir=runs/cifar100/codap

Run a whole experiment, resumably, and set our numbers beside the published ones:

    python -m aepg_jax.sweep --experiment=coda_prompt --workdir=runs/coda_prompt \
      --config.model.checkpoint=$CKPT
    python -m aepg_jax.tables runs/coda_prompt
"""

from aepg_jax.config import arguments


def get_config(arg=None):
    a = arguments.parse_arg(arg, tasks=10, weights=(None, str), **arguments.PAPER_ARGS)
    c = arguments.paper_data_config(a, "tfds", "cifar100", a.tasks)
    c.data.store_size = c.model.image_size  # 32 px -> 224 px once; the test crop is the image
    return c
