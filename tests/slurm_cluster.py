"""A running one-node SLURM for the slow tests (`scripts/slurm_local.sh start`): `start()` is
None when the cluster is up, else the reason it is not (one line: not Linux, not root, no
apt-get, the script's error line); the `local_slurm` fixture (tests/conftest.py) skips a test
with that reason."""

from __future__ import annotations

import functools
import os
import pathlib
import shutil
import subprocess
import sys

REPO = pathlib.Path(__file__).resolve().parents[1]
SCRIPT = REPO / "scripts" / "slurm_local.sh"


@functools.cache
def start() -> str | None:
    if not sys.platform.startswith("linux"):
        return f"a local SLURM needs Linux, not {sys.platform}"
    if os.geteuid() != 0:
        return "a local SLURM needs root (scripts/slurm_local.sh installs and starts daemons)"
    if not shutil.which("sbatch") and not shutil.which("apt-get"):
        return "no SLURM installed and no apt-get to install it"
    try:
        out = subprocess.run(
            ["bash", str(SCRIPT), "start"],
            capture_output=True,
            text=True,
            timeout=900,  # a fresh machine installs slurm-wlm and munge first
        )
    except subprocess.TimeoutExpired:
        return "scripts/slurm_local.sh start took more than 900 s"
    if out.returncode != 0:
        lines = (out.stderr or out.stdout).strip().splitlines() or [f"exit {out.returncode}"]
        return f"scripts/slurm_local.sh start failed: {lines[-1]}"
    return None
