"""A run owns its workdir while it runs: an exclusive lock per workdir, and a fence on its writes.

    <workdir>/.lock              flock(2)ed (LOCK_EX | LOCK_NB) by the holder for the run's life
    <workdir>/.lock.d/<gen>.json the claims: one file per holder, numbered 1, 2, ...; the newest
                                 is the holder's (host, its machine: boot id or machine id with
                                 its pid namespace, pid, since, beat, its SLURM job and restart
                                 count, a token), rewritten every AEPG_LOCK_BEAT_S seconds by a
                                 daemon thread; marked `released` on release

Taking the lock: the kernel's flock first (released by the kernel when its holder dies, even by
SIGKILL, on a local disk and on NFSv4 / Lustre mounted with `flock`; AEPG_LOCK_FLOCK=0 skips it);
then the claims, for file systems where flock is not shared between hosts (Lustre's
`localflock`, GCS-fuse, NFS with `local_lock=all`). The newest claim decides: released, or its
holder known dead, or its heartbeat older than AEPG_LOCK_STALE_S seconds, and the workdir is
free; otherwise `Busy` names the holder, before anything in the workdir is touched. Known dead
takes evidence that cannot collide across machines: the claim's host, boot id (or machine id)
and pid namespace are this process's and its pid is gone; or it is the same SLURM job
(`SLURM_ARRAY_JOB_ID` + `SLURM_ARRAY_TASK_ID` or `SLURM_JOB_ID`) with a lower
`SLURM_RESTART_COUNT` than ours (a requeued job). A claim that names no machine (written by an
earlier version) is judged by its heartbeat alone. A heartbeat's age is measured on one clock,
the file system's: the claim file's mtime against that of a file written just then.

Taking over: the next claim file is created with link(2) (O_EXCL where the file system has no
hard links), which fails when it exists, so of two processes that saw the same newest claim
exactly one gets the next number. A taker that stalled between judging the newest claim and
creating its own can still re-create a number that cleanup removed since; so a claim is held only
if it is still the newest once made (else it is removed again and the taker gets `Busy`), and
only then are older claims removed. A holder owns the run while its claim is the newest:
`fence(path)` (called by every writer of a run's files: checkpoints, metrics.jsonl, TensorBoard
events, results, plots, config.json) raises `Lost` once a newer claim exists. It re-reads the
claims on its first call and then at most every `FENCE_S` seconds of the process's monotonic
clock (which runs on while the process is stopped: a holder resumed after a pause checks before
its next write); `fence_of(path)` gives a check that always re-reads, for the last step of a
write that is not undone (a checkpoint's commit). A holder that lost its run writes nothing
more, its heartbeat thread stops rewriting its claim, and a lock released or lost stays so for
any write still pending under it (an asynchronous save).

What a taker must clean (a dead or paused holder's unfinished writes) is its writers' business,
not the lock's: `inherited(path)` says whether this process took the workdir over from a holder
that did not release it, and the checkpoint writer removes its unfinished saves when it opens.

`hold(workdir)` is reentrant within a process (a sweep worker claims a run by its lock, then
`aepg_jax.main.execute` runs it under the same lock). `hold_run` holds it for every process of a
multi-process run: process 0 takes it and the others follow its claim (`follow`), so that every
process is fenced.
"""

from __future__ import annotations

import contextlib
import dataclasses
import errno
import fcntl
import functools
import json
import math
import os
import secrets
import socket
import threading
import time
from collections.abc import Callable, Iterator

LOCK_FILE = ".lock"
CLAIMS_DIR = ".lock.d"
ENV_STALE = "AEPG_LOCK_STALE_S"  # a heartbeat older than this is a dead holder's
ENV_BEAT = "AEPG_LOCK_BEAT_S"  # how often the holder rewrites its heartbeat
ENV_FLOCK = "AEPG_LOCK_FLOCK"  # 0: claims and heartbeats alone (file systems without flock)
DEFAULT_STALE_S = 120.0
DEFAULT_BEAT_S = 10.0
FENCE_S = 2.0  # a holder re-reads the claims before a write at most this often


class Busy(RuntimeError):
    """The workdir is held by another live run."""


class Lost(Busy):
    """This process held the workdir, and another process has taken it over since (this one
    was paused past AEPG_LOCK_STALE_S): it must write nothing more."""


class LockError(RuntimeError):
    """The lock's files cannot be read or written (a full disk, a read-only or unreadable
    `.lock`): the run cannot start, nothing in the workdir was touched."""


