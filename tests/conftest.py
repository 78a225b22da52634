"""Test-wide settings: the fit check (`continual/fit.py`) is skipped except where it is tested
(`tests/test_fit.py` sets AEPG_FIT_CHECK=1); the persistent compilation cache
(`system/xla_cache.py`) is off, so that no test writes into the user's cache and every test
compiles as a first run does (the tests of the cache point it at their own directory)."""

import os

import pytest

os.environ.setdefault("AEPG_FIT_CHECK", "0")
os.environ.setdefault("AEPG_COMPILE_CACHE", "0")


@pytest.fixture(scope="session")
def local_slurm():
    """A running one-node SLURM (`scripts/slurm_local.sh start`), or the test is skipped with
    the reason it cannot start."""
    import slurm_cluster

    reason = slurm_cluster.start()
    if reason:
        pytest.skip(reason)
