r"""CLRS25 remote-sensing scenes: 25 classes in 5 tasks of 5, ViT-B/16 augreg with PEFT.

Arguments (`configs/clrs25.py:key=value,...`, defaults in brackets):
  tasks [5]         tasks of 25 / tasks classes
  peft [lora]       lora | adapter | prefix
  method [lae]      plain | lwf | lae
  loss [aepg]       ce | epg | aepg | mix | focal | label_smoothing | confidence_penalty |
                    entropy_penalty
  seed [0]          the run's seed (the paper averages seeds 0-4 or 0-2)
  tau [6.0]         sigmoid sharpness: 4 | 6 | 8 in Table 8
  noise [0.0]       symmetric label-noise rate of the training labels (0.2 in Table 6)
  schedule [sigmoid] / alpha [0.5] / gamma [1.0] / smoothing [0.05] / beta
                    as in configs/imagenet_r.py

Data (required): CLRS is not in TFDS. Unpack it (ROOT/<class>/*, 25 class directories, 600
images each, 256 px), check and copy it with `python -m aepg_jax.prepare clrs25 --source=ROOT
--data_dir=DIR`, and pass `--config.data.data_dir=DIR/clrs25` (ROOT itself works too); the
config leaves data.data_dir unset and `schema.validate` rejects it until you do. Train and
test are a stratified 80/20 split drawn by data.split_seed (0, the same for every run). Weights
(required): the augreg `B_16-i21k-300ep-...-res_224.npz` of the paper's footnote (see
configs/README.md), passed with `--config.model.checkpoint=$CKPT`.

    CKPT=/path/to/B_16-i21k-300ep-...-res_224.npz
    CLRS=/path/to/CLRS

    # Table 2: LAE and LAE+aEPG with LoRA, Adapter and Prefix, 3 seeds.
    for p in lora adapter prefix; do for l in ce aepg; do for s in 0 1 2; do
      python -m aepg_jax.main --config=configs/clrs25.py:peft=$p,method=lae,loss=$l,seed=$s \
        --config.data.data_dir=$CLRS --config.model.checkpoint=$CKPT \
        --workdir=runs/clrs25/t2_$p-$l-$s
    done; done; done

    # Table 3: entropy regularisers, LoRA, 5 seeds.
    for l in ce focal label_smoothing confidence_penalty epg aepg entropy_penalty; do
      for s in 0 1 2 3 4; do
        python -m aepg_jax.main --config=configs/clrs25.py:method=plain,loss=$l,seed=$s \
          --config.data.data_dir=$CLRS --config.model.checkpoint=$CKPT \
          --workdir=runs/clrs25/t3_$l-$s
    done; done

    # Table 6: 20% symmetric label noise, CE vs aEPG, 3 seeds.
    for l in ce aepg; do for s in 0 1 2; do
      python -m aepg_jax.main --config=configs/clrs25.py:method=plain,loss=$l,noise=0.2,seed=$s \
        --config.data.data_dir=$CLRS --config.model.checkpoint=$CKPT \
        --workdir=runs/clrs25/t6_$l-$s
    done; done

    # Table 8: tau of the sigmoid schedule.
    for u in 4 6 8; do for s in 0 1 2 3 4; do
      python -m aepg_jax.main --config=configs/clrs25.py:method=plain,tau=$u,seed=$s \
        --config.data.data_dir=$CLRS --config.model.checkpoint=$CKPT \
        --workdir=runs/clrs25/t8_tau$u-$s
    done; done
"""

from aepg_jax.config import arguments


def get_config(arg=None):
    a = arguments.parse_arg(arg, tasks=5, **arguments.PAPER_ARGS)
    c = arguments.paper_config(a)
    c.data.source = "folder"
    c.data.name = "clrs25"  # labels the decoded-image cache; data.data_dir comes from the user
    c.data.num_tasks = a.tasks
    return c
