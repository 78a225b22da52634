"""`aepg_jax.system.memory`: freed large blocks stay mapped; touching them again costs no page
faults."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from aepg_jax.system import memory

PROBE = """
import ctypes, json, resource
from aepg_jax.system import memory
applied = memory.apply_default()
libc = ctypes.CDLL("libc.so.6")
libc.malloc.restype = ctypes.c_void_p
libc.free.argtypes = [ctypes.c_void_p]
SIZE = 64 * 2**20  # above glibc's largest mmap threshold (32 MiB): mmapped by default
def faults_of_a_fresh_block():
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    block = libc.malloc(SIZE)
    ctypes.memset(block, 1, SIZE)  # touch every page (numpy would ask for huge pages)
    after = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    libc.free(block)
    return after - before
faults_of_a_fresh_block()
print(json.dumps({"applied": applied, "faults": faults_of_a_fresh_block()}))
"""

PAGES = 64 * 2**20 // 4096


def probe(malloc_env: str | None) -> dict:
    """Page faults of a second 64 MiB block after `memory.apply_default()` in a fresh process."""
    env = {k: v for k, v in os.environ.items() if k not in ("AEPG_MALLOC", "GLIBC_TUNABLES")}
    env["JAX_PLATFORMS"] = "cpu"  # auto mode applies whatever plugins are installed
    if malloc_env is not None:
        env["AEPG_MALLOC"] = malloc_env
    out = subprocess.run(
        [sys.executable, "-c", PROBE], env=env, capture_output=True, text=True, check=True
    )
    return json.loads(out.stdout.strip().splitlines()[-1])


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc mallopt: Linux only")
def test_second_large_block_reuses_mapped_pages():
    kept = probe(None)
    assert kept["applied"] is True
    assert kept["faults"] < PAGES // 20, kept  # the freed block's pages were reused


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc mallopt: Linux only")
def test_opt_out_keeps_glibc_defaults():
    default = probe("default")
    assert default["applied"] is False
    assert default["faults"] > PAGES // 2, default  # a fresh mmap faults every page in again


def test_unknown_mode_is_a_one_line_error(monkeypatch):
    monkeypatch.setenv("AEPG_MALLOC", "huge")
    with pytest.raises(ValueError, match=r"^AEPG_MALLOC='huge' is unknown; use one of auto, keep"):
        memory.apply_default()


def test_auto_mode_leaves_accelerator_hosts_alone(monkeypatch):
    monkeypatch.delenv("AEPG_MALLOC", raising=False)
    monkeypatch.delenv("JAX_PLATFORMS", raising=False)
    monkeypatch.setattr(memory, "accelerator_plugin_installed", lambda: True)
    assert memory.apply_default() is False
    monkeypatch.setenv("AEPG_MALLOC", "default")
    monkeypatch.setattr(memory, "accelerator_plugin_installed", lambda: False)
    assert memory.apply_default() is False
