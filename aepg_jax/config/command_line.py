"""The command line of `python -m aepg_jax.main` (and `plan`): absl flags plus the config.

`parse_flags(argv)` is their flags parser: a missing or broken config file, a config argument
its `get_config(arg)` refuses, an unknown `--config.` field (the "did you mean" hint kept), an
unknown flag (config fields named like it suggested) or a value of the wrong type each end the
process with exit code 2 and one `error: ...` line on stderr (`system.cli.fail`); `--help`
prints the flags and every config field (`schema.describe`) and exits 0.
"""

from __future__ import annotations

import difflib
import re
import sys

from absl import app, flags

from aepg_jax.config import schema
from aepg_jax.system.cli import fail, one_line

REQUIRED = {
    "config": "--config is required: --config=configs/<name>.py[:args], e.g. "
    "--config=configs/default.py.",
    "workdir": "--workdir is required: the run's directory (config, metrics, checkpoints, "
    "results), e.g. --workdir=runs/default; the same one again resumes the run.",
}


# The last commit of aepg_jax whose saved runs' config.json lack `trainer` and `tensorboard`.
FLAT_NAMES_COMMIT = "67ddf42"


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
        app.usage(shorthelp=help_flags[0] != "--helpfull", writeto_stdout=True)
        print(
            "\nConfig fields (--config.<field>=value) [default] and meaning (the from-scratch "
            f"trainer's: python -m pydoc aepg_jax.scratch.config):\n{schema.describe()}"
        )
        sys.exit(0)
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
