"""The persistent compilation cache's files: one checksummed file per compiled program, written
atomically, read back only when whole (`system/xla_cache.py` hands this store to jax).

An entry is `<key>.xla` in the cache directory:

    bytes 0-7    MAGIC ("aepgxla2")
    bytes 8-15   k, the key's length (big-endian)
    bytes 16-23  n, the payload's length
    bytes 24-55  sha256(k, key, payload)
    bytes 56-    key (k bytes, UTF-8), then payload: what jax stores (its compressed executable
                 and compile time)

The key inside the checksummed entry binds it to the program it was compiled for: a whole
entry under another name (copied, renamed or swapped by a sync tool or a hand) is not read as
this program.

- write: the entry goes to a hidden temporary file (`.<pid>-<random>.tmp`) in the same
  directory, which is then renamed onto `<key>.xla` (`os.replace`, atomic on one file system):
  a reader sees the old entry, the new one or none, never part of one, and processes writing
  the same program at once leave one whole entry. No lock is taken, so a directory that cannot
  be written can still be read.
- read: an entry whose magic, lengths or checksum do not match (truncated, overwritten) is
  damaged, and a whole entry whose key is not its file's is another program's: either is a
  miss, the file is removed (unless another process has already replaced it) and the program
  is compiled and written again; the first of each kind is reported in one line per process.
  An entry of the store's earlier format (`aepgxla1`, no key) is a silent miss, replaced by
  the program's new entry.
- size: at most `max_bytes`; beyond it the entries least recently used (modified: a read
  touches its entry) are removed. Temporary files older than `STALE_TMP_S` (left by a killed
  writer) are removed too. Files the store does not name (jax's own `*-cache` entries,
  other files) are never touched.
- problems: a path that is a file, a link to nothing (or below one) or cannot be created
  makes `Store.open` return None (one line; the run compiles without the cache); a directory
  that cannot be written (read-only file system or permissions) is read, never written (one
  line); a write that fails (a full disk, a quota, ...) stops this process's writes (one line
  naming the cause), reads go on.

`say(message)` receives each of these lines; nothing here raises for a damaged or unusable
cache, so jax's own warnings for failed reads and writes never fire.
"""

from __future__ import annotations

import errno
import hashlib
import os
import secrets
import stat
import struct
import time
from collections.abc import Callable

MAGIC = b"aepgxla2"
EARLIER = (b"aepgxla1",)  # the store's earlier formats: replaced without a line
HEADER = struct.Struct(">8sQQ32s")  # magic, key length, payload length, sha256
SUFFIX = ".xla"
TMP_SUFFIX = ".tmp"
STALE_TMP_S = 3600.0  # a temporary file this old belongs to a writer that died
READ_ONLY = (errno.EACCES, errno.EPERM, errno.EROFS)
DISK_FULL = (errno.ENOSPC, errno.EDQUOT)


def _digest(key: bytes, payload: bytes) -> bytes:
    return hashlib.sha256(struct.pack(">Q", len(key)) + key + payload).digest()


def pack(key: str, payload: bytes) -> bytes:
    """The entry of `payload` compiled for `key`: header (magic, lengths, sha256) + key +
    payload."""
    k = key.encode()
    return HEADER.pack(MAGIC, len(k), len(payload), _digest(k, payload)) + k + payload


def unpack(entry: bytes) -> tuple[str, bytes] | None:
    """(key, payload) of a whole entry, None for a damaged one (truncated, overwritten)."""
    if len(entry) < HEADER.size:
        return None
    magic, k, n, digest = HEADER.unpack_from(entry)
    if magic != MAGIC or HEADER.size + k + n != len(entry):
        return None
    key, payload = entry[HEADER.size : HEADER.size + k], entry[HEADER.size + k :]
    if _digest(key, payload) != digest:
        return None
    try:
        return key.decode(), payload
    except UnicodeDecodeError:
        return None


