"""The paper's experiments as data: the runs of every table and figure and its published numbers.

Runs are configs/README.md's runs table (`tests/test_paper.py` checks that the table, and through
it the config docstrings' loops, list exactly these grids). Published values are transcribed from
`aepg_paper.tex` as printed, `"mean±pm"` (`""`: no published value; Table 1's "+ aEPG" rows of the
prompt methods and InfLoRA are ours). Table numbers are the project's (configs/README.md):
Table 4 train from scratch, Table 6 label noise, Table 8 tau. `A` is the driver's `A_T`, `Ã` its
`avg_inc_acc`; Table 4 reports the best test accuracy over the 350 epochs (its Fig. 4 caption
gives the same numbers as "best test accuracy"). `demo` runs on the embedded offline data.
"""

from __future__ import annotations

from aepg_jax.experiments import Column, Experiment, Grid, Plot, Row, Table

IMR, FOOD, CUB, CLRS = (
    "configs/imagenet_r.py",
    "configs/food101.py",
    "configs/cub200.py",
    ("configs/clrs25.py"),
)
SEEDS5, SEEDS3 = "seed=0/1/2/3/4", "seed=0/1/2"
REGULARISERS = "ce/focal/label_smoothing/confidence_penalty/epg/aepg/entropy_penalty"


def _acc_columns(stem: str, name: str, tasks: int, where: dict | None = None) -> list[Column]:
    """A_T and Ã_T of one dataset (and task count)."""
    where = {"config": stem, **(where or {})}
    prefix = f"{name} " if name else ""
    return [
        Column(f"{prefix}A_{tasks}", where, "A_T", f"{prefix}$A_{{{tasks}}}$"),
        Column(f"{prefix}Ã_{tasks}", where, "avg_inc_acc", f"{prefix}$\\tilde{{A}}_{{{tasks}}}$"),
    ]


# ---------------------------------------------------------------------------------- Table 1
T1_GRIDS = (
    Grid(
        IMR,
        f"tasks=5/10/20,peft=lora,method=plain,loss=ce/aepg,{SEEDS5}",
        "Table 1 (`tab:sota`), ImageNet-R, LoRA and LoRA + aEPG",
    ),
    Grid(
        IMR,
        f"tasks=5/10/20,peft=lora,method=lwf,loss=ce/aepg,{SEEDS5}",
        "Table 1, LwfLoRA and LwfLoRA + aEPG",
    ),
    Grid(
        IMR,
        f"tasks=5/10/20,peft=lora,method=lae,loss=ce/aepg,{SEEDS5}",
        "Table 1, LAE and LAE + aEPG",
    ),
    Grid(
        IMR,
        f"tasks=5/10/20,method=l2p/dualprompt/coda_prompt,loss=ce/aepg,{SEEDS5}",
        "Table 1, L2P (L2P++), DualPrompt, CODA-Prompt (and each + aEPG), each with its "
        "reference settings",
    ),
    Grid(
        IMR,
        f"tasks=5/10/20,method=inflora,loss=ce/aepg,{SEEDS5}",
        "Table 1, InfLoRA (and InfLoRA + aEPG), reference settings",
    ),
)


def _m(method: str, loss: str) -> dict:
    return {"method": method, "loss": loss}


