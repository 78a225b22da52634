"""The persistent compilation cache (`system/xla_cache.py`): where it is, that processes share
one directory, and that a program read back computes what the compiled one did."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

from aepg_jax.system import xla_cache

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# Compiles three programs (counted by `compiles.Counter`) with the cache in argv[1] and prints
# the counter's summary and the results.
SCRIPT = textwrap.dedent("""
    import json, sys
    from aepg_jax.system import compiles, xla_cache
    xla_cache.enable(xla_cache.directory(sys.argv[1]))
    import jax, jax.numpy as jnp, numpy as np
    x = np.linspace(0.0, 1.0, 64, dtype=np.float32).reshape(8, 8)
    with compiles.Counter() as counter:
        out = [
            jax.jit(lambda a: jnp.tanh(a @ a.T).sum(0))(x),
            jax.jit(lambda a: jnp.exp(a) / jnp.exp(a).sum())(x),
            jax.jit(lambda a, b: jnp.sin(a) * b)(x, x),
        ]
    print(json.dumps({"summary": counter.summary(), "out": [o.tolist() for o in out]}))
""")


def test_the_cache_directory_follows_the_environment_then_the_config(monkeypatch):
    monkeypatch.delenv(xla_cache.ENV, raising=False)
    home = os.path.expanduser("~")
    assert xla_cache.directory() == os.path.join(home, ".cache", "aepg_jax", "xla")
    assert xla_cache.directory("runs/x") == os.path.abspath("runs/x")
    assert xla_cache.directory("") is None  # compile_cache="" / --compile_cache=''
    monkeypatch.setenv(xla_cache.ENV, "/tmp/elsewhere")
    assert xla_cache.directory("runs/x") == "/tmp/elsewhere"  # the environment wins
    for off in ("0", "", "off"):
        monkeypatch.setenv(xla_cache.ENV, off)
        assert xla_cache.directory("runs/x") is None


def test_processes_share_one_cache_and_read_back_what_they_compiled(tmp_path):
    """Two processes fill one directory at the same time; a third reads every program back
    (no compilation) and computes the same values as the first two and as no cache."""
    cache = str(tmp_path / "xla")
    env = {k: v for k, v in os.environ.items() if k != xla_cache.ENV}

    def start(directory):
        cmd = [sys.executable, "-c", SCRIPT, directory]
        return subprocess.Popen(cmd, cwd=REPO, env=env, stdout=subprocess.PIPE, text=True)

    first = [start(cache) for _ in range(2)]
    outs = [json.loads(p.communicate(timeout=300)[0]) for p in first]
    assert [p.returncode for p in first] == [0, 0]
    assert os.listdir(cache)
    second = [start(d) for d in (cache, "0")]
    again, without = (json.loads(p.communicate(timeout=300)[0]) for p in second)
    assert again["summary"]["count"] == again["summary"]["cached"] == 3
    assert without["summary"]["cached"] == 0
    for out in (*outs, again):
        assert out["out"] == without["out"]  # bit for bit
