"""The command line of `python -m aepg_jax.main` (and `plan`): absl flags plus the config.

`parse_flags(argv)` is their flags parser: a missing or broken config file, a config argument
its `get_config(arg)` refuses, an unknown `--config.` field (the "did you mean" hint kept), an
unknown flag (config fields named like it suggested), a value of the wrong type or a config file
that imports a module name of the flat layout (`from aepg_jax import config_lib`: refused,
naming the last version that reads it, `FLAT_NAMES_COMMIT`) each end the process with exit
code 2 and one `error: ...` line on stderr (`system.cli.fail`); `--help` exits 0.
"""

from __future__ import annotations

import difflib
import os
import re

from absl import app, flags

from aepg_jax.config import schema
from aepg_jax.system.cli import fail, one_line

REQUIRED = {
    "config": "--config is required: --config=configs/<name>.py[:args], e.g. "
    "--config=configs/default.py.",
    "workdir": "--workdir is required: the run's directory (config, metrics, checkpoints, "
    "results), e.g. --workdir=runs/default; the same one again resumes the run.",
}


# The last commit of aepg_jax whose config and experiment files import the flat layout's
# module names (`from aepg_jax import config_lib`).
FLAT_NAMES_COMMIT = "67ddf42"
# Each old flat module name -> the module that holds it now (for the refusal's hint only).
OLD_NAMES = {
    "config_lib": "aepg_jax.config.schema",
    "config_args": "aepg_jax.config.arguments",
    "config_checks": "aepg_jax.config.validation",
    "input_files": "aepg_jax.config.input_files",
    "paper": "aepg_jax.experiments.paper",
    "sweep_layout": "aepg_jax.experiments.layout",
    "sweep_claims": "aepg_jax.sweep.claims",
    "sweep_configs": "aepg_jax.sweep.preflight",
    "sweep_status": "aepg_jax.sweep.overview",
    "table_plots": "aepg_jax.tables.plots",
    "hosts": "aepg_jax.system.hosts",
    "cli": "aepg_jax.system.cli",
    "compiles": "aepg_jax.system.compiles",
    "environment": "aepg_jax.system.environment",
    "memory": "aepg_jax.system.memory",
    "progress": "aepg_jax.system.progress",
    "partition": "aepg_jax.models.partition",
    "pretrain": "aepg_jax.pretraining.pretrain",
}
_OLD_NAME = re.compile(
    r"cannot import name '(\w+)' from 'aepg_jax'"  # from aepg_jax import config_lib
    r"|No module named 'aepg_jax\.(\w+)'"  # import aepg_jax.config_lib / from it import x
    r"|module 'aepg_jax' has no attribute '(\w+)'"  # import aepg_jax; aepg_jax.config_lib
)


def _importing_file(err: BaseException) -> str | None:
    """The file whose code raised `err` (or the error it was raised from): the innermost frame
    outside importlib's own."""
    while err is not None:
        tb, found = err.__traceback__, None
        while tb is not None:
            if not tb.tb_frame.f_code.co_filename.startswith("<"):
                found = tb.tb_frame.f_code.co_filename
            tb = tb.tb_next
        if found:
            return found
        err = err.__cause__ or err.__context__
    return None


def old_name_refusal(err: BaseException, path: str) -> str | None:
    """The one line refusing a config or experiment file (`path`, as the user named it) that
    imports a module name of the flat layout (aepg_jax <= commit FLAT_NAMES_COMMIT), or None when
    `err` is no such import."""
    chain, match = err, None
    while chain is not None and match is None:
        if isinstance(chain, ImportError | AttributeError):
            match = _OLD_NAME.search(str(chain))
        chain = chain.__cause__ or chain.__context__
    name = match and next(g for g in match.groups() if g)
    if name not in OLD_NAMES:
        return None
    file = _importing_file(err)
    if file and not (os.path.exists(path) and os.path.samefile(file, path)):
        relative = os.path.relpath(file)
        path = file if relative.startswith("..") else relative
    return (
        f"{path} imports aepg_jax.{name}, a module name of aepg_jax <= commit "
        f"{FLAT_NAMES_COMMIT}; use {OLD_NAMES[name]} (the module that holds it now, "
        f"docs/architecture.md) or check out that version (git checkout {FLAT_NAMES_COMMIT})."
    )