def _env_seconds(name: str, default: float) -> float:
    text = os.environ.get(name)
    if text is None or not text.strip():
        return default
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not math.isfinite(value) or value <= 0:
        raise ValueError(
            f"{name}={text!r} is not a number of seconds > 0; set it to one (default "
            f"{default:g}) or unset it."
        )
    return value


def stale_after() -> float:
    return _env_seconds(ENV_STALE, DEFAULT_STALE_S)


def beat_every() -> float:
    return _env_seconds(ENV_BEAT, DEFAULT_BEAT_S)


def settings() -> tuple[float, float, bool]:
    """(beat seconds, stale seconds, use flock) from the environment; ValueError naming the
    variable when one is not usable."""
    beat, stale = beat_every(), stale_after()
    if beat >= stale:
        raise ValueError(
            f"{ENV_BEAT}={beat:g} must be below {ENV_STALE}={stale:g} (a live holder's heartbeat "
            f"would look stale); lower {ENV_BEAT} or raise {ENV_STALE}."
        )
    flock = os.environ.get(ENV_FLOCK, "1").strip()
    if flock not in ("0", "1"):
        raise ValueError(f"{ENV_FLOCK}={flock!r} must be 1 (use flock, the default) or 0 (do not).")
    return beat, stale, flock == "1"


def _slurm_job() -> str | None:
    """This process's SLURM job (the array job and task for an array), or None."""
    env = os.environ
    if env.get("SLURM_ARRAY_JOB_ID") and env.get("SLURM_ARRAY_TASK_ID"):
        return f"{env['SLURM_ARRAY_JOB_ID']}_{env['SLURM_ARRAY_TASK_ID']}"
    return env.get("SLURM_JOB_ID") or None


def _slurm_restart() -> int:
    try:
        return int(os.environ.get("SLURM_RESTART_COUNT", "0"))
    except ValueError:
        return 0


def _read_id(path: str) -> str | None:
    try:
        with open(path) as f:
            return f.read().strip() or None
    except OSError:
        return None


@functools.cache
def _machine() -> str | None:
    """What tells this process's machine from any other with the same hostname: the kernel's
    boot id (else /etc/machine-id) with the pid namespace (containers on one kernel share the
    boot id, not their pids); None when neither id is readable."""
    ident = _read_id("/proc/sys/kernel/random/boot_id") or _read_id("/etc/machine-id")
    if ident is None:
        return None
    try:
        namespace = os.readlink("/proc/self/ns/pid")
    except OSError:
        namespace = "pid:?"
    return f"{ident}/{namespace}"


@dataclasses.dataclass(frozen=True)
class Holder:
    """Who holds (or held) a workdir: host, pid, since and last heartbeat (epoch seconds, the
    holder's clock: for display), its claim's number, SLURM job and restart count, token,
    whether it released the workdir, and its machine (`_machine()`; None in claims written by
    earlier versions)."""

    host: str
    pid: int
    since: float
    beat: float
    gen: int = 0
    job: str | None = None
    restart: int = 0
    token: str = ""
    released: bool = False
    machine: str | None = None

    @property
    def since_text(self) -> str:
        return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(self.since))

    def describe(self) -> str:
        job = f", SLURM job {self.job}" if self.job else ""  # what scancel and squeue take
        return f"{self.host} pid {self.pid} since {self.since_text}{job}"

    def known_dead(self) -> bool:
        """Its pid gone on this machine (host, boot or machine id and pid namespace all this
        process's: a hostname alone is shared by containers), or its SLURM job requeued (this
        process is the job's later restart)."""
        here = self.machine is not None and self.machine == _machine()
        if here and self.host == socket.gethostname() and not _pid_alive(self.pid):
            return True
        job = _slurm_job()
        return job is not None and self.job == job and self.restart < _slurm_restart()


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # someone else's live process
        return True
    return True


def _claims_dir(workdir: str) -> str:
    return os.path.join(workdir, CLAIMS_DIR)


def _claim_path(workdir: str, gen: int) -> str:
    return os.path.join(_claims_dir(workdir), f"{gen:010d}.json")


def _newest_gen(workdir: str) -> int:
    """The newest claim's number (0: none). Raises OSError when the claims cannot be listed."""
    try:
        names = os.listdir(_claims_dir(workdir))
    except FileNotFoundError:
        return 0
    gens = [int(n[:-5]) for n in names if n.endswith(".json") and n[:-5].isdigit()]
    return max(gens, default=0)


