"""The run configuration: every field, its default and its validation.

The defaults and where each comes from: docs/algorithm.md §1-§7 and §10-§15.

Config files in `configs/` start from `base_config()` and override fields; the driver locks
the result, applies `--config.a.b=value` overrides and calls `validate` before anything runs.

Fields (defaults in brackets):

  trainer [continual]          the trainer `aepg_jax.main` runs: continual (this schema) or
                               scratch (train from scratch, its own schema: scratch/config.py)
  seed [0]                     every random choice of the run (PEFT and head init, data order,
                               augmentation; a random backbone) derives from it
  num_seeds [1]                S > 1: train seeds seed, seed+1, ..., seed+S-1 as one compiled
                               program (jax.vmap over per-seed state and data order); results
                               per seed in <workdir>/seed_<s>/, mean +- std in results_seeds.json
  data.source [digits]         digits | digits_domains | fashion_mnist | folder | tfds (see
                               data/datasets.py)
  data.name [None]             TFDS name, or a label for a folder dataset's cache
  data.data_dir [None]         TFDS data dir, image-folder root, or Fashion-MNIST IDX dir
  data.split_seed [0]          stratified 80/20 train/test split of digits and plain folders
  data.split_file [None]       source=folder: JSON train/test lists of <class>/<file> paths that
                               fix the split and its order (ImageNet-R: the l2p_split.json
                               `python -m aepg_jax.prepare imagenet_r` writes, the TFDS split)
  data.cache_dir [~/.cache/aepg_jax]  where decoded uint8 caches live
  data.store_size [256]        cache resolution (side of the stored square images)
  data.verify_cache [False]    re-hash cached images on load
  data.num_tasks [5]           tasks the classes are cut into (np.array_split); with
                               data.scenario=domain, the dataset's number of domains
  data.scenario [class]        class: class-incremental, each task new classes (docs/algorithm.md
                               §4) | domain: domain-incremental (§17), task t = domain t of a
                               multi-domain dataset (e.g. data.source=digits_domains), every
                               task over all its classes, one head; evaluation after task t
                               over domains 0..t; InfLoRA is refused (one head per task)
  data.class_order_seed [None] None: identity class order; int: a permutation from this seed
  data.class_order_rng [default]  the generator of that permutation: default
                               (`np.random.default_rng(seed).permutation`) | numpy_legacy
                               (`np.random.seed(seed); np.random.permutation`, PyCIL's and
                               PILOT's: seed 1993 gives their class order)
  data.label_noise [0.0]       symmetric within-task label noise rate on training labels
  data.noise_seed [0]          seed of the label noise
  data.crop_scale [(0.05, 1.0)] / data.crop_ratio [(0.75, 1.333...)] / data.flip_prob [0.5]
  input.normalize [minus_one_one]  minus_one_one ([-1, 1], augreg) | none ([0, 1], LAE's) |
                               imagenet / clip (ImageNet's / CLIP's mean and std: DINO, DINOv2,
                               CLIP weights; data/augment.py MEAN_STD)
  model.*                      see models/vit.py model_config (preset fields + peft.*)
  model.dtype [float32]        compute dtype, float32 | bfloat16 (params, loss, head: float32)
  model.preset [vit_b16]       the preset the model fields came from (informational)
  model.family [vit]           vit | dinov2 | clip: the ViT's layout and numerics (models/vit.py
                               FAMILIES): vit the augreg / timm standard ViT (IN-21K,
                               IN-21K-ft-IN-1K, DINO weights), dinov2 adds layer scale, clip a
                               pre-norm, no patch-embedding bias, QuickGELU, LayerNorm eps 1e-5
  model.weights [None]         a published backbone by name (checkpoints/catalog.py WEIGHTS,
                               docs/data.md), e.g. vit_base_patch16_clip_224.openai: its file is
                               model.checkpoint if set, else hf-hub:timm/<name> from the local
                               Hugging Face cache (never downloaded); its family must be
                               model.family; results.json records the name and the sha256
  model.init [random]          random | augreg (load model.checkpoint) | pretrained (pretrain.*)
  model.checkpoint [None]      the pretrained weights (model.init=augreg): an augreg/original ViT
                               .npz, a timm .safetensors file, or hf-hub:<repo> from the local
                               Hugging Face cache (docs/data.md); its key list and array shapes
                               are checked at validation (input_files.py)
  pretrain.dataset [fashion_mnist]  source pretraining a small backbone when model.init=pretrained
  pretrain.epochs [2] / pretrain.batch_size [128] / pretrain.learning_rate [1e-3]
  pretrain.data_dir [None]     the pretraining source's data_dir (e.g. a Fashion-MNIST IDX dir)
  pretrain.seed [0]            seed of the pretraining run: the backbone is shared by every run
                               seed, as a published checkpoint is
  pretrain.cache_dir [~/.cache/aepg_jax/pretrained]  trained backbones, reused across runs
  pretrain.shipped [True]      use the package's backbone when one was shipped for these settings
                               (the default's; fingerprint checked); False pretrains locally
  loss.name [aepg]             ce | epg | aepg | mix | focal | label_smoothing |
                               confidence_penalty | entropy_penalty (losses.py)
  loss.gamma [1.0] / loss.smoothing [0.05] / loss.beta [None: the loss's default] / loss.alpha
                               [0.5]: hyperparameters, passed only to the loss that takes them
  schedule.name [sigmoid]      sigmoid | linear | cosine | constant: alpha_t of aepg
  schedule.tau [6.0] / schedule.alpha [1.0] (constant)
  optim.learning_rate [5e-4] / optim.b1 [0.9] / optim.b2 [0.999] / optim.eps [1e-8]
  optim.batch_size [256]       global batch (a multiple of the device count)
  optim.epochs [50]            epochs per task
  optim.peft_freeze_epochs [30]  head-only epochs at the start of tasks >= 1
  optim.lr_schedule [constant] constant | cosine_annealing: lr (1 + cos(pi e / E)) / 2 in epoch
                               e (torch's CosineAnnealingLR, eta_min 0, stepped per epoch) |
                               cosine_epochs: lr * cos(99 pi k / (200 (E - 1))),
                               k = max(e - 1, 0), in epoch e = 0..E-1 (CODA-P's and InfLoRA's
                               per-epoch decay, its one-epoch lag kept), counted from each
                               optimizer label's first update in the task |
                               multistep: lr * optim.lr_decay^(number of optim.lr_milestones
                               <= e) in epoch e (torch's MultiStepLR stepped per epoch)
  optim.lr_milestones [()] / optim.lr_decay [0.1]  multistep's epochs and factor
  optim.optimizer [adam]       adam | sgd (momentum optim.momentum [0.9], torch's: APER's,
                               RanPAC's and EASE's code); b1 / b2 / eps are Adam's
  optim.weight_decay [0.0]     > 0: wd * param added to every trainable gradient first (torch's
                               coupled weight_decay of SGD / Adam, heads included)
  optim.clip_norm [0.0]        > 0: clip the gradient's global norm (over every trainable leaf)
                               to this before Adam, as torch's clip_grad_norm_; 0: off
  optim.steps_per_call [1]     >1: the task's training data lives on the device and this many
                               steps run as one jitted lax.scan (no host work between them)
  method.name [plain]          plain | lae | lwf | l2p | dualprompt | coda_prompt | inflora |
                               simplecil | aper | ease | ranpac | sd_lora | slca | hide_prompt
                               (methods/, one module each; simplecil and aper have no method.*
                               fields: APER adapts model.peft on task 0)
  method.head_init [official]  how every method's task heads start: official (the method's
                               official code's: uniform for L2P++, CODA-P, InfLoRA, EASE,
                               RanPAC; trunc_normal for DualPrompt, SLCA, HiDe-Prompt; linear
                               for SD-LoRA; normal for plain, LAE, LwF, SimpleCIL, APER:
                               docs/algorithm.md §18) | normal (kernel N(0, 0.001^2), bias 0:
                               LAE's) | uniform (kernel and bias U(+-1/sqrt(D)): torch's
                               nn.Linear) | linear (kernel U(+-sqrt(3/D)), bias 0: PILOT's
                               SimpleLinear) | trunc_normal (kernel N(0, 0.02^2) cut at +-2,
                               bias 0: timm's); it replaces CODA-P's coda_head_init
  method.<field>               each method's own fields, declared (with their defaults and
                               checks) in its module: LAE ema_decay [0.999] (offline-PEFT EMA
                               decay); LwF lwf_temperature [1.0], lwf_weight [1.0];
                               L2P++ l2p_pool_size [30], l2p_length [20] (half key, half value
                               prefix tokens), l2p_top_k [5], l2p_blocks [(0,)],
                               l2p_match_weight [1.0];
                               DualPrompt dualprompt_pool_size [10] (e-prompt slots, >= tasks),
                               dualprompt_g_length [5] / dualprompt_e_length [20] (key tokens,
                               and as many value tokens), dualprompt_g_blocks [(0, 1)],
                               dualprompt_e_blocks [(2, 3, 4)], dualprompt_pull_weight [1.0];
                               CODA-P coda_pool_size [100] (pool // data.num_tasks per task),
                               coda_length [8] (half key, half value), coda_blocks
                               [(0, 1, 2, 3, 4)], coda_ortho_weight [0.0]. Default block lists
                               are cut at model.depth (an explicit list naming a block beyond it
                               is refused); the prompt methods ignore model.peft;
                               InfLoRA inflora_blocks [(0, 1, 2, 3, 4), cut at the depth] (blocks
                               whose K/V get the per-task LoRA pairs), inflora_rank [5],
                               inflora_lamb [0.99] / inflora_lame [1.0] (memory threshold
                               (lame - lamb) t / T + lamb after task t), inflora_memory
                               [dualgpm] (dualgpm: 'remove' / 'retain' bases; gpm: 'remove'
                               only, as InfLoRA-b5's code); InfLoRA ignores model.peft too;
                               EASE ease_ffn_num [64] (per-task AdaptFormer adapter width),
                               ease_alpha [0.1] (other tasks' subspaces' weight, / t),
                               ease_beta [0.0] (the pretrained subspace's weight),
                               ease_use_init_ptm [False] (add the pretrained subspace),
                               ease_reweight [True] (False: one cosine over the concatenated
                               subspaces); EASE ignores model.peft (docs/methods.md, EASE)
                               RanPAC ranpac_m [10000] (random-projection width M: its Gram
                               matrix is M^2 float32 per seed, 400 MB at 10000, in the
                               checkpointed state; 0: no projection, the features themselves)
                               SD-LoRA sd_lora_blocks [(0, ..., 11), cut at the depth] (blocks
                               whose Q/V get the per-task LoRA), sd_lora_rank [10],
                               sd_lora_magnitude_init [0.8] (every magnitude at each task's
                               start), sd_lora_rank_steps [()] ((first_task, rank) steps of
                               SD-LoRA-RR, e.g. ((4, 8), (8, 6))); SD-LoRA ignores model.peft
                               SLCA slca_backbone_lr_scale [0.01] (the fine-tuned backbone's lr
                               / optim.learning_rate, > 0), slca_ca_epochs [5] (classifier
                               alignment epochs after tasks >= 1; 0: none), slca_ca_samples
                               [256] (features drawn per class per epoch, also the batch),
                               slca_ca_logit_norm [0.1] (per-task logit-norm temperature; 0:
                               plain logits), slca_fresh_final_norm [True] (the backbone's final
                               LayerNorm starts at scale 1, bias 0, as its code); SLCA fine-tunes
                               the whole backbone and ignores model.peft (docs/methods.md, SLCA)
                               HiDe-Prompt hide_prompt_pool_size [10], hide_prompt_length [20]
                               (key and value tokens per slot), hide_prompt_blocks
                               [(0, 1, 2, 3, 4), cut at the depth], hide_prompt_momentum
                               [0.01], hide_prompt_reg [0.5] (contrastive term),
                               hide_prompt_head_lr_scale [0.1] (heads' rate / prompts'),
                               hide_prompt_tii_hidden [2], hide_prompt_tii_epochs [20],
                               hide_prompt_tii_lr [0.0005 * 24 / 256], hide_prompt_ca_epochs
                               [30], hide_prompt_tap_lr [0.005], hide_prompt_tap_batch [120],
                               hide_prompt_tii_ca_lr [0.005 * 24 / 256],
                               hide_prompt_tii_ca_batch [24], hide_prompt_storage [covariance]
                               (| variance); HiDe-Prompt ignores model.peft (docs/methods.md)
  eval.batch_size [256]
  log_every_steps [50] / checkpoint_every_steps [0: only after each task]
  checkpoint_every_minutes [30.0]  also a checkpoint inside a task once this much wall time has
                               passed since the last: what a SIGKILL without warning can lose
                               (Ctrl-C, SIGTERM, SIGUSR1 checkpoint at once: docs/running.md);
                               0: off
  tensorboard [True]           also write metrics.jsonl's numbers and the config as TensorBoard
                               event files in the workdir (`tensorboard --logdir=WORKDIR`, or a
                               sweep's DIR for all its runs by name); False: metrics.jsonl only
  max_steps_per_task [None]    cap on steps per task (smoke tests)
  compile_cache [~/.cache/aepg_jax/xla]  JAX's persistent compilation cache: every compiled
                               program is kept there and the next run compiling it reads it
                               back (at most 2 GiB, least recently used evicted; safe to share
                               between processes and runs; results identical without it);
                               "" turns it off; the environment variable AEPG_COMPILE_CACHE
                               (a directory, or 0 for off) overrides it (docs/performance.md)
  distributed [False]          call jax.distributed.initialize() (multi-host)
"""

