"""Test-wide settings: the fit check (`continual/fit.py`) is skipped except where it is tested
(`tests/test_fit.py` sets AEPG_FIT_CHECK=1). The persistent compilation cache
(`system/xla_cache.py`) of the whole session is a fresh temporary directory, never the user's,
shared by the session's pytest-xdist workers and the runs they start (`AEPG_COMPILE_CACHE`), so
that a program the suite compiled once is read back by every later test; the tests of a first
run's compilations take their own empty one (`fresh_compile_cache`). The tests of
`ci_budget.SLOW_IN_CI` are marked `slow` here."""

import os
import shutil
import tempfile

import pytest

os.environ.setdefault("AEPG_FIT_CHECK", "0")
_CACHE_ENV = "AEPG_COMPILE_CACHE"  # system/xla_cache.ENV, without importing jax here
_OWN_CACHE = "PYTEST_XDIST_WORKER" not in os.environ  # the session's first process
if _OWN_CACHE:  # inherited by the xdist workers and every subprocess
    os.environ[_CACHE_ENV] = tempfile.mkdtemp(prefix="aepg_test_xla_")
_SESSION_CACHE = os.environ[_CACHE_ENV]


def pytest_unconfigure(config):
    if _OWN_CACHE:
        shutil.rmtree(_SESSION_CACHE, ignore_errors=True)


def _use_compile_cache(path: str) -> None:
    """Points this process's compilations at `path` from now on (jax settles on a cache at its
    next compilation after `reset_cache`)."""
    from jax._src import compilation_cache

    from aepg_jax.system import xla_cache

    compilation_cache.reset_cache()
    xla_cache.enable(path)


@pytest.fixture(scope="session", autouse=True)
def _session_compile_cache():
    """The session's cache for the tests run in this process."""
    _use_compile_cache(_SESSION_CACHE)


@pytest.fixture
def fresh_compile_cache(tmp_path_factory, monkeypatch):
    """A function that moves this process's compilation cache (and that of the runs it starts)
    to a new empty directory and returns it, so the next run compiles as a first run does; the
    session's cache comes back after the test."""

    def fresh():
        path = str(tmp_path_factory.mktemp("xla"))
        monkeypatch.setenv(_CACHE_ENV, path)
        _use_compile_cache(path)
        return path

    yield fresh
    _use_compile_cache(_SESSION_CACHE)


@pytest.fixture(autouse=True)
def _no_exit_of_the_test_process(monkeypatch):
    """`os._exit` in pytest's own process (`hosts.leave(at_once=True)`, a second Ctrl-C of
    `aepg_jax.main`) fails the test that reached it, with its traceback: it would end the
    process without a word (pytest-xdist says only that its worker crashed). Processes forked
    from it exit as they would."""
    pid, exit_now = os.getpid(), os._exit

    def _exit(status: int):
        if os.getpid() != pid:
            exit_now(status)
        raise AssertionError(f"os._exit({status}) in the test's process: run it in a subprocess")

    monkeypatch.setattr(os, "_exit", _exit)


_SIGNALS = ("SIGPIPE", "SIGTERM", "SIGUSR1", "SIGUSR2", "SIGINT", "SIGHUP", "SIGALRM")


@pytest.fixture(autouse=True)
def _signals_left_as_found():
    """A test that leaves a signal's disposition changed in pytest's process fails (and the
    disposition is put back): left at its default action, a later SIGPIPE (a write to a closed
    pipe or socket, on any thread) or SIGTERM ends the pytest-xdist worker without a word."""
    import signal

    before = {name: signal.getsignal(getattr(signal, name)) for name in _SIGNALS}
    yield
    changed = {}
    for name, handler in before.items():
        now = signal.getsignal(getattr(signal, name))
        if now != handler:
            changed[name] = now
            signal.signal(getattr(signal, name), handler)
    assert not changed, f"the test left these signals' handlers changed: {changed}"


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
