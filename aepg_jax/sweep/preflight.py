"""A sweep's configs before its first run: every unit's config with the user's overrides, each
validated, and its estimated cost (the order in which workers claim runs).

Every check that needs no run's data is made for every run before the first starts, and any
failure stops the sweep there with one line (exit 2): an override that breaks a run's config
(an unknown field, a value of the wrong type, a value its trainer's validation refuses) is
named with the first run it fails for; a problem of the runs' own configs (Table 1 without
`--config.model.checkpoint`, say) is named once, with how many runs have it. Only what needs
the run's data (more tasks than the dataset's classes, say) fails at the run's turn.
"""

from __future__ import annotations

import dataclasses
import json
import os
import time
from collections.abc import Callable, Sequence

from aepg_jax.config import command_line
from aepg_jax.experiments import layout
from aepg_jax.runs import identity, lock
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
        return problem.rstrip(" .")
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
    when given. Raises ValueError (one line) at the first unit the user's overrides break, else
    after looking at every unit when any is broken: its problem and how many units share it."""
    out, broken = [], []
    for unit in units:
        cfg, problem = _problem(unit, overrides, validate)
        if problem is not None:
            if overrides:
                _, own = _problem(unit, (), validate)
                added = _new_problems(problem, own)
                if added:  # the user's overrides brought them
                    raise ValueError(f"{added} (with the overrides, for run {unit.name}).")
            broken.append((unit, problem))
        out.append(Checked(unit, cfg))
    if broken:
        unit, problem = broken[0]
        same = sum(1 for _, p in broken if p == problem)
        if same == len(units):
            which = f"all {len(units)} runs" if len(units) > 1 else f"run {unit.name}"
        else:
            which = f"{same} of the {len(units)} runs, e.g. {unit.name}"
        others = len(broken) - same
        more = f"; {others} more runs have other problems" if others else ""
        raise ValueError(
            f"{problem.rstrip(' .')} (for {which}{more}); nothing ran: fix it with "
            "--config.<field>=<value> or in the experiment's config file."
        )
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


def _json(cfg) -> dict:
    return json.loads(cfg.to_json_best_effort())


def with_changes(checked: Sequence[Checked], overrides: Sequence[str]) -> list[Checked]:
    """Each unit renamed by the fields in which the user's overrides change its result
    (`layout.Unit.changed`: a workdir of its own, never the experiment's run)."""
    if not overrides:
        return list(checked)
    out = []
    for c in checked:
        changed = changes(c.unit, c.cfg) if c.cfg is not None else ()
        out.append(Checked(dataclasses.replace(c.unit, changed=changed), c.cfg))
    return out


def changes(unit: layout.Unit, cfg) -> tuple[tuple[str, str], ...]:
    """The (field, value) pairs in which `cfg` (the unit's config with the user's overrides)
    changes the result of the unit's own config: its run folder's suffix. The content of the
    files the config names is not compared here: a weights file passed as an override (Table 1)
    keeps the experiment's run names, and a run folder made with other weights is a conflict."""
    from aepg_jax import main

    own = _json(load_config(unit.config_arg, unit.overrides()))
    mine = _json(cfg)
    flat = identity.flatten(mine)
    fields = identity.differences(own, mine, main.SCHEMAS, contents=False)
    return tuple((f, identity.value_text(flat.get(f))) for f in fields)


def conflicts(root: str, checked: Sequence[Checked]) -> list[tuple[layout.Unit, list[str]]]:
    """The units whose workdir holds a run (finished, or with a checkpoint) of another identity
    than the config the sweep would run (`identity.differences`, the content of the weights
    file and of a folder dataset included), with the fields that differ."""
    from aepg_jax import main

    out = []
    for c in checked:
        saved = layout.saved_config(root, c.unit) if c.cfg is not None else None
        if saved is not None:
            fields = identity.differences(saved, identity.with_inputs(_json(c.cfg)), main.SCHEMAS)
            if fields:
                out.append((c.unit, fields))
    return out


def conflict_line(root: str, found: Sequence[tuple[layout.Unit, list[str]]]) -> str:
    """One line for `conflicts`' answer: the first run, its fields, how many more, the way on."""
    unit, fields = found[0]
    more = f" (and {len(found) - 1} more runs)" if len(found) > 1 else ""
    return (
        f"{os.path.join(root, unit.name)} holds a run of another config (differs in: "
        f"{', '.join(fields)}){more}; nothing ran: pass --rerun_changed to keep such runs as "
        f"<run>{REPLACED}<time> and run this config afresh, or use another --workdir."
    )


REPLACED = ".replaced-"


def set_aside(root: str, found: Sequence[tuple[layout.Unit, list[str]]]) -> list[str]:
    """`--rerun_changed`: renames each conflicting unit's workdir to
    `<name>.replaced-<YYYYmmdd-HHMMSS>` (kept, read by nothing); the new names."""
    stamp = time.strftime("%Y%m%d-%H%M%S")
    moved = []
    for unit, _ in found:
        workdir = os.path.join(root, unit.name)
        holder = lock.running(workdir)
        if holder is not None:
            raise ValueError(
                f"{workdir} holds a run of another config and is in use ({holder.host} pid "
                f"{holder.pid}); wait for it to end, then pass --rerun_changed again."
            )
        target = f"{workdir}{REPLACED}{stamp}"
        os.replace(workdir, target)
        moved.append(target)
    return moved
