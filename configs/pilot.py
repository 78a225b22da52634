r"""PILOT's benchmarks: ImageNet-A, ObjectNet, OmniBenchmark, VTAB as image folders, ViT-B/16.

The class-incremental splits of the PILOT group's published tables (EASE, CVPR 2024, Table 1,
whose L2P / DualPrompt / CODA-Prompt cells `aepg_jax/experiments/baselines.py` holds), B0 (no
larger first task):

  dataset        classes  per task  tasks
  imagenet_a     200      20        10     (B0-Inc20)
  objectnet      200      10        20     (B0-Inc10, as EASE's and APER's configs; tasks=10
                                           gives Inc20)
  omnibenchmark  300      30        10     (B0-Inc30)
  vtab           50       10        5      (B0-Inc10)

Arguments (`configs/pilot.py:key=value,...`, defaults in brackets):
  dataset [imagenet_a]  imagenet_a | objectnet | omnibenchmark | vtab
  tasks [the table's]  tasks the classes are cut into
  shuffle [True; False for vtab]  True: seed 1993's class order, drawn as numpy's legacy
                    `np.random.seed(1993); np.random.permutation` (`data.class_order_seed=1993`,
                    `data.class_order_rng=numpy_legacy`), which EASE's table says every method
                    ran in | False: the identity order (EASE's and APER's VTAB configs set
                    `shuffle: false`, VTAB's five source datasets in folder order)
  peft [lora] / method [lae] / loss [aepg] / seed [0] / schedule / tau / alpha / gamma /
  smoothing / beta / noise / settings [reference] / weights [None]
                    as in configs/imagenet_r.py (configs/README.md, "argument" table)

Data: the image folders PILOT distributes (train/ and test/ per dataset), prepared once,
offline: `python -m aepg_jax.prepare NAME --source=... --data_dir=OUT` (docs/data.md), then
`--config.data.data_dir=OUT` (the data root, or OUT/NAME; required: the config leaves it unset
and validation refuses the run until it is given). Images are cached at 256 px and tested at
Resize(256) + CenterCrop(224), as PILOT's. Weights: the augreg `B_16-i21k-300ep-...-res_224.npz`
(configs/README.md) with `--config.model.checkpoint=$CKPT`, or a published backbone with
`weights=NAME` (PILOT's is timm's `vit_base_patch16_224.augreg_in21k_ft_in1k`).

    CKPT=/path/to/B_16-i21k-300ep-...-res_224.npz

The baselines' runs of this config are data (`aepg_jax/experiments/baselines.py` and
`field_methods.py`, experiments `pilot`, `aper`, `ease`, `ranpac`, `sd_lora`); list them with their
`aepg_jax.main` commands:

    python -m aepg_jax.sweep --experiment=pilot --where=config=pilot --list
    python -m aepg_jax.sweep --experiment=aper --where=config=pilot --list
    python -m aepg_jax.sweep --experiment=ease --where=config=pilot --list
    python -m aepg_jax.sweep --experiment=ranpac --where=config=pilot --list
    python -m aepg_jax.sweep --experiment=sd_lora --where=config=pilot --list

One of them:

    python -m aepg_jax.main --config=configs/pilot.py:dataset=vtab,method=coda_prompt,loss=ce \
      --config.data.data_dir=OUT/vtab --config.model.checkpoint=$CKPT --workdir=runs/pilot/vtab
"""

from aepg_jax.config import arguments

DATASETS = {"imagenet_a": 10, "objectnet": 20, "omnibenchmark": 10, "vtab": 5}  # -> tasks
CLASS_ORDER_SEED = 1993  # PILOT's (PyCIL's, iCaRL's) seed of the class order


def get_config(arg=None):
    a = arguments.parse_arg(
        arg,
        dataset="imagenet_a",
        tasks=(None, int),
        shuffle=(None, bool),
        weights=(None, str),
        **arguments.PAPER_ARGS,
    )
    if a.dataset not in DATASETS:
        raise ValueError(f"dataset={a.dataset!r} is unknown; use one of {', '.join(DATASETS)}.")
    tasks = DATASETS[a.dataset] if a.tasks is None else a.tasks
    c = arguments.paper_data_config(a, "folder", a.dataset, tasks)
    shuffle = a.dataset != "vtab" if a.shuffle is None else a.shuffle
    if shuffle:
        c.data.class_order_seed = CLASS_ORDER_SEED
        c.data.class_order_rng = "numpy_legacy"
    return c
