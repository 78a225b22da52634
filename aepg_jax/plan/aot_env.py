"""Where `python -m aepg_jax.plan` finds the `aot` extra (libtpu, the CUDA 13 plugin, ptxas).

The extra is never installed into training's venv: its plugins register with every jax process
(a CPU training run would print cuDNN and libtpu errors, and a GPU machine's `jax[cuda12]` would
meet a second CUDA plugin). `bash scripts/install.sh aot` puts it into `.venv-aot`, a venv of
its own beside `.venv`; when a TPU or GPU target is asked for and the extra is not importable
here, the planner re-executes itself with `.venv-aot`'s Python, or ends with one line saying how
to install it. `--target=cpu` alone needs no extra.

Runs before jax is imported (`plan/__main__.py`): the standard library and `targets.kind` only.
A `--target` that is not a target needs no extra: the planner's own parse names it.
"""

from __future__ import annotations

import importlib.util
import os
import sys
from collections.abc import Sequence
from pathlib import Path

from aepg_jax.plan import targets

AOT_VENV = ".venv-aot"
MODULES = {"tpu": "libtpu", "gpu": "jax_plugins.xla_cuda13"}
INSTALL = "bash scripts/install.sh aot"
_REEXEC = "AEPG_PLAN_AOT_REEXEC"  # set in the re-executed process: never loop


def installed(module: str) -> bool:
    """Whether `module` is importable (a submodule's missing parent counts as absent)."""
    try:
        return importlib.util.find_spec(module) is not None
    except ModuleNotFoundError:
        return False


def target_kinds(argv: Sequence[str]) -> set[str]:
    """The kinds (`tpu`, `gpu`, `cpu`) of the `--target` values on a command line."""
    values, take = [], False
    for arg in argv:
        if take:
            values.append(arg)
            take = False
        elif arg in ("--target", "-target"):
            take = True
        elif arg.startswith(("--target=", "-target=")):
            values.append(arg.split("=", 1)[1])
    return {k for k in map(targets.kind, values) if k}


def aot_python(root: Path | None = None) -> Path:
    """`.venv-aot`'s Python in the checkout this package is installed from."""
    root = root or Path(__file__).resolve().parents[2]
    return root / AOT_VENV / "bin" / "python"


def missing_modules(argv: Sequence[str]) -> list[str]:
    """The extra's modules the command line's targets need and this Python lacks."""
    kinds = target_kinds(argv)
    return [m for kind, m in MODULES.items() if kind in kinds and not installed(m)]


def ensure(argv: Sequence[str], root: Path | None = None) -> None:
    """Returns when the targets can be compiled here; otherwise re-executes the planner under
    `<root>/.venv-aot` (root: this checkout), or exits 2 with one `error:` line naming the
    install command."""
    missing = missing_modules(argv)
    if not missing:
        return
    python = aot_python(root)
    if python.is_file() and not os.environ.get(_REEXEC):
        sys.stdout.flush()
        sys.stderr.flush()
        env = {**os.environ, _REEXEC: "1"}
        os.execve(python, [str(python), "-m", "aepg_jax.plan", *argv[1:]], env)
    where = (
        f"{python} lacks it too; reinstall with `AEPG_REINSTALL=1 {INSTALL}`"
        if python.is_file()
        else f"install it with `{INSTALL}` (into {AOT_VENV}, a venv of its own that this "
        "command then uses by itself; never into training's .venv)"
    )
    print(
        f"error: --target needs the planner's aot extra ({', '.join(missing)} missing): {where}.",
        file=sys.stderr,
    )
    sys.exit(2)
