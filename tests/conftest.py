"""Test-wide settings: the fit check (`continual/fit.py`) is skipped except where it is tested
(`tests/test_fit.py` sets AEPG_FIT_CHECK=1); the persistent compilation cache
(`system/xla_cache.py`) is off, so that no test writes into the user's cache and every test
compiles as a first run does (the tests of the cache point it at their own directory). The
tests of `ci_budget.SLOW_IN_CI` are marked `slow` here. A test whose pytest-xdist worker dies
runs once more, on the worker that replaces it (a second death fails it)."""

import os
import sys

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


@pytest.hookimpl(tryfirst=True)  # before `-m` deselects by marker
def pytest_collection_modifyitems(config, items):
    """Marks the tests of `ci_budget.SLOW_IN_CI` slow; an id there whose test function is not
    in its collected file is an error."""
    from ci_budget import SLOW_IN_CI

    modules = {item.nodeid.split("::")[0]: getattr(item, "module", None) for item in items}
    stale = []
    for nodeid in SLOW_IN_CI:
        path, *names = nodeid.split("[")[0].split("::")
        found = modules.get(path)
        for name in names if found is not None else ():
            found = getattr(found, name, None)
        if path in modules and found is None:
            stale.append(nodeid)
    if stale:
        raise pytest.UsageError(f"tests/ci_budget.py names no such test: {stale}")
    for item in items:
        if item.nodeid in SLOW_IN_CI:
            item.add_marker(pytest.mark.slow)


_RERUN: set[str] = set()


@pytest.hookimpl(optionalhook=True)
def pytest_handlecrashitem(crashitem, report, sched):
    """pytest-xdist: the test that was running when its worker died is run once more (its
    crash is said on stderr); a second death fails it."""
    if crashitem in _RERUN:
        return
    _RERUN.add(crashitem)
    print(f"\nworker died while running {crashitem}: running it once more", file=sys.stderr)
    sched.mark_test_pending(crashitem)
    report.outcome = "rerun"


def pytest_report_teststatus(report):
    """A test rerun after its worker died shows as `R`, not as a failure."""
    if report.outcome == "rerun":
        return "rerun", "R", "RERUN"
    return None
