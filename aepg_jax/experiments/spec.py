"""Experiments as data: runs (a config file x a product of its arguments) and the tables and
plots that aggregate them, with the published value of every cell.

A `Grid` is one row of configs/README.md's runs table: `configs/imagenet_r.py` with
`tasks=5/10/20,method=plain,loss=ce/aepg,seed=0/1/2/3/4` is the product of the `/`-separated
values (30 runs). An `Experiment` is a list of grids, deduplicated into `Run`s, and the `Table`s
(rows x columns, each cell a selection of runs and a metric) and `Plot`s built from their
results. The paper's experiments are in `aepg_jax/experiments/paper.py`; `registry.get(name)` finds
one, or loads `EXPERIMENT` from a Python file (`--experiment=path/to/file.py`).

Each run has a workdir name, `<config stem>/<key=value,...>`: its arguments sorted (seed last),
without those that leave the config as its default (so that a run given `tau=6`, the default,
shares its workdir with the same run given no `tau`) except `method`, `loss` and `seed`, always
shown (filled in from the config file's defaults where a run does not give them: the demo's
`demo/loss=aepg,method=lae,seed=0`), and `+field=value` per grid override, or one
`+overrides-<digest>` for them where they would make the name too long for the file system
(`names.py`: APER's `cifar100/loss=ce,method=aper,peft=adapter,tasks=20,seed=0+overrides-...`).
"""

from __future__ import annotations

import dataclasses
import functools
import importlib.util
import itertools
import json
import math
import pathlib
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from aepg_jax.experiments import names

ROOT = pathlib.Path(__file__).resolve().parents[2]
SEED = "seed"
HEAD_INIT, OFFICIAL = "head_init", "official"  # `head_init=official` selects each method's own
CONFIG_KEY = "config"  # pseudo-argument of a selection: the config file's stem


def parse_spec(spec: str) -> tuple[tuple[str, tuple[str, ...]], ...]:
    """`"tasks=5/10,loss=ce"` -> `(("tasks", ("5", "10")), ("loss", ("ce",)))`."""
    pairs = []
    for piece in filter(None, (p.strip() for p in spec.split(","))):
        key, sep, values = piece.partition("=")
        if not sep or not key or not values:
            raise ValueError(f"grid spec {spec!r}: {piece!r} is not key=value[/value...].")
        pairs.append((key.strip(), tuple(v.strip() for v in values.split("/"))))
    return tuple(pairs)


def same_value(a: Any, b: Any) -> bool:
    """Argument values compare as numbers when both are numbers (`6` == `6.0`), else as text."""
    try:
        return math.isclose(float(a), float(b))
    except (TypeError, ValueError):
        return str(a) == str(b)


def resolve_config(path: str) -> pathlib.Path:
    """A config file named relative to the working directory, else to the repository root."""
    p = pathlib.Path(path)
    return p if p.is_absolute() or p.exists() else ROOT / p


@functools.cache
def _load_config_module(path: str):
    file = resolve_config(path)
    spec = importlib.util.spec_from_file_location(f"_experiment_config_{file.stem}", file)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@functools.cache
def _config_json(path: str, arg: str) -> str | None:
    """The config `path:arg` builds, as JSON; None if it does not build."""
    try:
        get_config = _load_config_module(path).get_config
        return (get_config(arg) if arg else get_config()).to_json()
    except Exception:  # a bad argument: the run itself reports it
        return None


# Arguments every run name shows, with the config field each sets: what a run is (its method
# and loss) reads from its name even where the value is the config file's default.
NAMED = {"method": "method.name", "loss": "loss.name", SEED: "seed"}


def _field(config_json: str, dotted: str):
    """The value of the field `dotted` in a config's JSON (None if it has none)."""
    value = json.loads(config_json)
    for part in dotted.split("."):
        value = value.get(part) if isinstance(value, dict) else None
    return value


def _arg_text(args: Iterable[tuple[str, str]]) -> str:
    return ",".join(f"{k}={v}" for k, v in args)