class Store:
    """jax's cache backend interface (`get(key) -> bytes | None`, `put(key, bytes)`, `_path`)
    over a directory of checksummed entries. Build it with `Store.open`."""

    def __init__(
        self,
        path: str,
        max_bytes: int,
        say: Callable[[str], None],
        writable: bool = True,
        hint: str = "",
    ):
        self.path = path
        self._path = path  # the attribute jax's wrappers and log lines read
        self.max_bytes = max_bytes
        self.say = say
        self.writable = writable
        self.hint = hint  # what the user can do, appended to the lines about the directory
        self.damaged = 0  # damaged entries met by this process
        self.foreign = 0  # whole entries under another program's key met by this process
        self._said: set[str] = set()

    @classmethod
    def open(
        cls, path: str, max_bytes: int, say: Callable[[str], None], hint: str = ""
    ) -> Store | None:
        """The store in directory `path` (created if missing), or None when `path` cannot be
        one: a file, or a directory that cannot be created (said in one line). `hint`: what
        the user can do instead, appended to every line."""
        path = os.path.abspath(path)
        off = "running without the persistent compilation cache"
        link = _dangling_link(path)
        if link is not None:
            say(
                f"compilation cache {path}: {link} is a link to {os.readlink(link)}, which does "
                f"not exist (a disk not mounted?): {off}{hint}"
            )
            return None
        try:
            os.makedirs(path, exist_ok=True)
        except FileExistsError:
            say(f"compilation cache {path} is a file, not a directory: {off}{hint}")
            return None
        except OSError as err:
            say(f"compilation cache {path} cannot be created ({_cause(err)}): {off}{hint}")
            return None
        if not os.path.isdir(path):  # a link to a file
            say(f"compilation cache {path} is not a directory: {off}{hint}")
            return None
        if not os.access(path, os.R_OK | os.X_OK):
            say(f"compilation cache {path} cannot be read (permission denied): {off}{hint}")
            return None
        writable = os.access(path, os.W_OK | os.X_OK)
        store = cls(path, max_bytes, say, writable, hint)
        if not writable:
            store._once("read-only", store._read_only_line())
        return store

    # --- jax's interface ---------------------------------------------------------------------

    def get(self, key: str) -> bytes | None:
        """The payload stored for `key`; None when there is none, it is damaged or it is
        another key's."""
        file = self._file(key)
        try:
            with open(file, "rb") as f:
                entry = f.read()
                inode = os.fstat(f.fileno()).st_ino
        except FileNotFoundError:
            return None
        except OSError as err:
            self._once(
                "unreadable",
                f"compilation cache {self.path}: an entry cannot be read ({_cause(err)}): "
                "its program is compiled instead",
            )
            return None
        unpacked = unpack(entry)
        if unpacked is None and entry[: len(MAGIC)] in EARLIER:
            return None  # put replaces it
        again = "written again" if self.writable else "not written (read-only)"
        name = os.path.basename(file)
        if unpacked is None:
            self.damaged += 1
            self._drop(file, inode)
            self._once(
                "damaged",
                f"compilation cache {self.path}: damaged entry {name} (truncated or "
                f"overwritten) dropped; damaged entries are compiled and {again}",
            )
            return None
        stored, payload = unpacked
        if stored != key:
            self.foreign += 1
            self._drop(file, inode)
            self._once(
                "foreign",
                f"compilation cache {self.path}: entry {name} holds another program "
                f"({stored}: copied or renamed) and was dropped; such entries are compiled "
                f"and {again}",
            )
            return None
        if self.writable:
            try:  # least recently used = least recently modified
                os.utime(file)
            except OSError:
                pass
        return payload

    def put(self, key: str, value: bytes) -> None:
        """Stores `value` for `key` (replacing a damaged entry); a failed write is said once
        and ends this process's writes."""
        if not self.writable:
            return
        entry = pack(key, value)
        if len(entry) > self.max_bytes:
            return
        self._evict(len(entry))
        try:
            self._write(self._file(key), entry)
        except FileNotFoundError:  # the directory was removed while the run ran: once more
            try:
                os.makedirs(self.path, exist_ok=True)
                self._write(self._file(key), entry)
            except OSError as err:
                self._write_failed(err)
        except OSError as err:
            if err.errno != errno.ENAMETOOLONG:  # that program alone is not kept
                self._write_failed(err)

    # --- files -------------------------------------------------------------------------------

    def _file(self, key: str) -> str:
        return os.path.join(self.path, f"{key}{SUFFIX}")

    def _write(self, file: str, entry: bytes) -> None:
        tmp = os.path.join(self.path, f".{os.getpid()}-{secrets.token_hex(6)}{TMP_SUFFIX}")
        try:
            with open(tmp, "xb") as f:
                f.write(entry)
            os.replace(tmp, file)
        except BaseException:
            try:
                os.unlink(tmp)
            except OSError:
                pass
            raise

    def _drop(self, file: str, inode: int) -> None:
        """Removes the damaged or foreign `file` unless another process has replaced it since
        it was read."""
        if not self.writable:
            return
        try:
            if os.stat(file).st_ino == inode:
                os.unlink(file)
        except OSError:
            pass

    def _evict(self, incoming: int) -> None:
        """Removes the least recently used entries until `incoming` more bytes fit, and
        temporary files left by dead writers."""
        entries: list[tuple[int, str, int]] = []
        total = 0
        now = time.time()
        try:
            listing = list(os.scandir(self.path))
        except OSError:
            return
        for item in listing:
            name = item.name
            try:
                st = item.stat(follow_symlinks=False)
            except OSError:
                continue
            if not stat.S_ISREG(st.st_mode):
                continue
            if name.startswith(".") and name.endswith(TMP_SUFFIX):
                if now - st.st_mtime > STALE_TMP_S:
                    _unlink(item.path)
            elif name.endswith(SUFFIX):
                entries.append((st.st_mtime_ns, item.path, st.st_size))
                total += st.st_size
        entries.sort()
        for _, file, size in entries:
            if total + incoming <= self.max_bytes:
                break
            _unlink(file)
            total -= size

    # --- lines -------------------------------------------------------------------------------

    def _once(self, kind: str, line: str) -> None:
        if kind not in self._said:
            self._said.add(kind)
            self.say(line)

    def _read_only_line(self) -> str:
        return (
            f"compilation cache {self.path} is read-only: its programs are read, new ones are "
            f"not written{self.hint}"
        )

    def _write_failed(self, err: OSError) -> None:
        self.writable = False
        if err.errno in READ_ONLY:
            self._once("read-only", self._read_only_line())
            return
        cause = "the disk is full" if err.errno in DISK_FULL else "a write failed"
        self._once(
            "write",
            f"compilation cache {self.path}: {cause} ({_cause(err)}): the run goes on without "
            f"writing to it{self.hint}",
        )


def _dangling_link(path: str) -> str | None:
    """`path` or the first directory above it that is a symbolic link to nothing, if any."""
    parts = path.split(os.sep)
    for i in range(2, len(parts) + 1):
        here = os.sep.join(parts[:i])
        if os.path.islink(here) and not os.path.exists(here):
            return here
    return None


def _cause(err: OSError) -> str:
    return err.strerror or type(err).__name__


def _unlink(file: str) -> None:
    try:
        os.unlink(file)
    except OSError:
        pass