def _unknown_field(argv: list[str], err: BaseException) -> str | None:
    """`--config.a.b`: no such field, with ml_collections' suggestion, or None."""
    text = str(err).replace("\\'", "'").replace("\\n", "\n")
    match = re.search(r"'(\w+)'", text)
    if not isinstance(err, AttributeError | KeyError) or not match:
        return None
    name = match.group(1)
    flag = next((a.split("=")[0] for a in argv if a.split("=")[0].endswith(f".{name}")), name)
    hint = re.search(r'Did you mean "([^"]+)"', text)
    suggestion = f'; did you mean "{hint.group(1)}"?' if hint else "."
    return f"{flag}: the config has no field {name!r}{suggestion}"


def _config_arg(argv: list[str]) -> str:
    return next((a for a in argv if a.startswith("--config=")), "--config")


def _config_fields(argv: list[str]) -> list[str]:
    """The dotted field names of the config that `--config=path[:arg]` names (the continual
    trainer's base config if it names none, or none that loads)."""
    path, _, arg = _config_arg(argv).removeprefix("--config=").partition(":")
    try:
        cfg = schema.from_file(path, arg or None) if path != "--config" else None
    except Exception:  # a broken config file is reported once its flag is fixed
        cfg = None
    cfg = cfg if cfg is not None else schema.base_config()

    def leaves(d, prefix=""):
        for k, v in d.items():
            if hasattr(v, "items"):
                yield from leaves(v, f"{prefix}{k}.")
            else:
                yield f"{prefix}{k}"

    return list(leaves(cfg))


def _unknown_flag(argv: list[str], name: str) -> str:
    """`--name` is no flag: config fields named like it (`lr`: `optim.learning_rate`, by its
    words' initials; `epochs`: every `*.epochs`; near spellings)."""
    fields = _config_fields(argv)
    last = {f: f.rsplit(".", 1)[-1] for f in fields}
    initials = {f: "".join(w[:1] for w in leaf.split("_")) for f, leaf in last.items()}
    close = set(difflib.get_close_matches(name, set(last.values()), n=3, cutoff=0.75))
    rank = {f: 0 if last[f] == name else 1 if initials[f] == name else 2 for f in fields}
    found = sorted(
        (f for f in fields if rank[f] < 2 or last[f] in close),
        key=lambda f: (rank[f], not f.startswith("optim."), f),  # optim: the usual one
    )[:3]
    hint = f"; did you mean {' or '.join(f'--config.{f}' for f in found)}?" if found else "."
    return (
        f"--{name} is not a flag: aepg_jax.main takes --config, --workdir and config fields "
        f"as --config.<section>.<field>=value{hint}"
    )


def describe(argv: list[str], err: BaseException) -> str:
    """One line for an error raised while parsing the command line."""
    config_path = _config_arg(argv).removeprefix("--config=").partition(":")[0]
    old_name = old_name_refusal(err, config_path)
    if old_name:
        return old_name
    unknown = _unknown_field(argv, err)
    if unknown:
        return unknown
    if isinstance(err, SyntaxError):
        return f"{_config_arg(argv)}: syntax error in {err.filename} line {err.lineno}: {err.msg}."
    text = one_line(str(err))
    flag = re.search(r"Unknown command line flag '([\w.-]+)'", text)
    if flag:
        return _unknown_flag(argv, flag.group(1))
    required = re.search(r"Flag --(config|workdir) must have a value other than None", text)
    if required:
        return REQUIRED[required.group(1)]
    if "No such file or directory" in text and "Failed loading config file" in text:
        return f"{_config_arg(argv)}: no such config file."
    if "Error whilst parsing config file" in str(err) or "get_config" in str(err):
        return f"{_config_arg(argv)}: {text}"
    return text


HELP_FLAGS = ("--help", "-h", "-?", "--helpshort", "--helpfull")


def parse_flags(
    argv: list[str], config_flag, flag_values: flags.FlagValues = flags.FLAGS
) -> list[str]:
    """absl's flag parsing, its failures reported by `fail` as one line; `--help` exits 0 (absl's
    own help flag exits 1, which reads as a failure to scripts and CI)."""
    help_flags = [a for a in argv[1:] if a in HELP_FLAGS]
    if help_flags:
        app.usage(shorthelp=help_flags[0] != "--helpfull", writeto_stdout=True, exitcode=0)
    try:
        rest = flag_values(argv)
        cfg = config_flag.value
        if cfg is None:
            fail(REQUIRED["config"], shared=True)
        cfg.get("seed")  # a config file that could not be loaded raises its error here
    except SystemExit:
        raise
    except Exception as err:  # every parse failure is the user's to fix
        fail(describe(argv, err), shared=True)
    return rest