TABLE1 = Table(
    "Table 1: continual PEFT methods on Split-ImageNet-R (5 seeds)",
    label="tab:sota",
    columns=[c for t in (5, 10, 20) for c in _acc_columns("imagenet_r", "", t, {"tasks": t})],
    rows=[
        Row("L2P", _m("l2p", "ce"),
            "71.1±0.4 77.0±0.7 69.3±0.3 76.8±0.7 65.6±0.3 74.2±1.0".split()),
        Row("L2P + aEPG", _m("l2p", "aepg")),
        Row("DualPrompt", _m("dualprompt", "ce"),
            "72.9±0.3 76.0±0.3 71.2±0.1 75.4±0.1 71.2±0.1 74.8±0.1".split()),
        Row("DualPrompt + aEPG", _m("dualprompt", "aepg")),
        Row("Coda-Prompt", _m("coda_prompt", "ce"),
            "76.5±0.5 81.8±0.7 75.0±0.4 81.6±0.7 71.5±0.4 79.0±1.0".split()),
        Row("Coda-Prompt + aEPG", _m("coda_prompt", "aepg")),
        Row("InfLoRA", _m("inflora", "ce"),
            "76.8±0.4 80.8±0.3 74.2±0.1 79.5±0.2 68.6±0.5 74.8±0.4".split()),
        Row("InfLoRA + aEPG", _m("inflora", "aepg")),
        Row("LoRA", _m("plain", "ce"),
            "74.8±0.0 79.8±0.1 74.3±0.1 79.2±0.3 73.2±0.1 78.7±0.0".split()),
        Row("LoRA + aEPG", _m("plain", "aepg"),
            "77.2±0.0 81.9±0.0 75.8±0.3 80.9±0.0 74.1±0.2 79.7±0.2".split()),
        Row("LwfLoRA", _m("lwf", "ce"),
            "76.3±0.2 80.4±0.2 75.0±0.2 79.7±0.2 73.3±0.3 78.6±0.1".split()),
        Row("LwfLoRA + aEPG", _m("lwf", "aepg"),
            "78.1±0.2 81.8±0.1 76.2±0.2 80.8±0.2 74.3±0.2 79.7±0.1".split()),
        Row("LAE", _m("lae", "ce"),
            "76.1±0.2 80.6±0.1 75.4±0.0 79.9±0.3 73.9±0.3 79.2±0.1".split()),
        Row("LAE + aEPG", _m("lae", "aepg"),
            "78.3±0.1 82.3±0.0 76.7±0.3 81.4±0.2 75.0±0.3 80.0±0.1".split()),
    ],
)  # fmt: skip

# ---------------------------------------------------------------------------------- Table 2
LAE_SPEC = f"peft=lora/adapter/prefix,method=lae,loss=ce/aepg,{SEEDS3}"
T2_GRIDS = (
    Grid(FOOD, LAE_SPEC, "Table 2 (`tab:lae`), Split-Food101, LAE vs LAE + aEPG x 3 PEFT"),
    Grid(CUB, LAE_SPEC, "Table 2, Split-CUB200"),
    Grid(CLRS, LAE_SPEC, "Table 2, CLRS25"),
)
DATASETS_2 = [("food101", "Food101", 10), ("cub200", "CUB200", 10), ("clrs25", "CLRS25", 5)]
TABLE2 = Table(
    "Table 2: aEPG across datasets and PEFT modules, LAE (3 seeds)",
    label="tab:lae",
    columns=[c for stem, name, t in DATASETS_2 for c in _acc_columns(stem, name, t)],
    rows=[
        Row("LoRA LAE", {"peft": "lora", "loss": "ce"},
            "83.2±0.1 88.8±0.0 82.7±0.3 85.8±0.3 73.0±0.6 82.9±0.3".split()),
        Row("LoRA LAE+aEPG", {"peft": "lora", "loss": "aepg"},
            "84.7±0.0 89.7±0.1 84.1±0.2 86.3±0.2 74.8±0.5 84.5±0.4".split()),
        Row("Adapter LAE", {"peft": "adapter", "loss": "ce"},
            "83.6±0.2 88.9±0.1 82.2±0.1 85.7±0.2 70.3±1.7 81.0±1.0".split()),
        Row("Adapter LAE+aEPG", {"peft": "adapter", "loss": "aepg"},
            "85.0±0.1 89.7±0.1 83.9±0.2 86.3±0.1 74.1±0.5 83.5±0.3".split()),
        Row("Prefix LAE", {"peft": "prefix", "loss": "ce"},
            "82.9±0.1 88.7±0.1 80.7±0.1 84.5±0.1 68.8±0.7 80.0±0.5".split()),
        Row("Prefix LAE+aEPG", {"peft": "prefix", "loss": "aepg"},
            "84.4±0.1 89.4±0.1 81.0±0.3 84.5±0.3 71.9±0.7 82.0±0.5".split()),
    ],
)  # fmt: skip