def _read_claim(workdir: str, gen: int) -> tuple[Holder | None, float | None]:
    """(holder, mtime) of claim `gen`; (None, mtime) while its file is being written."""
    path = _claim_path(workdir, gen)
    try:
        with open(path) as f:
            mtime = os.fstat(f.fileno()).st_mtime
            d = json.load(f)
        holder = Holder(
            str(d["host"]), int(d["pid"]), float(d["since"]), float(d["beat"]), gen,
            d.get("job"), int(d.get("restart", 0)), str(d.get("token", "")),
            bool(d.get("released", False)), d.get("machine"),
        )  # fmt: skip
        return holder, mtime
    except FileNotFoundError:
        return None, None
    except (ValueError, KeyError, TypeError):
        with contextlib.suppress(OSError):
            return None, os.stat(path).st_mtime
        return None, None


def read_holder(workdir: str) -> Holder | None:
    """The newest claim in `workdir` unless released (None if there is none or it cannot be
    read)."""
    try:
        holder, _ = _read_claim(workdir, _newest_gen(workdir))
    except OSError:
        return None
    return None if holder is None or holder.released else holder


def _fs_now(workdir: str) -> float | None:
    """The file system's clock: the mtime of a file written now in the claims directory."""
    path = os.path.join(_claims_dir(workdir), f".now.{socket.gethostname()}.{os.getpid()}")
    try:
        with open(path, "w") as f:
            f.write("now")
            f.flush()
            mtime = os.fstat(f.fileno()).st_mtime
        os.remove(path)
        return mtime
    except OSError:
        return None


def _stale(workdir: str, mtime: float | None) -> bool:
    """Whether a claim file last written at `mtime` (the file system's clock) is stale."""
    now = _fs_now(workdir)
    if mtime is None or now is None:
        return False
    return now - mtime > stale_after()


def running(workdir: str) -> Holder | None:
    """The live holder of `workdir`, or None (for a status display: reads, takes nothing but a
    probe file for the file system's clock)."""
    try:
        holder, mtime = _read_claim(workdir, _newest_gen(workdir))
    except OSError:
        return None
    if holder is None or holder.released or holder.known_dead():
        return None
    return None if _stale(workdir, mtime) else holder


def busy_message(workdir: str, holder: Holder | None) -> str:
    who = holder.describe() if holder else "another process (its heartbeat is not readable yet)"
    if holder is not None and holder.machine is None:  # an earlier version's claim
        who += f"; its claim names no machine, so it is taken over once {ENV_STALE} has passed"
    return (
        f"{workdir} is in use by another run ({who}); wait for it to finish, or stop it, or use "
        "another --workdir."
    )


def lost_message(workdir: str, holder: Holder | None, released: bool = False) -> str:
    if released and holder is None:
        return f"{workdir} was released by this process; a write still pending there was dropped."
    who = holder.describe() if holder else "another process"
    return (
        f"{workdir} was taken over by {who} while this process was paused longer than "
        f"{ENV_STALE}; this process stopped writing there (the run goes on in the other; "
        f"raise {ENV_STALE} above the longest pause a run may see)."
    )


def _lock_error(workdir: str, err: OSError) -> LockError:
    where = err.filename or workdir
    reason = err.strerror or type(err).__name__
    return LockError(
        f"cannot take the lock of {workdir} ({reason}: {where}); make that file and directory "
        "readable and writable (or free space on its disk) and run again."
    )


def _write_json(path: str, record: dict) -> str:
    """`record` into a new temporary file beside `path`; its name."""
    tmp = f"{path}.{socket.gethostname()}.{os.getpid()}.tmp"
    with open(tmp, "w") as f:
        json.dump(record, f)
        f.flush()
        os.fsync(f.fileno())
    return tmp


def _create_exclusive(tmp: str, path: str) -> bool:
    """Moves `tmp` to `path` unless `path` exists (atomically: link(2), or O_EXCL where the file
    system has no hard links); whether it did."""
    try:
        os.link(tmp, path)
    except FileExistsError:
        os.remove(tmp)
        return False
    except OSError as err:
        if err.errno not in (errno.EPERM, errno.EOPNOTSUPP, errno.ENOTSUP, errno.EMLINK,
                             errno.ENOSYS, errno.EXDEV):  # fmt: skip
            raise
        with open(tmp, "rb") as f:
            data = f.read()
        os.remove(tmp)
        try:
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
        except FileExistsError:
            return False
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        return True
    os.remove(tmp)
    return True


