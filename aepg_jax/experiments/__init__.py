"""Experiments as data: `spec` (runs, grids, tables, plots), `paper` (every table and figure of
the paper with its published numbers), `registry` (experiments by name), `layout` (where a
sweep's runs live) and `names` (their folders' names). The package re-exports `spec`'s names,
the vocabulary of experiment files (`from aepg_jax.experiments import Experiment, Grid,
Table`).
"""

from aepg_jax.experiments.spec import (
    CONFIG_KEY,
    SEED,
    Column,
    Experiment,
    Grid,
    Plot,
    Published,
    Row,
    Run,
    Table,
    aliases,
    count,
    filter_runs,
    parse_spec,
    parse_where,
    resolve_config,
    same_value,
)

__all__ = [
    "CONFIG_KEY",
    "SEED",
    "Column",
    "Experiment",
    "Grid",
    "Plot",
    "Published",
    "Row",
    "Run",
    "Table",
    "aliases",
    "count",
    "filter_runs",
    "parse_spec",
    "parse_where",
    "resolve_config",
    "same_value",
]
