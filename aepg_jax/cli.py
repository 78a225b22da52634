"""Command-line errors as one line: what was wrong and what to change, never a traceback.

`parse_flags(argv)` is the flags parser of `python -m aepg_jax.main`: a missing or broken
config file, a config argument its `get_config(arg)` refuses, an unknown `--config.` field
(the "did you mean" hint kept) or a value of the wrong type each end the process with exit
code 2 and one `error: ...` line on stderr. `fail(err)` does the same for errors raised later,
after closing any progress bar so that the line is not glued to it.
"""

from __future__ import annotations

import re
import sys
from collections.abc import Callable
from typing import NoReturn

import tqdm
from absl import flags

EXIT_USER_ERROR = 2


def one_line(message: str) -> str:
    """The gist of a (possibly multi-line, traceback-carrying) message on one line."""
    lines = [line.strip() for line in str(message).strip().splitlines() if line.strip()]
    if any(line.startswith("Traceback") for line in lines):
        lines = lines[-1:]  # the exception line that ends an embedded traceback
    text = " ".join(lines)
    return re.sub(r"^[A-Z]\w*(Error|Exception): ", "", text)


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


def describe(argv: list[str], err: BaseException) -> str:
    """One line for an error raised while parsing the command line."""
    unknown = _unknown_field(argv, err)
    if unknown:
        return unknown
    if isinstance(err, SyntaxError):
        return f"{_config_arg(argv)}: syntax error in {err.filename} line {err.lineno}: {err.msg}."
    text = one_line(str(err))
    if "No such file or directory" in text and "Failed loading config file" in text:
        return f"{_config_arg(argv)}: no such config file."
    if "Error whilst parsing config file" in str(err) or "get_config" in str(err):
        return f"{_config_arg(argv)}: {text}"
    return text


def fail(message: str, exit_fn: Callable[[int], NoReturn] = sys.exit) -> NoReturn:
    """Ends the process (`exit_fn`) with one error line (after finishing any progress bar's
    line)."""
    for bar in list(getattr(tqdm.tqdm, "_instances", ())):
        bar.close()
    sys.stderr.flush()
    print(f"error: {message}", file=sys.stderr)
    exit_fn(EXIT_USER_ERROR)


def parse_flags(
    argv: list[str], config_flag, flag_values: flags.FlagValues = flags.FLAGS
) -> list[str]:
    """absl's flag parsing, its failures reported by `fail` as one line."""
    try:
        rest = flag_values(argv)
        cfg = config_flag.value
        if cfg is None:
            fail("--config is required: --config=configs/<name>.py[:args].")
        cfg.get("seed")  # a config file that could not be loaded raises its error here
    except SystemExit:
        raise
    except Exception as err:  # every parse failure is the user's to fix
        fail(describe(argv, err))
    return rest
