"""A run owns its workdir while it runs: an exclusive lock per workdir.

    <workdir>/.lock         flock(2)ed (LOCK_EX | LOCK_NB) by the holder for the run's lifetime
    <workdir>/lock.json     the holder's heartbeat: host, pid, since, beat (rewritten every
                            AEPG_LOCK_BEAT_S seconds by a daemon thread), removed on release

Taking the lock: the kernel's flock first (released by the kernel when its holder dies, even by
SIGKILL, on a local disk and on NFSv4 / Lustre mounted with `flock`); then the heartbeat, for
file systems where flock is not shared between hosts (Lustre's `localflock`, GCS-fuse, NFS
with `local_lock=all`): a heartbeat younger than AEPG_LOCK_STALE_S seconds whose holder is not
known dead (same host, pid gone) means the run is held elsewhere. A stale heartbeat is taken
over. A held lock raises `Busy` naming the holder, before anything in the workdir is touched.

`hold(workdir)` is reentrant within a process (a sweep worker claims a run by its lock, then
`aepg_jax.main.execute` runs it under the same lock).
"""

from __future__ import annotations

import contextlib
import dataclasses
import errno
import fcntl
import json
import os
import socket
import threading
import time
from collections.abc import Iterator

LOCK_FILE = ".lock"
HEARTBEAT_FILE = "lock.json"
ENV_STALE = "AEPG_LOCK_STALE_S"  # a heartbeat older than this is a dead holder's
ENV_BEAT = "AEPG_LOCK_BEAT_S"  # how often the holder rewrites its heartbeat
DEFAULT_STALE_S = 120.0
DEFAULT_BEAT_S = 10.0
RECHECK_S = 0.5  # between writing a new heartbeat and checking it is still ours


class Busy(RuntimeError):
    """The workdir is held by another live run."""


def _env_seconds(name: str, default: float) -> float:
    try:
        return float(os.environ.get(name, default))
    except ValueError:
        return default


def stale_after() -> float:
    return _env_seconds(ENV_STALE, DEFAULT_STALE_S)


def beat_every() -> float:
    return _env_seconds(ENV_BEAT, DEFAULT_BEAT_S)


@dataclasses.dataclass(frozen=True)
class Holder:
    """Who holds a workdir: host, pid, since (epoch seconds), last heartbeat (epoch seconds)."""

    host: str
    pid: int
    since: float
    beat: float

    @property
    def since_text(self) -> str:
        return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(self.since))

    def describe(self) -> str:
        return f"{self.host} pid {self.pid} since {self.since_text}"

    def alive(self, now: float | None = None) -> bool:
        """Whether the heartbeat is fresh and its process not known dead."""
        now = time.time() if now is None else now
        if now - self.beat > stale_after():
            return False
        if self.host == socket.gethostname():
            return _pid_alive(self.pid)
        return True


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # someone else's live process
        return True
    return True


def read_holder(workdir: str) -> Holder | None:
    """The heartbeat in `workdir` (None if there is none or it cannot be read)."""
    try:
        with open(os.path.join(workdir, HEARTBEAT_FILE)) as f:
            d = json.load(f)
        return Holder(str(d["host"]), int(d["pid"]), float(d["since"]), float(d["beat"]))
    except (OSError, ValueError, KeyError, TypeError):
        return None


def running(workdir: str) -> Holder | None:
    """The live holder of `workdir`, or None (for a status display: reads, takes nothing)."""
    holder = read_holder(workdir)
    return holder if holder is not None and holder.alive() else None


def busy_message(workdir: str, holder: Holder | None) -> str:
    who = holder.describe() if holder else "another process (its heartbeat is not readable yet)"
    return (
        f"{workdir} is in use by another run ({who}); wait for it to finish, or stop it, or use "
        "another --workdir."
    )