# ---------------------------------------------------------------------------------- Table 3
T3_GRIDS = (
    Grid(
        IMR,
        f"tasks=10,peft=lora,method=plain,loss={REGULARISERS},{SEEDS5}",
        "Table 3 (`tab:focal_all`), entropy regularisers, Split-ImageNet-R",
    ),
    Grid(FOOD, f"peft=lora,method=plain,loss={REGULARISERS},{SEEDS5}", "Table 3, Split-Food101"),
    Grid(CUB, f"peft=lora,method=plain,loss={REGULARISERS},{SEEDS5}", "Table 3, Split-CUB200"),
    Grid(CLRS, f"peft=lora,method=plain,loss={REGULARISERS},{SEEDS5}", "Table 3, CLRS25"),
)
DATASETS_3 = [("imagenet_r", "ImageNet-R", 10), *DATASETS_2]
TABLE3 = Table(
    "Table 3: entropy regularisation, LoRA (5 seeds)",
    label="tab:focal_all",
    columns=[c for stem, name, t in DATASETS_3 for c in _acc_columns(stem, name, t)],
    rows=[
        Row("CE", {"loss": "ce"},
            "74.1±0.4 79.3±0.3 83.2±0.2 88.8±0.2 83.3±0.2 86.2±0.1 74.2±0.8 83.9±0.2".split()),
        Row("Focal", {"loss": "focal"},
            "72.4±0.3 77.9±0.3 82.7±0.3 88.4±0.2 82.9±0.3 86.1±0.2 73.0±0.9 82.5±0.4".split()),
        Row("LS", {"loss": "label_smoothing"},
            "70.6±0.2 76.7±0.2 77.5±0.4 85.2±0.2 82.9±0.2 86.6±0.2 74.8±1.1 85.1±0.5".split()),
        Row("CP", {"loss": "confidence_penalty"},
            "72.4±0.8 77.9±0.7 83.0±0.2 88.9±0.2 83.3±0.3 86.5±0.2 74.0±1.0 83.9±0.3".split()),
        Row("EPG", {"loss": "epg"},
            "75.1±0.4 80.0±0.2 83.5±0.3 88.9±0.2 84.2±0.1 85.9±0.1 74.6±0.8 84.3±0.7".split()),
        Row("aEPG", {"loss": "aepg"},
            "75.5±0.1 80.9±0.1 84.4±0.1 89.5±0.1 84.7±0.3 86.7±0.1 76.3±0.4 85.5±0.3".split()),
        Row("EP", {"loss": "entropy_penalty"},
            "75.1±0.2 80.4±0.3 84.0±0.2 89.2±0.2 85.0±0.2 87.2±0.1 74.8±0.8 84.6±0.5".split()),
    ],
)  # fmt: skip

# ---------------------------------------------------------------------- Table 6: label noise
T6_GRIDS = (
    Grid(
        IMR,
        f"tasks=10,peft=lora,method=plain,loss=ce/aepg,noise=0.2,{SEEDS3}",
        "Table 6 (`tab:label_noise`), 20% label noise, S-ImageNet-R",
    ),
    Grid(CUB, f"peft=lora,method=plain,loss=ce/aepg,noise=0.2,{SEEDS3}", "Table 6, S-CUB200"),
    Grid(CLRS, f"peft=lora,method=plain,loss=ce/aepg,noise=0.2,{SEEDS3}", "Table 6, CLRS25"),
)
TABLE6 = Table(
    "Table 6: 20% symmetric label noise, A_T (3 seeds)",
    label="tab:label_noise",
    columns=[
        Column("S-ImageNet-R", {"config": "imagenet_r"}),
        Column("S-CUB200", {"config": "cub200"}),
        Column("CLRS25", {"config": "clrs25"}),
    ],
    rows=[
        Row("CE", {"loss": "ce"}, ["70.6±0.1", "79.5±0.3", "67.7±1.2"]),
        Row("aEPG", {"loss": "aepg"}, ["73.8±0.2", "81.3±0.0", "73.4±1.9"]),
    ],
)

# ---------------------------------------------------------------------------- Table 8: tau
T8_GRIDS = (
    Grid(
        IMR,
        f"tasks=10,peft=lora,method=plain,loss=aepg,tau=4/6/8,{SEEDS5}",
        "Table 8 (`tab:tau`), tau, Split-ImageNet-R",
    ),
    Grid(CLRS, f"peft=lora,method=plain,loss=aepg,tau=4/6/8,{SEEDS5}", "Table 8, CLRS25"),
)
TABLE8 = Table(
    "Table 8: tau of the sigmoid schedule, A_T (the paper gives no ±)",
    label="tab:tau",
    columns=[
        Column("Split-ImageNet-R", {"config": "imagenet_r"}),
        Column("CLRS25", {"config": "clrs25"}),
    ],
    rows=[
        Row("tau = 4", {"tau": 4}, ["75.9", "76.3"]),
        Row("tau = 6", {"tau": 6}, ["75.9", "76.2"]),
        Row("tau = 8", {"tau": 8}, ["75.6", "76.5"]),
    ],
)

