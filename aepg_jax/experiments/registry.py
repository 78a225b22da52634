"""The experiments by name: the paper's tables and figures, the demo, the baselines' papers
(`baselines.py`), the field's methods (`field_methods.py`), or a user's file.

`get` is what `--experiment=NAME` of `aepg_jax.sweep` and `aepg_jax.tables` resolves.
"""

from __future__ import annotations

import importlib.util
import pathlib

from aepg_jax.experiments import baselines, field_claims, field_methods, paper
from aepg_jax.experiments.spec import Experiment


def registry() -> dict[str, Experiment]:
    """The paper's experiments, the demo, the baselines' and the field's papers (with their
    demos) and the claim for every method (`field_claims.py`), by name."""
    every = (
        *paper.EXPERIMENTS, *baselines.EXPERIMENTS, *field_methods.EXPERIMENTS,
        *field_claims.EXPERIMENTS,
    )  # fmt: skip
    return {e.name: e for e in every}


def listing() -> str:
    """One line per registered experiment, `name  title`: what `aepg_jax.sweep --help` and the
    docs list."""
    known = registry()
    width = max(map(len, known))
    return "\n".join(f"  {name:<{width}}  {e.title}" for name, e in known.items())


def get(name: str) -> Experiment:
    """An experiment by name (or by its tables' `\\label`), or `EXPERIMENT` of a `.py` file."""
    if name.endswith(".py"):
        path = pathlib.Path(name)
        if not path.exists():
            raise ValueError(f"--experiment={name}: no such file.")
        spec = importlib.util.spec_from_file_location(f"_experiment_{path.stem}", path)
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        if not isinstance(getattr(module, "EXPERIMENT", None), Experiment):
            raise ValueError(
                f"--experiment={name}: the file defines no EXPERIMENT = Experiment(...)."
            )
        return module.EXPERIMENT
    known = registry()
    for e in known.values():
        if name == e.name or any(name == t.label for t in e.tables if t.label):
            return e
    raise ValueError(f"--experiment={name} is unknown; use one of {', '.join(known)}.")
