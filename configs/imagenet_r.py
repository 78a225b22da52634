r"""Split ImageNet-R: 200 classes in 5, 10 or 20 tasks, ViT-B/16 augreg with PEFT on blocks 0-4.

Arguments (`configs/imagenet_r.py:key=value,...`, defaults in brackets):
  tasks [10]        5 | 10 | 20 tasks (40, 20 or 10 classes each)
  peft [lora]       lora | adapter | prefix
  method [lae]      plain | lwf | lae | l2p | dualprompt | coda_prompt | inflora (the prompt
                    methods train their own prompts, InfLoRA its own per-task LoRA pairs:
                    model.peft is set to none)
  loss [aepg]       ce | epg | aepg | mix | focal | label_smoothing | confidence_penalty |
                    entropy_penalty
  seed [0]          the run's seed (the paper averages seeds 0-4 or 0-2)
  schedule [sigmoid]  sigmoid | linear | cosine | constant (alpha_t of loss=aepg)
  tau [6.0]         sigmoid sharpness: 4 | 6 | 8 in the paper
  alpha [0.5]       fixed alpha of loss=mix (and of schedule=constant)
  gamma [1.0] / smoothing [0.05] / beta [the loss's: 0.1 confidence, 1.0 entropy penalty]
  noise [0.0]       symmetric label-noise rate of the training labels (0.2 in the paper)
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
data.split_seed). Each loop below reproduces one table or figure;
`configs/README.md` maps them all.

    CKPT=/path/to/B_16-i21k-300ep-...-res_224.npz

    # Table 1: LoRA, LwF-LoRA, LAE (LoRA), each with CE and aEPG, 5/10/20 tasks, 5 seeds.
    for t in 5 10 20; do for m in plain lwf lae; do for l in ce aepg; do for s in 0 1 2 3 4; do
      python -m aepg_jax.main --config=configs/imagenet_r.py:tasks=$t,method=$m,loss=$l,seed=$s \
        --config.model.checkpoint=$CKPT --workdir=runs/imagenet_r/t1_$t-$m-$l-$s
    done; done; done; done

    # Table 1: L2P (L2P++), DualPrompt, CODA-Prompt with their reference settings, 5 seeds
    # (loss=ce); loss=aepg gives "<method> + aEPG", settings=common the paper's Table 5 settings.
    for t in 5 10 20; do for m in l2p dualprompt coda_prompt; do for l in ce aepg; do
      for s in 0 1 2 3 4; do
        python -m aepg_jax.main \
          --config=configs/imagenet_r.py:tasks=$t,method=$m,loss=$l,seed=$s \
          --config.model.checkpoint=$CKPT --workdir=runs/imagenet_r/t1_$t-$m-$l-$s
    done; done; done; done

    # Table 1: InfLoRA (blocks 0-4, rank 5, lamb 0.99, lame 1.0: the paper's Table 5) with its
    # reference settings, 5 seeds; loss=aepg gives "InfLoRA + aEPG".
    for t in 5 10 20; do for l in ce aepg; do for s in 0 1 2 3 4; do
      python -m aepg_jax.main \
        --config=configs/imagenet_r.py:tasks=$t,method=inflora,loss=$l,seed=$s \
        --config.model.checkpoint=$CKPT --workdir=runs/imagenet_r/t1_$t-inflora-$l-$s
    done; done; done

    # Table 3 (and Fig. 2): entropy regularisers, LoRA, 10 tasks, 5 seeds. Fig. 1b: ce and epg.
    for l in ce focal label_smoothing confidence_penalty epg aepg entropy_penalty; do
      for s in 0 1 2 3 4; do
        python -m aepg_jax.main --config=configs/imagenet_r.py:method=plain,loss=$l,seed=$s \
          --config.model.checkpoint=$CKPT --workdir=runs/imagenet_r/t3_$l-$s
    done; done

    # Fig. 6: regularisation strength (focal gamma, label smoothing, confidence penalty beta).
    for g in 0.5 1 2; do for s in 0 1 2 3 4; do
      python -m aepg_jax.main \
        --config=configs/imagenet_r.py:method=plain,loss=focal,gamma=$g,seed=$s \
        --config.model.checkpoint=$CKPT --workdir=runs/imagenet_r/f6_focal$g-$s
    done; done
    for e in 0.01 0.05 0.1; do for s in 0 1 2 3 4; do
      python -m aepg_jax.main \
        --config=configs/imagenet_r.py:method=plain,loss=label_smoothing,smoothing=$e,seed=$s \
        --config.model.checkpoint=$CKPT --workdir=runs/imagenet_r/f6_ls$e-$s
    done; done
    for b in 0.1 0.2; do for s in 0 1 2 3 4; do
      python -m aepg_jax.main \
        --config=configs/imagenet_r.py:method=plain,loss=confidence_penalty,beta=$b,seed=$s \
        --config.model.checkpoint=$CKPT --workdir=runs/imagenet_r/f6_cp$b-$s
    done; done

    # Table 6: 20% symmetric label noise, CE vs aEPG, 3 seeds.
    for l in ce aepg; do for s in 0 1 2; do
      python -m aepg_jax.main \
        --config=configs/imagenet_r.py:method=plain,loss=$l,noise=0.2,seed=$s \
        --config.model.checkpoint=$CKPT --workdir=runs/imagenet_r/t6_$l-$s
    done; done

    # Fig. 3a: fixed alpha (alpha CE + (1 - alpha) EPG); the paper does not list its grid.
    for a in 0 0.2 0.4 0.6 0.8 1; do for s in 0 1 2 3 4; do
      python -m aepg_jax.main \
        --config=configs/imagenet_r.py:method=plain,loss=mix,alpha=$a,seed=$s \
        --config.model.checkpoint=$CKPT --workdir=runs/imagenet_r/f3_alpha$a-$s
    done; done

    # Fig. 3b: annealing schedule of aEPG.
    for k in sigmoid linear cosine; do for s in 0 1 2 3 4; do
      python -m aepg_jax.main --config=configs/imagenet_r.py:method=plain,schedule=$k,seed=$s \
        --config.model.checkpoint=$CKPT --workdir=runs/imagenet_r/f3_$k-$s
    done; done

    # Table 8: tau of the sigmoid schedule.
    for u in 4 6 8; do for s in 0 1 2 3 4; do
      python -m aepg_jax.main --config=configs/imagenet_r.py:method=plain,tau=$u,seed=$s \
        --config.model.checkpoint=$CKPT --workdir=runs/imagenet_r/t8_tau$u-$s
    done; done
"""

from aepg_jax.config import arguments


def get_config(arg=None):
    a = arguments.parse_arg(arg, tasks=10, **arguments.PAPER_ARGS)
    c = arguments.paper_config(a)
    c.data.source = "tfds"
    c.data.name = "imagenet_r"
    c.data.num_tasks = a.tasks
    # DualPrompt trains slot t in task t: its pool (10, the reference's) needs a slot per task.
    c.method.dualprompt_pool_size = max(c.method.dualprompt_pool_size, a.tasks)
    return c