# ------------------------------------------------------------------- Table 4: from scratch
T4_GRIDS = (
    Grid(
        "configs/cifar_scratch.py",
        f"dataset=cifar10/cifar100,alpha=0/0.2/0.5/1,{SEEDS3}",
        "Table 4 (`tab:train-from-scratch`), ResNet-50 from scratch, CIFAR-10 and CIFAR-100",
    ),
)
SCRATCH_COLUMNS = [
    Column("CIFAR100", {"dataset": "cifar100"}, "best_test_acc"),
    Column("CIFAR10", {"dataset": "cifar10"}, "best_test_acc"),
]
TABLE4 = Table(
    "Table 4: ResNet-50 trained from scratch, best test accuracy (3 seeds)",
    label="tab:train-from-scratch",
    columns=SCRATCH_COLUMNS,
    rows=[
        Row("alpha = 0", {"alpha": 0}, ["7.32±0.70", "92.22±0.51"]),
        Row("alpha = 0.2", {"alpha": 0.2}, ["80.80±0.13", "95.81±0.05"]),
        Row("alpha = 0.5", {"alpha": 0.5}, ["79.95±0.20", "95.62±0.08"]),
        Row("alpha = 1 (CE)", {"alpha": 1}, ["77.95±0.78", "95.31±0.18"]),
    ],
)
# Fig. 4's caption: "Best test accuracy: 81% vs. 78%" (CIFAR-100, alpha 0.2 vs CE).
TABLE_FIG4 = Table(
    "Fig. 4: CIFAR-100 from scratch, best test accuracy as the caption states it",
    label="fig:train_scratch",
    columns=SCRATCH_COLUMNS[:1],
    rows=[
        Row("alpha = 0.2", {"alpha": 0.2}, ["81"]),
        Row("alpha = 1 (CE)", {"alpha": 1}, ["78"]),
    ],
)

# --------------------------------------------------------------------------------- Figures
F1_LABEL = "Fig. 1 (`fig:epg_entropy`), entropy of EPG vs CE, Food101 and ImageNet-R 10 tasks"
F1_GRIDS = (
    Grid(FOOD, f"method=plain,loss=ce/epg,{SEEDS5}", F1_LABEL),
    Grid(IMR, f"tasks=10,method=plain,loss=ce/epg,{SEEDS5}", F1_LABEL),
)
F3A_GRIDS = (
    Grid(
        IMR,
        f"tasks=10,method=plain,loss=mix,alpha=0/0.2/0.4/0.6/0.8/1,{SEEDS5}",
        "Fig. 3a (`fig:alpha`), fixed alpha",
    ),
)
F3B_GRIDS = (
    Grid(
        IMR,
        f"tasks=10,method=plain,loss=aepg,schedule=sigmoid/linear/cosine,{SEEDS5}",
        "Fig. 3b, alpha schedule",
    ),
)
F6_GRIDS = (
    Grid(
        IMR,
        f"tasks=10,method=plain,loss=focal,gamma=0.5/1/2,{SEEDS5}",
        "Fig. 6 (`fig:focal_entropy_strength`), focal loss strength",
    ),
    Grid(
        IMR,
        f"tasks=10,method=plain,loss=label_smoothing,smoothing=0.01/0.05/0.1,{SEEDS5}",
        "Fig. 6, label smoothing strength",
    ),
    Grid(
        IMR,
        f"tasks=10,method=plain,loss=confidence_penalty,beta=0.1/0.2,{SEEDS5}",
        "Fig. 6, confidence penalty strength",
    ),
)


def _one_column_table(title: str, label: str, key: str, values, prefix: str = "") -> Table:
    cols = _acc_columns("imagenet_r", "", 10)
    return Table(
        title, label=label, columns=cols, rows=[Row(f"{prefix}{v}", {key: v}) for v in values]
    )