class _Lock:
    """A held lock: the flocked descriptor, the claim, the heartbeat thread, the fence. A
    follower (another process of a multi-process run) has no claim of its own: it owns the run
    while no claim newer than its leader's exists."""

    def __init__(self, workdir: str, fd: int | None, gen: int, follower: bool = False):
        self.workdir = workdir
        self.fd = fd
        self.gen = gen
        self.follower = follower
        self.since = time.time()
        self.token = secrets.token_hex(8)
        self.lost: Holder | bool | None = False  # False while owned; then the taker (None: unknown)
        self.released = False
        self.inherited: Holder | None = None  # the holder taken over, when it had not released
        self.checked = -math.inf  # the first fence reads the claims
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._beat_loop, daemon=True, name="run-lock")

    def record(self, released: bool = False) -> dict:
        return {"host": socket.gethostname(), "machine": _machine(), "pid": os.getpid(),
                "since": self.since, "beat": time.time(), "job": _slurm_job(),
                "restart": _slurm_restart(), "token": self.token,
                "released": released}  # fmt: skip

    def claim(self) -> bool:
        """Creates this lock's claim file; False when another process created it first."""
        os.makedirs(_claims_dir(self.workdir), exist_ok=True)
        path = _claim_path(self.workdir, self.gen)
        return _create_exclusive(_write_json(path, self.record()), path)

    def owns(self) -> bool:
        """Whether this lock's claim is still the newest (reads the claims directory; a
        follower: no newer claim exists, its host may not see the claims at all) and this
        process has not released it; records the taker when not."""
        if self.lost is not False or self.released:
            return False
        try:
            newest = _newest_gen(self.workdir)
        except OSError:
            return True  # unreadable now: the next check decides, the heartbeat carries on
        if newest == self.gen or (self.follower and newest < self.gen):
            self.checked = time.monotonic()
            return True
        self.lost = _read_claim(self.workdir, newest)[0] if newest > self.gen else None
        return False

    def fence(self, now: bool = False) -> None:
        """Raises Lost once another process took the workdir over, or this process released
        it (re-reads the claims at most every FENCE_S seconds, or `now`)."""
        if not now and self.lost is False and time.monotonic() - self.checked < FENCE_S:
            return
        if not self.owns():
            raise Lost(lost_message(self.workdir, self.lost or None, self.released))

    def write_heartbeat(self, released: bool = False) -> None:
        path = _claim_path(self.workdir, self.gen)
        os.replace(_write_json(path, self.record(released)), path)

    def _beat_loop(self) -> None:
        while not self.stop.wait(beat_every()):
            if not self.owns():  # taken over while this process was stopped: write nothing
                return
            with contextlib.suppress(OSError):  # a full or flaky disk: the next beat retries
                self.write_heartbeat()

    def release(self) -> None:
        self.stop.set()
        if self.thread.is_alive():
            self.thread.join(timeout=5)
        if not self.follower and self.owns():
            with contextlib.suppress(OSError):
                self.write_heartbeat(released=True)
        self.released = True  # a write still pending under this lock is fenced off
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


def _take(workdir: str, use_flock: bool) -> _Lock:
    """The lock of `workdir` for this process (its claim written); Busy when held."""
    os.makedirs(workdir, exist_ok=True)
    fd = None
    if use_flock:
        try:
            fd = _flock(os.path.join(workdir, LOCK_FILE))
        except BlockingIOError:
            raise Busy(busy_message(workdir, read_holder(workdir))) from None
    try:
        newest = _newest_gen(workdir)
        holder, mtime = _read_claim(workdir, newest) if newest else (None, None)
        free = newest == 0 or (holder is not None and (holder.released or holder.known_dead()))
        if not free and not _stale(workdir, mtime):
            raise Busy(busy_message(workdir, holder))
        # The claim after the newest seen: of several processes that saw the same one, exactly
        # one creates it.
        lock = _Lock(workdir, fd, newest + 1)
        _before_claim(lock)
        if not lock.claim():
            raise Busy(busy_message(workdir, read_holder(workdir)))
        # A taker stalled since it read `newest` may have re-created a number that cleanup
        # removed after a newer claim was made: the claim is held only if still the newest.
        try:
            still_newest = _newest_gen(workdir) == lock.gen
        except OSError:
            still_newest = False
        if not still_newest:
            with contextlib.suppress(OSError):
                os.remove(_claim_path(workdir, lock.gen))
            raise Busy(busy_message(workdir, read_holder(workdir)))
        for gen in range(max(newest - 8, 1), newest + 1):  # older claims: no longer consulted
            with contextlib.suppress(OSError):
                os.remove(_claim_path(workdir, gen))
        if newest and not (holder is not None and holder.released):
            lock.inherited = holder or Holder("?", 0, 0.0, 0.0, newest)
        return lock
    except BaseException:
        if fd is not None:
            os.close(fd)
        raise