class _Lock:
    """A held lock: the flocked file descriptor and the heartbeat thread."""

    def __init__(self, workdir: str, fd: int | None, since: float):
        self.workdir = workdir
        self.fd = fd
        self.since = since
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._beat_loop, daemon=True, name="run-lock")

    def _record(self) -> dict:
        return {"host": socket.gethostname(), "pid": os.getpid(), "since": self.since,
                "beat": time.time()}  # fmt: skip

    def write_heartbeat(self) -> None:
        path = os.path.join(self.workdir, HEARTBEAT_FILE)
        tmp = f"{path}.{socket.gethostname()}.{os.getpid()}"
        with open(tmp, "w") as f:
            json.dump(self._record(), f)
        os.replace(tmp, path)

    def _beat_loop(self) -> None:
        while not self.stop.wait(beat_every()):
            with contextlib.suppress(OSError):  # a full or flaky disk: the next beat retries
                self.write_heartbeat()

    def release(self) -> None:
        self.stop.set()
        self.thread.join(timeout=5)
        holder = read_holder(self.workdir)
        if holder is not None and (holder.host, holder.pid) == (socket.gethostname(), os.getpid()):
            with contextlib.suppress(OSError):
                os.remove(os.path.join(self.workdir, HEARTBEAT_FILE))
        if self.fd is not None:
            with contextlib.suppress(OSError):
                fcntl.flock(self.fd, fcntl.LOCK_UN)
            os.close(self.fd)


_held: dict[str, int] = {}  # workdir -> nesting depth in this process
_locks: dict[str, _Lock] = {}
_guard = threading.Lock()


def _flock(path: str) -> int | None:
    """The flocked descriptor of `path`; None where the file system has no flock (heartbeat
    alone then); raises Busy's cause (BlockingIOError) when another process holds it."""
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError as err:
        os.close(fd)
        if err.errno in (errno.ENOLCK, errno.EOPNOTSUPP, errno.ENOSYS):
            return None
        raise
    return fd


def acquire(workdir: str) -> None:
    """Takes `workdir` for this process (creating it), or raises Busy naming the holder."""
    workdir = os.path.abspath(workdir)
    with _guard:
        if workdir in _held:
            _held[workdir] += 1
            return
        os.makedirs(workdir, exist_ok=True)
        try:
            fd = _flock(os.path.join(workdir, LOCK_FILE))
        except BlockingIOError:
            raise Busy(busy_message(workdir, read_holder(workdir))) from None
        holder = read_holder(workdir)
        me = (socket.gethostname(), os.getpid())
        if holder is not None and holder.alive() and (holder.host, holder.pid) != me:
            # flock granted, yet a live heartbeat: flock is not shared with its host.
            if fd is not None:
                os.close(fd)
            raise Busy(busy_message(workdir, holder))
        lock = _Lock(workdir, fd, time.time())
        lock.write_heartbeat()
        # Where flock is not shared between hosts, two hosts may get here at once: each wrote
        # its heartbeat; the last one written stays, and the other host backs off.
        time.sleep(min(RECHECK_S, beat_every()))
        holder = read_holder(workdir)
        if holder is None or (holder.host, holder.pid) != me:
            if fd is not None:
                os.close(fd)
            raise Busy(busy_message(workdir, holder))
        lock.thread.start()
        _held[workdir], _locks[workdir] = 1, lock


def release(workdir: str) -> None:
    workdir = os.path.abspath(workdir)
    with _guard:
        _held[workdir] -= 1
        if _held[workdir]:
            return
        del _held[workdir]
        _locks.pop(workdir).release()


@contextlib.contextmanager
def hold(workdir: str) -> Iterator[None]:
    """`workdir` held for the duration (reentrant); Busy if another run holds it."""
    acquire(workdir)
    try:
        yield
    finally:
        release(workdir)


@contextlib.contextmanager
def hold_run(workdir: str) -> Iterator[None]:
    """`hold` for every process of a (multi-process) run: process 0 takes the lock, the others
    follow its outcome, so that all of them run, or all raise Busy, alike."""
    import jax

    from aepg_jax.system import hosts

    if jax.process_count() == 1:
        with hold(workdir):
            yield
        return
    refused = None
    if hosts.is_main():
        try:
            acquire(workdir)
        except Busy as err:
            refused = err
    if not hosts.everywhere(refused is None):
        raise refused or Busy(busy_message(os.path.abspath(workdir), read_holder(workdir)))
    try:
        yield
    finally:
        if hosts.is_main():
            release(workdir)