def _per_loss_table(title: str, label: str, stems) -> Table:
    columns = [
        c
        for stem, name, t in DATASETS_3
        if stem in stems
        for c in [*_acc_columns(stem, name, t), Column(f"{name} H_{t}", {"config": stem}, "H_T")]
    ]
    return Table(
        title,
        label=label,
        columns=columns,
        rows=[Row(lo.upper(), {"loss": lo}) for lo in ("ce", "epg")],
    )


_CURVES = dict(x="task", series="loss")
EXPERIMENTS = (
    Experiment("table1", "Table 1 (tab:sota): Split-ImageNet-R, 5/10/20 tasks", T1_GRIDS, [TABLE1]),
    Experiment("table2", "Table 2 (tab:lae): LAE x PEFT x datasets", T2_GRIDS, [TABLE2]),
    Experiment("table3", "Table 3 (tab:focal_all): entropy regularisers", T3_GRIDS, [TABLE3]),
    Experiment("table4", "Table 4 (tab:train-from-scratch): ResNet-50 on CIFAR", T4_GRIDS,
               [TABLE4]),
    Experiment("table6", "Table 6 (tab:label_noise): 20% label noise", T6_GRIDS, [TABLE6]),
    Experiment("table8", "Table 8 (tab:tau): tau of the sigmoid schedule", T8_GRIDS, [TABLE8]),
    Experiment(
        "fig1", "Fig. 1 (fig:epg_entropy): output entropy, CE vs EPG", F1_GRIDS,
        [_per_loss_table("Fig. 1: CE vs EPG, accuracy and final entropy H_T",
                         "fig:epg_entropy", ("food101", "imagenet_r"))],
        [Plot("fig1_entropy.png", "entropy", panel="config", ylabel="entropy (nats)",
              title="Fig. 1: entropy after each task", **_CURVES)],
    ),
    Experiment(
        "fig2", "Fig. 2 (fig:focal_imagenet-r): accuracy and entropy curves, ImageNet-R",
        T3_GRIDS[:1], [],
        [Plot("fig2_accuracy.png", "A_t", ylabel="A_t (%)", title="Fig. 2a", **_CURVES),
         Plot("fig2_entropy.png", "entropy", ylabel="entropy (nats)", title="Fig. 2b",
              **_CURVES)],
    ),
    Experiment(
        "fig3a", "Fig. 3a (fig:alpha): fixed alpha", F3A_GRIDS,
        [_one_column_table("Fig. 3a: fixed alpha of alpha CE + (1 - alpha) EPG", "fig:alpha",
                           "alpha", ("0", "0.2", "0.4", "0.6", "0.8", "1"), "alpha = ")],
        [Plot("fig3a_alpha.png", "A_T", x="alpha", ylabel="A_10 (%)",
              title="Fig. 3a: A_T against the fixed alpha")],
    ),
    Experiment(
        "fig3b", "Fig. 3b: alpha schedule of aEPG", F3B_GRIDS,
        [_one_column_table("Fig. 3b: the alpha schedule of aEPG", "", "schedule",
                           ("sigmoid", "linear", "cosine"))],
        [Plot("fig3b_schedule.png", "A_T", x="schedule", ylabel="A_10 (%)",
              title="Fig. 3b: A_T per schedule")],
    ),
    Experiment(
        "fig4", "Fig. 4 (fig:train_scratch): from scratch, curves", T4_GRIDS, [TABLE_FIG4],
        [Plot("fig4_test_acc.png", "test_acc", x="epoch", series="alpha",
              where={"dataset": "cifar100"}, ylabel="test accuracy (%)", title="Fig. 4a"),
         Plot("fig4_test_entropy.png", "test_entropy", x="epoch", series="alpha",
              where={"dataset": "cifar100"}, ylabel="test entropy (nats)", title="Fig. 4b")],
    ),
    Experiment(
        "fig5", "Fig. 5 (fig:focal_food101): accuracy and entropy curves, Food101",
        T3_GRIDS[1:2], [],
        [Plot("fig5_accuracy.png", "A_t", ylabel="A_t (%)", title="Fig. 5a", **_CURVES),
         Plot("fig5_entropy.png", "entropy", ylabel="entropy (nats)", title="Fig. 5b",
              **_CURVES)],
    ),
    Experiment(
        "fig6", "Fig. 6 (fig:focal_entropy_strength): regularisation strength", F6_GRIDS,
        [Table("Fig. 6: regularisation strength", label="fig:focal_entropy_strength",
               columns=_acc_columns("imagenet_r", "", 10),
               rows=[Row(f"{name} {k} = {v}", {"loss": loss, k: v})
                     for loss, name, k, vals in (
                         ("focal", "focal", "gamma", ("0.5", "1", "2")),
                         ("label_smoothing", "LS", "smoothing", ("0.01", "0.05", "0.1")),
                         ("confidence_penalty", "CP", "beta", ("0.1", "0.2")))
                     for v in vals])],
        [Plot("fig6_focal.png", "A_T", x="gamma", where={"loss": "focal"}, ylabel="A_10 (%)",
              title="Fig. 6a: focal loss gamma"),
         Plot("fig6_ls.png", "A_T", x="smoothing", where={"loss": "label_smoothing"},
              ylabel="A_10 (%)", title="Fig. 6b: label smoothing"),
         Plot("fig6_cp.png", "A_T", x="beta", where={"loss": "confidence_penalty"},
              ylabel="A_10 (%)", title="Fig. 6c: confidence penalty beta")],
    ),
)  # fmt: skip