from __future__ import annotations

import importlib.util
import os

import ml_collections
from ml_collections import config_dict

from aepg_jax import losses, methods, schedules
from aepg_jax.config import input_files, validation
from aepg_jax.models import head, vit


def base_config(preset: str = "vit_b16") -> ml_collections.ConfigDict:
    """All fields with their defaults (see the module docstring)."""
    c = ml_collections.ConfigDict()
    c.trainer = "continual"
    c.seed = 0
    c.num_seeds = 1
    c.data = dict(
        source="digits",
        name=config_dict.placeholder(str),
        data_dir=config_dict.placeholder(str),
        split_seed=0,
        split_file=config_dict.placeholder(str),
        cache_dir="~/.cache/aepg_jax",
        store_size=256,
        verify_cache=False,
        num_tasks=5,
        scenario="class",
        class_order_seed=config_dict.placeholder(int),
        class_order_rng="default",
        label_noise=0.0,
        noise_seed=0,
        crop_scale=(0.05, 1.0),
        crop_ratio=(3 / 4, 4 / 3),
        flip_prob=0.5,
    )
    c.input = dict(normalize="minus_one_one")
    c.model = vit.model_config(preset)
    c.model.preset = preset
    c.model.init = "random"
    c.model.checkpoint = config_dict.placeholder(str)
    c.model.weights = config_dict.placeholder(str)
    c.pretrain = dict(
        dataset="fashion_mnist",
        data_dir=config_dict.placeholder(str),
        epochs=2,
        batch_size=128,
        learning_rate=1e-3,
        seed=0,
        cache_dir="~/.cache/aepg_jax/pretrained",
        shipped=True,
    )
    c.loss = dict(
        name="aepg", gamma=1.0, smoothing=0.05, beta=config_dict.placeholder(float), alpha=0.5
    )
    c.schedule = dict(name="sigmoid", tau=6.0, alpha=1.0)
    c.optim = dict(
        learning_rate=5e-4,
        b1=0.9,
        b2=0.999,
        eps=1e-8,
        batch_size=256,
        epochs=50,
        peft_freeze_epochs=30,
        lr_schedule="constant",
        clip_norm=0.0,
        steps_per_call=1,
        optimizer="adam",
        momentum=0.9,
        weight_decay=0.0,
        lr_milestones=(),
        lr_decay=0.1,
    )
    c.method = dict(name="plain", head_init=methods.OFFICIAL_HEAD_INIT, **methods.defaults())
    c.eval = dict(batch_size=256)
    c.log_every_steps = 50
    c.checkpoint_every_steps = 0
    c.checkpoint_every_minutes = 30.0
    c.tensorboard = True
    c.max_steps_per_task = config_dict.placeholder(int)
    c.distributed = False
    c.compile_cache = "~/.cache/aepg_jax/xla"  # system/xla_cache.py DEFAULT
    return c