@dataclasses.dataclass(frozen=True)
class Run:
    """One run: `python -m aepg_jax.main --config=<config>:<arg> [--config.<k>=<v> ...]`."""

    config: str
    args: tuple[tuple[str, str], ...]
    overrides: tuple[tuple[str, str], ...] = ()

    @property
    def arg(self) -> str:
        return _arg_text(self.args)

    @property
    def stem(self) -> str:
        return pathlib.Path(self.config).stem

    @property
    def seed(self) -> int | None:
        value = dict(self.args).get(SEED)
        return None if value is None else int(value)

    def value(self, key: str) -> str | None:
        """The run's value of the argument `key` (or its config stem): as given, else as its
        name shows it (`NAMED`'s defaults)."""
        if key == CONFIG_KEY:
            return self.stem
        given = dict(self.args).get(key)
        return given if given is not None else dict(self.canonical_args()).get(key)

    def matches(self, where: Mapping[str, Any]) -> bool:
        """Every `key: value` of `where` is one of this run's arguments (or its config stem); a
        tuple of values: any of them (`parse_where`); `head_init=official`: its method's own."""
        return all(self._has(k, want) for k, want in where.items())

    def _has(self, key: str, want: Any) -> bool:
        v = self.value(key)
        wants = want if isinstance(want, tuple) else (want,)
        return v is not None and any(
            same_value(v, w) or same_value(v, alias(self, key, w)) for w in wants
        )

    def canonical_args(self) -> tuple[tuple[str, str], ...]:
        """The arguments that change the config, and those of `NAMED` whatever their value
        (filled in from the config when the config file takes them and the run gives none),
        sorted, seed last."""
        return _canonical_args(self)

    @property
    def name(self) -> str:
        """The run's workdir, relative to the sweep's directory."""
        return self.folder()

    def folder(self, changed: Sequence[tuple[str, str]] = ()) -> str:
        """The run's workdir with the sweep's overrides that change its result, `changed`
        ((field, value) pairs, `layout.Unit.changed`)."""
        return f"{names.stem(self.stem)}/{self._leaf(changed)[0]}"

    def digested(self, changed: Sequence[tuple[str, str]] = ()) -> tuple[tuple[str, str], ...]:
        """The (field, value) pairs that `folder(changed)` shows as `+overrides-<digest>`."""
        return self._leaf(changed)[1]

    def _leaf(self, changed, seeds: str = "") -> tuple[str, tuple[tuple[str, str], ...]]:
        args = self.canonical_args()
        if seeds:
            args = tuple(kv for kv in args if kv[0] != SEED)
        return names.leaf_and_digested(args, self.overrides, changed, seeds)

    def program_folder(self, first: int, last: int, changed: Sequence[tuple[str, str]] = ()) -> str:
        """The workdir of this run's cell's seeds `first..last` vmapped as one program."""
        leaf, _ = self._leaf(changed, f"seeds={first}-{last}")
        return f"{names.stem(self.stem)}/{leaf}"

    def program_digested(
        self, first: int, last: int, changed: Sequence[tuple[str, str]] = ()
    ) -> tuple[tuple[str, str], ...]:
        return self._leaf(changed, f"seeds={first}-{last}")[1]

    @property
    def cell_name(self) -> str:
        """The name of this run's cell (every seed): its folder's without the seed."""
        args = tuple(kv for kv in self.canonical_args() if kv[0] != SEED)
        return f"{names.stem(self.stem)}/{names.leaf(args, self.overrides)}"

    def without_seed(self) -> tuple:
        """The identity of this run's cell: everything but the seed."""
        return (self.config, tuple(kv for kv in self.args if kv[0] != SEED), self.overrides)


@functools.cache
def _canonical_args(run: Run) -> tuple[tuple[str, str], ...]:
    keep = []
    full = _config_json(run.config, run.arg)
    for key, value in run.args:
        rest = _arg_text((k, v) for k, v in run.args if k != key)
        if key in NAMED or full is None or _config_json(run.config, rest) != full:
            keep.append((key, value))
    given = dict(run.args)
    for key, field in NAMED.items():
        value = _field(full, field) if full is not None and key not in given else None
        if isinstance(value, str):  # the config file's own default, when it takes the key
            with_it = _arg_text((*run.args, (key, value)))
            if _config_json(run.config, with_it) == full:
                keep.append((key, value))
    return tuple(sorted(keep, key=lambda kv: (kv[0] == SEED, kv[0])))


@dataclasses.dataclass(frozen=True)
class Grid:
    """The runs `config:spec` (a product over the `/`-separated values of each argument).

    `label` is the row's "paper result" text in configs/README.md (`readme=False`: not listed
    there); `overrides` are `--config.<field>=<value>` pairs for every run of the grid.
    """

    config: str
    spec: str
    label: str = ""
    readme: bool = True
    overrides: tuple[tuple[str, str], ...] = ()

    def runs(self) -> list[Run]:
        pairs = parse_spec(self.spec)
        keys = [k for k, _ in pairs]
        return [
            Run(self.config, tuple(zip(keys, values, strict=True)), self.overrides)
            for values in itertools.product(*(v for _, v in pairs))
        ]


@dataclasses.dataclass(frozen=True)
class Published:
    """A number as the paper prints it: mean and ± (None where it gives none)."""

    mean: float
    pm: float | None = None
    decimals: int = 1  # as printed

    @classmethod
    def parse(cls, text: str | None) -> Published | None:
        """`"71.1±0.4"` -> (71.1, 0.4, 1 decimal); `"75.9"` -> (75.9, None); `""` / `"-"` /
        None -> None."""
        if text is None or text.strip() in ("", "-"):
            return None
        mean, _, pm = (part.strip() for part in text.partition("±"))
        decimals = len(mean.partition(".")[2])
        return cls(float(mean), float(pm) if pm else None, decimals)


@dataclasses.dataclass(frozen=True)
class Column:
    """A column: a selection of runs (`where`), the metric read from their results, and labels
    for markdown / csv (`label`) and LaTeX (`latex`, default `label`). `metric` is a scalar
    key of results.json (`A_T`, `avg_inc_acc`, `forgetting`, `forgetting_stepwise`, `bwt`,
    `acc_pooled_T`, `task_incremental_A_T`, `task_incremental_avg_inc_acc`, the calibration's
    `ece_T`, `nll_T`, `test_entropy_T`, ...) or `H_T`."""

    label: str
    where: Mapping[str, Any]
    metric: str = "A_T"
    latex: str = ""