def _before_claim(lock: _Lock) -> None:
    """Runs between judging the newest claim and creating the next (nothing: a seam where a
    test stalls a taker)."""


def acquire(workdir: str) -> None:
    """Takes `workdir` for this process (creating it), or raises Busy naming the holder,
    LockError when the lock's files cannot be used, ValueError for a bad AEPG_LOCK_* setting."""
    workdir = os.path.abspath(workdir)
    _, _, use_flock = settings()
    with _guard:
        if workdir in _held:
            _held[workdir] += 1
            return
        try:
            lock = _take(workdir, use_flock)
        except OSError as err:
            raise _lock_error(workdir, err) from None
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


def _covering(path: str | os.PathLike) -> _Lock | None:
    """The lock this process holds on `path` or a directory above it."""
    path = os.path.abspath(os.fspath(path))
    for workdir, held in list(_locks.items()):
        if path == workdir or path.startswith(workdir + os.sep):
            return held
    return None


def fence(path: str | os.PathLike, now: bool = False) -> None:
    """Before writing `path`: raises Lost when this process held the workdir holding `path` and
    another process has taken it over (`now`: re-reading the claims whenever called). A path
    under no lock of this process passes."""
    held = _covering(path)
    if held is not None:
        held.fence(now)


def fence_of(path: str | os.PathLike) -> Callable[[], None]:
    """The check for a write to `path` started now and finished later (on another thread): it
    raises Lost unless the lock this process holds now on `path` is still held and owned then,
    re-reading the claims at each call. A path under no lock of this process: a no-op."""
    held = _covering(path)
    if held is None:
        return lambda: None
    return functools.partial(held.fence, True)


def claim_number(path: str | os.PathLike) -> int | None:
    """The number of the claim under which this process writes `path` (the same on every
    process of a run), or None under no lock."""
    held = _covering(path)
    return None if held is None else held.gen


def inherited(path: str | os.PathLike) -> Holder | None:
    """The holder this process took the workdir of `path` over from when it had not released
    it (dead, or paused past AEPG_LOCK_STALE_S: its unfinished writes are there), else None."""
    held = _covering(path)
    return None if held is None else held.inherited


def owns(path: str | os.PathLike) -> bool:
    """Whether this process may still write `path` (fence without raising; as cheap)."""
    held = _covering(path)
    if held is None:
        return True
    try:
        held.fence()
    except Lost:
        return False
    return True


@contextlib.contextmanager
def hold(workdir: str) -> Iterator[None]:
    """`workdir` held for the duration (reentrant); Busy if another run holds it."""
    acquire(workdir)
    try:
        yield
    finally:
        release(workdir)


def follow(workdir: str, gen: int) -> None:
    """For a process of a multi-process run other than process 0: its writes under `workdir`
    are fenced by claim `gen`, the one its process 0 holds (reentrant; `release` ends it)."""
    workdir = os.path.abspath(workdir)
    with _guard:
        if workdir in _held:
            _held[workdir] += 1
            return
        _held[workdir], _locks[workdir] = 1, _Lock(workdir, None, gen, follower=True)


@contextlib.contextmanager
def hold_run(workdir: str) -> Iterator[None]:
    """`hold` for every process of a (multi-process) run: process 0 takes the lock and the
    others follow its claim (`follow`), so that all of them run, or all raise Busy, alike, and
    every one of them is fenced."""
    import jax
    import numpy as np
    from jax.experimental import multihost_utils

    from aepg_jax.system import hosts

    if jax.process_count() == 1:
        with hold(workdir):
            yield
        return
    refused, gen = None, 0
    if hosts.is_main():
        try:
            acquire(workdir)
            gen = claim_number(workdir) or 0
        except (Busy, LockError, ValueError) as err:
            refused = err
    gen = int(np.max(multihost_utils.process_allgather(np.asarray(gen, np.int64))))
    if gen == 0:
        raise refused or Busy(busy_message(os.path.abspath(workdir), read_holder(workdir)))
    if not hosts.is_main():
        follow(workdir, gen)
    try:
        yield
    finally:
        release(workdir)