def from_file(path: str, arg: str | None = None) -> ml_collections.ConfigDict:
    """`get_config([arg])` of the config file at `path`, as `--config=path[:arg]` builds it."""
    spec = importlib.util.spec_from_file_location(os.path.splitext(os.path.basename(path))[0], path)
    if spec is None or spec.loader is None:
        raise FileNotFoundError(f"{path} is not a Python config file.")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.get_config(arg) if arg is not None else module.get_config()


def loss_kwargs(cfg: ml_collections.ConfigDict) -> dict[str, float]:
    """The `loss.*` hyperparameters that `cfg.loss.name` accepts (unset beta: its default)."""
    return losses.config_hyperparameters(cfg.loss)


def schedule_kwargs(cfg: ml_collections.ConfigDict) -> dict[str, float]:
    """The `schedule.*` hyperparameters of `cfg.schedule.name`."""
    return schedules.config_hyperparameters(cfg.schedule)


def validate(cfg: ml_collections.ConfigDict, num_devices: int = 1) -> None:
    """Raises ValueError listing every impossible value, each with what to change (every
    float field must also be finite and within float32's range)."""
    p: list[str] = []
    validation.check(
        cfg.trainer == "continual",
        f"trainer={cfg.trainer!r}: this config schema is the continual trainer's.",
        p,
    )
    validation.float_problems(cfg, p)
    validation.data_problems(cfg, p)
    validation.model_problems(cfg, p)
    p.extend(input_files.problems(cfg))  # weights and split files: cheap reads, no arrays
    validation.pretrain_problems(cfg, p)
    validation.training_problems(cfg, num_devices, p)
    validation.check(
        cfg.method.name in methods.REGISTRY,
        f"method.name={cfg.method.name!r}: use one of {tuple(methods.REGISTRY)}.",
        p,
    )
    inits = (methods.OFFICIAL_HEAD_INIT, *head.INITS)
    validation.check(
        cfg.method.head_init in inits,
        f"method.head_init={cfg.method.head_init!r}: use one of {inits}.",
        p,
    )
    for method in methods.REGISTRY.values():  # every method's fields, whichever runs
        p.extend(method.check(cfg))
    validation.positive_ints({"log_every_steps": cfg.log_every_steps}, p)
    validation.check(
        validation.is_int(cfg.checkpoint_every_steps) and cfg.checkpoint_every_steps >= 0,
        f"checkpoint_every_steps={cfg.checkpoint_every_steps} must be >= 0 (0: per task).",
        p,
    )
    validation.check(
        cfg.checkpoint_every_minutes >= 0,
        f"checkpoint_every_minutes={cfg.checkpoint_every_minutes} must be >= 0 (0: off).",
        p,
    )
    validation.check(
        cfg.max_steps_per_task is None or cfg.max_steps_per_task >= 1,
        f"max_steps_per_task={cfg.max_steps_per_task} must be unset or >= 1.",
        p,
    )
    if p:
        raise ValueError(validation.joined(p))


def validate_against_dataset(
    cfg: ml_collections.ConfigDict,
    num_classes: int,
    domain_names: tuple[str, ...] = (),
    dataset: str = "the dataset",
) -> None:
    """Checks that need the dataset: more tasks than classes is impossible (class scenario);
    the domain scenario needs a multi-domain dataset and one task per domain."""
    d = cfg.data
    if d.scenario == "domain":
        if not domain_names:
            raise ValueError(
                "Invalid config: data.scenario=domain needs a dataset with several domains; "
                f"{dataset} has a single domain (no domain id per example); use "
                "data.scenario=class or a multi-domain source (e.g. data.source=digits_domains)."
            )
        if d.num_tasks != len(domain_names):
            raise ValueError(
                f"Invalid config: data.num_tasks={d.num_tasks} with data.scenario=domain, but "
                f"{dataset} has {len(domain_names)} domains ({', '.join(domain_names)}), one "
                f"task each; set data.num_tasks={len(domain_names)}."
            )
        return
    if cfg.data.num_tasks > num_classes:
        raise ValueError(
            f"Invalid config: data.num_tasks={cfg.data.num_tasks} exceeds the dataset's "
            f"{num_classes} classes; use data.num_tasks <= {num_classes}."
        )