@dataclasses.dataclass(frozen=True)
class Row:
    """A row: its label, its selection of runs, the published value of each column (in the
    table's column order; `""` where the paper has none)."""

    label: str
    where: Mapping[str, Any]
    paper: Sequence[str] = ()


@dataclasses.dataclass(frozen=True)
class Table:
    title: str
    rows: Sequence[Row]
    columns: Sequence[Column]
    label: str = ""  # the paper's \label, e.g. tab:sota
    # Where the published cells were read when not in the paper itself (a reprint, the
    # official logs), printed under the table; "" for the paper's own.
    source: str = ""

    def published(self, row: Row, col: Column) -> Published | None:
        i = list(self.columns).index(col)
        return Published.parse(row.paper[i]) if i < len(row.paper) else None


@dataclasses.dataclass(frozen=True)
class Plot:
    """A figure from the runs' results: `metric` (mean ± std over seeds) against the argument
    `x`, one line per value of `series`, one panel per value of `panel` (arguments or
    `config`); with `x="task"` (or `"epoch"`) the metric is a per-task (per-epoch) list in
    results.json (`A_t`, `entropy`, `test_acc`), drawn as curves."""

    file: str
    metric: str
    x: str
    series: str | None = None
    panel: str | None = None
    where: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    title: str = ""
    ylabel: str = ""


@dataclasses.dataclass(frozen=True)
class Experiment:
    """Grids with the tables and plots made of them; `parts`: experiments whose grids, tables
    and plots this one runs together (each table still reads only its own part's runs);
    `vmap_seeds`: the sweep runs a cell's consecutive seeds as one program unless told not to
    (`--no-vmap_seeds`)."""

    name: str
    title: str
    grids: Sequence[Grid] = ()
    tables: Sequence[Table] = ()
    plots: Sequence[Plot] = ()
    parts: Sequence[Experiment] = ()
    vmap_seeds: bool = False

    def all_grids(self) -> list[Grid]:
        return [*self.grids, *(g for p in self.parts for g in p.all_grids())]

    def runs(self) -> list[Run]:
        """The grids' runs in order, each workdir once (what a sweep runs)."""
        seen: dict[str, Run] = {}
        for grid in self.all_grids():
            for run in grid.runs():
                seen.setdefault(run.name, run)
        return list(seen.values())

    def select(self, where: Mapping[str, Any]) -> list[Run]:
        """The runs of this experiment's own grids given `where` in their arguments, each
        workdir once (Table 8's `tau=6` selects its runs, though they are Table 3's too)."""
        seen: dict[str, Run] = {}
        for grid in self.grids:
            for run in grid.runs():
                if run.matches(where):
                    seen.setdefault(run.name, run)
        return list(seen.values())

    def sections(self) -> list[tuple[Experiment, Sequence[Table], Sequence[Plot]]]:
        """(experiment, its tables, its plots) for this one and each part."""
        own = [(self, self.tables, self.plots)] if self.tables or self.plots else []
        return own + [s for p in self.parts for s in p.sections()]


def alias(run: Run, key: str, value: Any) -> Any:
    """The value `value` of a selection's `key` stands for in `run`: `head_init=official`, the
    head init of the run's method's official code (`Method.official_head_init`); else itself."""
    if key == HEAD_INIT and value == OFFICIAL and (method := run.value("method")):
        from aepg_jax import methods

        return methods.get(method).official_head_init if method in methods.REGISTRY else value
    return value


def aliases(key: str) -> tuple[str, ...]:
    """The values of `key` that a selection may give besides the runs' own (`alias`)."""
    return (OFFICIAL,) if key == HEAD_INIT else ()


def parse_where(where: str | None) -> dict[str, tuple[str, ...]]:
    """`"loss=ce,seed=0/1/2"` -> `{"loss": ("ce",), "seed": ("0", "1", "2")}`: a run
    matches when it has one of each key's `/`-separated values (a grid spec's syntax)."""
    selection: dict[str, tuple[str, ...]] = {}
    for piece in filter(None, (where or "").split(",")):
        key, sep, values = piece.partition("=")
        if not sep or not key.strip():
            raise ValueError(f"--where={where}: {piece!r} is not key=value[/value...].")
        selection[key.strip()] = tuple(v.strip() for v in values.split("/"))
    return selection


def filter_runs(runs: Sequence[Run], where: str | None) -> list[Run]:
    """The runs whose arguments match `where`, `"key=value[/value...],..."` (`config=<stem>`
    too; `parse_where`)."""
    if not where:
        return list(runs)
    selection = parse_where(where)
    return [r for r in runs if r.matches(selection)]


def count(grids: Sequence[Grid]) -> int:
    """The number of runs of `grids` (before identical ones are merged)."""
    return sum(math.prod(len(v) for _, v in parse_spec(g.spec)) for g in grids)