DEMO = Experiment(
    "demo",
    "Demo: digits, tiny ViT, short schedule (configs/demo.py), CE vs aEPG x 3 methods x 3 seeds",
    [Grid("configs/demo.py", "method=plain/lae/coda_prompt,loss=ce/aepg,seed=0/1/2", readme=False)],
    [
        Table(
            "Demo (digits, 5 tasks; no published numbers)",
            # ECE after the last task (%, docs/algorithm.md §4): is aEPG's confidence calibrated?
            columns=[*_acc_columns("demo", "", 5), Column("ECE_5", {"config": "demo"}, "ece_T")],
            rows=[
                Row(f"{name}{' + aEPG' if loss == 'aepg' else ''}", _m(method, loss))
                for method, name in (("plain", "LoRA"), ("lae", "LAE"), ("coda_prompt", "CODA-P"))
                for loss in ("ce", "aepg")
            ],
        )
    ],
)

# Backbones as an axis (not in the paper): ImageNet-R, 10 tasks, LoRA and LAE, CE and aEPG on
# five published ViT-B backbones (aepg_jax/checkpoints/catalog.py, docs/data.md), 3 seeds.
BACKBONE_WEIGHTS = (
    ("vit_base_patch16_224.augreg_in21k", "IN-21K"),
    ("vit_base_patch16_224.augreg_in21k_ft_in1k", "IN-21K-ft-IN-1K"),
    ("vit_base_patch16_224.dino", "DINO"),
    ("vit_base_patch14_dinov2.lvd142m", "DINOv2"),
    ("vit_base_patch16_clip_224.openai", "CLIP"),
)
BACKBONES = Experiment(
    "backbones",
    "Backbones: ImageNet-R 10 tasks, LoRA and LAE, CE vs aEPG, on five published ViT-B weights",
    [
        Grid(
            IMR,
            "tasks=10,weights="
            + "/".join(w for w, _ in BACKBONE_WEIGHTS)
            + f",peft=lora,method=plain/lae,loss=ce/aepg,{SEEDS3}",
            "Backbones (ours, no published numbers)",
            readme=False,
        )
    ],
    [
        Table(
            f"Backbones: Split-ImageNet-R, 10 tasks, A_10 per weights (3 seeds; no published "
            f"numbers){'' if m == 'A_T' else ', average incremental accuracy'}",
            columns=[
                Column(label, {"config": "imagenet_r", "weights": w}, m)
                for w, label in BACKBONE_WEIGHTS
            ],
            rows=[
                Row(f"{name}{' + aEPG' if loss == 'aepg' else ''}", _m(method, loss))
                for method, name in (("plain", "LoRA"), ("lae", "LAE"))
                for loss in ("ce", "aepg")
            ],
        )
        for m in ("A_T", "avg_inc_acc")
    ],
)

# Every paper run at once (each workdir once: identical configs are shared).
PAPER = Experiment("paper", "Every table and figure of the paper", parts=EXPERIMENTS)
EXPERIMENTS = (*EXPERIMENTS, PAPER, DEMO, BACKBONES)
