r"""Split ImageNet-R: 200 classes in 5, 10 or 20 tasks, ViT-B/16 augreg with PEFT on blocks 0-4.

Arguments (`configs/imagenet_r.py:key=value,...`, defaults in brackets):
  tasks [10]        5 | 10 | 20 tasks (40, 20 or 10 classes each)
  peft [lora]       lora | adapter | prefix
  method [lae]      plain | lwf | lae | l2p | dualprompt | coda_prompt | inflora (Table 1's), or
                    any other method of aepg_jax.methods (docs/methods.md); the prompt
                    methods train their own prompts, InfLoRA its own per-task LoRA pairs:
                    model.peft is set to none
  loss [aepg]       ce | epg | aepg | mix | focal | label_smoothing | confidence_penalty |
                    entropy_penalty
  seed [0]          the run's seed (the paper averages seeds 0-4 or 0-2)
  schedule [sigmoid]  sigmoid | linear | cosine | constant (alpha_t of loss=aepg)
  tau [6.0]         sigmoid sharpness: 4 | 6 | 8 in the paper
  alpha [0.5]       fixed alpha of loss=mix (and of schedule=constant)
  gamma [1.0] / smoothing [0.05] / beta [the loss's: 0.1 confidence, 1.0 entropy penalty]
  noise [0.0]       symmetric label-noise rate of the training labels (0.2 in the paper)
  weights [None]    a published backbone by name (docs/data.md, e.g. vit_base_patch16_clip_224
                    .openai): sets model.weights and the family, patch size and input.normalize
                    the weights need; the file is the local Hugging Face cache's
                    (`hf download timm/<name> model.safetensors`); None: model.checkpoint
  settings [reference]  reference: each method's reference-implementation optimiser settings
                    (L2P++ / CODA-P: Adam 1e-3, batch 128, per-epoch cosine decay; DualPrompt:
                    Adam 4.6875e-4, batch 24, clip 1.0; InfLoRA: Adam 5e-4, batch 128, per-epoch
                    cosine decay; all 50 epochs, no head-only epochs); plain / lwf / lae have
                    none, they run the paper's. common: the paper's Table 5 settings for every
                    method (Adam 5e-4, batch 256, 30 head-only epochs)

Data: TFDS `imagenet_r` (train = test[:80%], test = test[80%:], L2P's split), prepared once,
offline, from the downloaded archive: `python -m aepg_jax.prepare imagenet_r
--source=imagenet-r.tar --data_dir=DIR` (configs/README.md: download URLs; `tfds build` works
too); add `--config.data.data_dir=DIR` unless DIR is TFDS's default. Weights: the augreg file of the
paper's footnote (`B_16-i21k-300ep-...-res_224.npz`, see configs/README.md), downloaded by you
and passed with `--config.model.checkpoint=$CKPT` (required). An image folder of ImageNet-R
also works: `--config.data.source=folder --config.data.data_dir=ROOT` with
`--config.data.split_file=DIR/imagenet_r/0.2.0/l2p_split.json` (written by `prepare`: L2P's
split, the same examples in the same order; without it a stratified 80/20 split by
data.split_seed). configs/README.md maps every table and figure to its runs.

    CKPT=/path/to/B_16-i21k-300ep-...-res_224.npz

The paper's runs of this config are data (`aepg_jax/experiments/paper.py`, experiments
`table1`, `table3`, `table6`, `table8`, `fig1`, `fig2`, `fig3a`, `fig3b`, `fig6`, `backbones`);
list them with their
`aepg_jax.main` commands (`--where=key=value,...` narrows the list, e.g. `--where=seed=0`):

    python -m aepg_jax.sweep --experiment=paper --where=config=imagenet_r --list
    python -m aepg_jax.sweep --experiment=table1 --list      # or another experiment above

One of them:

    # Table 1: LAE + aEPG, 10 tasks, seed 0.
    python -m aepg_jax.main --config=configs/imagenet_r.py:tasks=10,method=lae,loss=aepg,seed=0 \
      --config.model.checkpoint=$CKPT --workdir=runs/imagenet_r/t1_10-lae-aepg-0

Run a whole experiment, resumably, and set our numbers beside the paper's (docs/paper.md):

    python -m aepg_jax.sweep --experiment=table1 --workdir=runs/table1 \
      --config.model.checkpoint=$CKPT
    python -m aepg_jax.tables runs/table1
"""

from aepg_jax.config import arguments


def get_config(arg=None):
    a = arguments.parse_arg(arg, tasks=10, weights=(None, str), **arguments.PAPER_ARGS)
    return arguments.paper_data_config(a, "tfds", "imagenet_r", a.tasks)
