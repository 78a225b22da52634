"""Errors as one line: what was wrong and what to change, never a traceback.

`fail(message)` ends the process with exit code 2 and one `error: ...` line on stderr, after
closing any progress bar so that the line is not glued to it; `one_line` is the gist of a
multi-line message. (The flags parser of `main` and `plan` is `config/command_line.py`.)
"""

from __future__ import annotations

import os
import re
import sys
from collections.abc import Callable
from typing import NoReturn

import tqdm

from aepg_jax.launch import launch

EXIT_USER_ERROR = launch.EXIT_USER_ERROR


def one_line(message: str) -> str:
    """The gist of a (possibly multi-line, traceback-carrying) message on one line."""
    lines = [line.strip() for line in str(message).strip().splitlines() if line.strip()]
    if any(line.startswith("Traceback") for line in lines):
        lines = lines[-1:]  # the exception line that ends an embedded traceback
    text = " ".join(lines)
    # XLA wraps a failed collective once per level: "Error dispatching computation: " x 9.
    text = re.sub(r"\b([A-Za-z][\w ]*?: )(?:\1)+", r"\1", text)
    return re.sub(r"^[A-Z]\w*(Error|Exception): ", "", text)


def fail(
    message: str, exit_fn: Callable[[int], NoReturn] = sys.exit, shared: bool = False
) -> NoReturn:
    """Ends the process (`exit_fn`) with one error line (after finishing any progress bar's
    line). A `shared` error (the command line's or the config's: every process of a run has
    it) is printed by process 0 alone when `aepg_jax.launch` started the processes."""
    for bar in list(getattr(tqdm.tqdm, "_instances", ())):
        bar.close()
    sys.stderr.flush()
    if not (shared and os.environ.get(launch.ENV_PROCESS_ID, "0") != "0"):
        print(f"error: {message}", file=sys.stderr, flush=True)
    exit_fn(EXIT_USER_ERROR)
