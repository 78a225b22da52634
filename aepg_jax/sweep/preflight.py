"""A sweep's configs before its first run: every unit's config with the user's overrides, each
validated, and its estimated cost (the order in which workers claim runs).

An override that breaks a run's config (an unknown field, a value of the wrong type, a value its
trainer's validation refuses) stops the sweep before anything runs, with one line naming the
override's error and the first run it fails for. A run whose config is broken without the
user's overrides (a grid's own override, say) is left to fail at its turn, recorded as failed.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence

from aepg_jax.config import command_line
from aepg_jax.experiments import layout
from aepg_jax.system import cli


def load_config(config_arg: str, overrides: Sequence[str]):
    """The config `aepg_jax.main --config=<config_arg> <overrides>` would run (locked, the
    overrides type-checked); a bad argument or override raises ValueError with main's line."""
    from absl import flags
    from ml_collections import config_flags

    argv = ["aepg_jax.sweep", f"--config={config_arg}", *overrides]
    values = flags.FlagValues()
    flag = config_flags.DEFINE_config_file(
        "config", None, "", flag_values=values, lock_config=True, sys_argv=argv
    )  # sys_argv: the override flags are made from these arguments, not from sys.argv
    try:
        values(argv)
        cfg = flag.value
        cfg.get("seed")  # a config file that could not be loaded raises here
    except Exception as err:
        raise ValueError(command_line.describe(argv, err)) from None
    return cfg


def _problem(unit: layout.Unit, overrides: Sequence[str], validate: Callable | None):
    """(config, None) or (None, the error line) of `unit` with `overrides`."""
    try:
        cfg = load_config(unit.config_arg, unit.overrides(overrides))
        if validate is not None:
            validate(cfg)
    except ValueError as err:
        return None, cli.one_line(str(err))
    return cfg, None


def _new_problems(problem: str, own: str | None) -> str:
    """The problems of the error line `problem` (with the user's overrides) that the run's own
    config (`own`, its error line without them, or None) does not have ("": none). Validation
    lines list their problems separated by "; "."""
    if own is None:
        return problem
    added = [part for part in problem.split("; ") if part.strip(" .") not in own]
    return "; ".join(added).rstrip(".")


@dataclasses.dataclass(frozen=True)
class Checked:
    """A unit's config with the user's overrides (None: broken by the run's own arguments)."""

    unit: layout.Unit
    cfg: object | None


def check(
    units: Sequence[layout.Unit], overrides: Sequence[str], validate: Callable | None = None
) -> list[Checked]:
    """Every unit's config with `overrides`, checked by `validate(cfg)` (raising ValueError)
    when given; raises ValueError (one line) at the first unit the user's overrides break."""
    out = []
    for unit in units:
        cfg, problem = _problem(unit, overrides, validate)
        if problem is not None and overrides:
            _, own = _problem(unit, (), validate)
            added = _new_problems(problem, own)
            if added:  # the user's overrides brought them
                raise ValueError(f"{added} (with the overrides, for run {unit.name}).")
        out.append(Checked(unit, cfg))
    return out


def trainer_validate(num_devices: int) -> Callable:
    """`validate(cfg)` as `aepg_jax.main` applies it before a run."""
    from aepg_jax import main

    def validate(cfg) -> None:
        check_fn, _ = main.select_trainer(cfg)
        check_fn(cfg, num_devices)

    return validate


def costs(checked: Sequence[Checked]) -> dict[str, float]:
    """Unit name -> estimated FLOPs (0 where it cannot be estimated: claimed last)."""
    from aepg_jax.plan import estimate

    out = {}
    for c in checked:
        flops = None
        if c.cfg is not None:
            try:
                flops = estimate.run_flops(c.cfg)
            except Exception:  # an estimate is an order, never a reason to stop a sweep
                flops = None
        out[c.unit.name] = flops or 0.0
    return out


def by_cost(units: Sequence[tuple[int, layout.Unit]], cost: dict[str, float]):
    """(position, unit) pairs, most expensive first (ties in the experiment's order)."""
    return sorted(units, key=lambda ku: -cost.get(ku[1].name, 0.0))
