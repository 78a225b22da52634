"""The paper's claim method by method: aEPG against cross-entropy for every method that trains
with a loss, on the embedded default, paired by seed, with the heads' initialisation as an axis.

`field_claims` runs `configs/claims.py` (configs/default.py with the method, loss, seed and
`method.head_init` as arguments) for plain, LAE, LwF, L2P++, DualPrompt, CODA-P, InfLoRA,
APER, EASE, RanPAC (whose loss acts in its first session only), SD-LoRA, SLCA and HiDe-Prompt,
x {CE, aEPG} x 5 seeds x {the method's official head init, N(0, 0.001^2)}. Where the official
init is N(0, 0.001^2) (plain, LAE, LwF, APER, whose task heads are unused) the two are one
init and run once. SimpleCIL is left out: nothing of it trains. Its table's paired column
(`aepg_jax.tables`, `tables/paired.py`) gives, per method and init, aEPG - CE seed by seed with
its 95% interval and wins; its rows name the init each selects.

Per-method settings beyond the default: RanPAC projects to M = 2000 (at its default 10000 the
ridge solves dominate a CPU run, as in `prototypes_demo`); HiDe-Prompt trains its prompts from
a task's first step (its reference settings, as in `field_demo`). Every method keeps
default.py's optimiser. A cell's seeds run as one vmapped program (`vmap_seeds`: one
program per method, loss and init, seed i of which is the single run of seed i;
`--no-vmap_seeds` runs each alone).
"""

from __future__ import annotations

from aepg_jax import methods
from aepg_jax.experiments.baselines import SEEDS5, Overrides
from aepg_jax.experiments.spec import Column, Experiment, Grid, Row, Table

CONFIG = "configs/claims.py"
NORMAL = "normal"
# Every method that trains with a loss, with its name in the table.
METHODS = (
    ("plain", "LoRA"), ("lae", "LAE"), ("lwf", "LwF"), ("l2p", "L2P++"),
    ("dualprompt", "DualPrompt"), ("coda_prompt", "CODA-P"), ("inflora", "InfLoRA"),
    ("aper", "APER"), ("ease", "EASE"), ("ranpac", "RanPAC"), ("sd_lora", "SD-LoRA"),
    ("slca", "SLCA"), ("hide_prompt", "HiDe-Prompt"),
)  # fmt: skip
OVERRIDES: dict[str, Overrides] = {
    "ranpac": (("method.ranpac_m", "2000"),),
    "hide_prompt": (("optim.peft_freeze_epochs", "0"),),
}


def head_inits(method: str) -> tuple[str, ...]:
    """The method's official head init and N(0, 0.001^2), once each."""
    return tuple(dict.fromkeys((methods.get(method).official_head_init, NORMAL)))


def _grids() -> list[Grid]:
    return [
        Grid(CONFIG, f"method={m},loss=ce/aepg,head_init={'/'.join(head_inits(m))},{SEEDS5}",
             f"field_claims, {name}", False, OVERRIDES.get(m, ()))
        for m, name in METHODS
    ]  # fmt: skip


def _rows() -> list[Row]:
    rows = []
    for m, name in METHODS:
        official = methods.get(m).official_head_init
        for init in head_inits(m):
            label = (
                f"{name} (official heads: {init})" if init == official else f"{name} ({init} heads)"
            )
            where = {"method": m, "head_init": init}
            rows += [
                Row(label, {**where, "loss": "ce"}),
                Row(f"{label} + aEPG", {**where, "loss": "aepg"}),
            ]
    return rows


COLUMNS = [
    Column("A_5", {"config": "claims"}, "A_T"),
    Column("Ã_5", {"config": "claims"}, "avg_inc_acc"),
    Column("ECE_5", {"config": "claims"}, "ece_T"),
]
FIELD_CLAIMS = Experiment(
    "field_claims",
    "aEPG against CE for every method that trains with a loss, on the embedded default, "
    "5 seeds, official and N(0, 0.001^2) heads",
    _grids(),
    [Table("aEPG against CE on the embedded default (digits, 5 tasks; 5 seeds; no published "
           "numbers)", _rows(), COLUMNS)],
    vmap_seeds=True,
)  # fmt: skip

EXPERIMENTS = (FIELD_CLAIMS,)
