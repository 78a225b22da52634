"""Test-wide settings: the fit check (`continual/fit.py`) compiles each run's step once more;
the tests skip it except where they test it (`tests/test_fit.py` sets AEPG_FIT_CHECK=1)."""

import os

import pytest

os.environ.setdefault("AEPG_FIT_CHECK", "0")


@pytest.fixture(scope="session")
def local_slurm():
    """A running one-node SLURM (`scripts/slurm_local.sh start`), or the test is skipped with
    the reason it cannot start."""
    import slurm_cluster

    reason = slurm_cluster.start()
    if reason:
        pytest.skip(reason)
