"""The persistent compilation cache (`system/xla_cache.py`, its files `system/xla_store.py`):
where it is, that processes share one directory, that a program read back computes what the
compiled one did, and that a damaged entry, an entry of another program, a read-only
directory, a full disk or a path that is a file or a link to nothing each end in one `warning:`
line (never a traceback or jax's own warnings) while the run goes on."""

from __future__ import annotations

import errno
import functools
import hashlib
import json
import os
import shutil
import struct
import subprocess
import sys
import textwrap

import pytest

from aepg_jax.system import xla_cache, xla_store

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# Compiles three programs (counted by `compiles.Counter`) with the cache in argv[1] and prints
# the counter's summary, the results and the class of jax's cache backend.
SCRIPT = textwrap.dedent("""
    import json, sys
    from aepg_jax.system import compiles, xla_cache
    xla_cache.enable(xla_cache.directory(sys.argv[1]))
    import jax, jax.numpy as jnp, numpy as np
    from jax._src import compilation_cache
    x = np.linspace(0.0, 1.0, 64, dtype=np.float32).reshape(8, 8)
    with compiles.Counter() as counter:
        out = [
            jax.jit(lambda a: jnp.tanh(a @ a.T).sum(0))(x),
            jax.jit(lambda a: jnp.exp(a) / jnp.exp(a).sum())(x),
            jax.jit(lambda a, b: jnp.sin(a) * b)(x, x),
        ]
    backend = type(compilation_cache._cache).__name__
    print(json.dumps({
        "summary": counter.summary(), "out": [o.tolist() for o in out], "backend": backend,
    }))
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


# --- the store: whole entries only, problems in one line ---------------------------------------


def _store(tmp_path, max_bytes: int = 2**20) -> tuple[xla_store.Store, list[str]]:
    lines: list[str] = []
    store = xla_store.Store.open(str(tmp_path / "xla"), max_bytes, lines.append)
    assert store is not None
    return store, lines


def test_a_damaged_entry_is_a_miss_said_once_and_written_again(tmp_path):
    store, lines = _store(tmp_path)
    for key in ("a", "b"):
        store.put(key, key.encode() * 1000)
        assert store.get(key) == key.encode() * 1000
    a, b = (os.path.join(store.path, f"{key}.xla") for key in ("a", "b"))
    os.truncate(a, os.path.getsize(a) - 1)  # truncated
    with open(b, "wb") as f:
        f.write(b"garbage")  # overwritten
    assert store.get("a") is None and store.get("b") is None
    assert len(lines) == 1 and "damaged entry a.xla" in lines[0] and store.path in lines[0]
    assert not os.path.exists(a) and not os.path.exists(b)  # dropped
    store.put("a", b"a" * 1000)
    assert store.get("a") == b"a" * 1000
    assert sorted(os.listdir(store.path)) == ["a.xla"]  # no temporary file left


def test_a_whole_entry_of_another_key_is_a_miss_said_once_and_written_again(tmp_path):
    """Entries swapped (a copy or sync tool, a hand): each passes its checksum but holds the
    other key's program, so neither is read as its file's program."""
    store, lines = _store(tmp_path)
    for key in ("jit_add-1", "jit_add-2", "jit_eval_step-3"):
        store.put(key, key.encode() * 100)
    a, b, c = (os.path.join(store.path, f"{key}.xla") for key in ("jit_add-1", "jit_add-2",
                                                                   "jit_eval_step-3"))  # fmt: skip
    os.rename(a, a + ".x")
    os.rename(b, a)
    os.rename(a + ".x", b)
    shutil.copyfile(c, a)  # and one replaced by a third program's
    assert [store.get(k) for k in ("jit_add-1", "jit_add-2")] == [None, None]
    assert store.get("jit_eval_step-3") == b"jit_eval_step-3" * 100
    assert store.foreign == 2 and store.damaged == 0
    assert len(lines) == 1 and store.path in lines[0] and "another program" in lines[0]
    assert sorted(os.listdir(store.path)) == ["jit_eval_step-3.xla"]  # dropped
    store.put("jit_add-1", b"1" * 100)
    assert store.get("jit_add-1") == b"1" * 100


def test_an_entry_of_the_earlier_format_is_replaced_without_a_line(tmp_path):
    store, lines = _store(tmp_path)
    old = os.path.join(store.path, "k.xla")
    payload = b"p" * 100
    with open(old, "wb") as f:  # magic, length, sha256(payload), payload
        f.write(struct.pack(">8sQ32s", b"aepgxla1", 100, hashlib.sha256(payload).digest()))
        f.write(payload)
    assert store.get("k") is None and not lines
    store.put("k", payload)
    assert store.get("k") == payload and not lines


class _Failing:
    """A file whose writes fail with `code` (a full disk: ENOSPC)."""

    def __init__(self, path, mode, code):
        self.file, self.code = open(path, mode), code

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.file.close()

    def write(self, data):
        raise OSError(self.code, os.strerror(self.code))


@pytest.mark.parametrize(
    "code, said", [(errno.ENOSPC, "the disk is full"), (errno.EROFS, "is read-only")]
)
def test_a_failed_write_is_said_once_and_ends_the_writes(tmp_path, monkeypatch, code, said):
    store, lines = _store(tmp_path)
    store.put("a", b"a" * 100)
    monkeypatch.setattr(xla_store, "open", lambda p, m: _Failing(p, m, code), raising=False)
    for key in ("b", "c"):
        store.put(key, b"x" * 100)
    assert len(lines) == 1 and said in lines[0] and store.path in lines[0]
    assert not store.writable
    assert os.listdir(store.path) == ["a.xla"]  # no partial file
    monkeypatch.undo()
    assert store.get("a") == b"a" * 100  # still read


# Writes and reads 20 keys 300 times over in the store argv[1]; prints the lines it said, the
# damaged entries it met and the reads that returned another key's payload.
RACE = textwrap.dedent("""
    import json, sys
    from aepg_jax.system import xla_store
    lines = []
    store = xla_store.Store.open(sys.argv[1], 2**16, lines.append)
    payload = lambda j: f"k{j}".encode() * (100 + 37 * j)
    wrong = 0
    for i in range(300):
        store.put(f"k{i % 20}", payload(i % 20))
        got = store.get(f"k{i * 7 % 20}")
        wrong += got is not None and got != payload(i * 7 % 20)
    print(json.dumps({"lines": lines, "damaged": store.damaged, "wrong": wrong}))
""")


def test_processes_writing_and_evicting_at_once_never_read_part_of_an_entry(tmp_path):
    """Three processes write, overwrite, evict (64 KiB hold about 20 entries) and read the same
    keys at once: every read is a whole entry or a miss."""
    cache = str(tmp_path / "xla")
    cmd = [sys.executable, "-c", RACE, cache]
    procs = [subprocess.Popen(cmd, cwd=REPO, stdout=subprocess.PIPE, text=True) for _ in range(3)]
    outs = [json.loads(p.communicate(timeout=60)[0]) for p in procs]
    assert outs == [{"lines": [], "damaged": 0, "wrong": 0}] * 3
    assert all(name.endswith(".xla") for name in os.listdir(cache))  # no temporary file left


def test_a_cache_path_that_is_a_file_is_said_and_not_used(tmp_path):
    file = tmp_path / "xla"
    file.write_text("not a directory")
    for path, said in ((file, "is a file"), (file / "below", "cannot be created")):
        lines: list[str] = []
        assert xla_store.Store.open(str(path), 2**20, lines.append) is None
        assert len(lines) == 1 and f"{path} {said}" in lines[0]


def test_a_cache_path_through_a_link_to_nothing_is_said_as_one(tmp_path):
    """A `~/.cache` linked to a scratch disk that is not mounted: the link is named."""
    link = tmp_path / "cache"
    link.symlink_to(tmp_path / "unmounted" / "scratch")
    for path in (link, link / "aepg_jax" / "xla"):
        lines: list[str] = []
        assert xla_store.Store.open(str(path), 2**20, lines.append) is None
        assert len(lines) == 1 and "is a file" not in lines[0], lines
        target = tmp_path / "unmounted" / "scratch"
        assert f"{link} is a link to {target}, which does not exist" in lines[0]


def test_the_least_recently_used_entries_go_beyond_the_size(tmp_path):
    store, lines = _store(tmp_path, max_bytes=3 * len(xla_store.pack("a", b"a" * 1000)))
    foreign = os.path.join(store.path, "jit_f-0123-cache")  # jax's own entry: not touched
    stale = os.path.join(store.path, ".1-dead.tmp")  # a killed writer's
    for file in (foreign, stale):
        with open(file, "wb") as f:
            f.write(b"x")
    os.utime(stale, (0, 0))
    for i, key in enumerate("abc"):
        store.put(key, key.encode() * 1000)
        os.utime(os.path.join(store.path, f"{key}.xla"), ns=(i, i))
    store.get("a")  # used: now the most recent
    store.put("d", b"d" * 1000)
    assert sorted(os.listdir(store.path)) == ["a.xla", "c.xla", "d.xla", "jit_f-0123-cache"]
    assert not lines


# --- the real thing: a program compiled, damaged, read back ------------------------------------


def _run(directory: str, wrap: list[str] | None = None) -> tuple[dict, list[str]]:
    """SCRIPT with the cache in `directory` (in `wrap`'s command): its output and stderr lines."""
    env = {k: v for k, v in os.environ.items() if k != xla_cache.ENV}
    cmd = [*(wrap or []), sys.executable, "-c", SCRIPT, directory]
    p = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr
    return json.loads(p.stdout), p.stderr.splitlines()


def _entries(directory: str) -> dict[str, bytes | None]:
    out = {}
    for name in sorted(os.listdir(directory)):
        with open(os.path.join(directory, name), "rb") as f:
            out[name] = xla_store.unpack(f.read())
    return out


@pytest.mark.slow
def test_a_damaged_entry_is_rewritten_by_the_next_run_and_read_by_the_one_after(tmp_path):
    cache = str(tmp_path / "xla")
    first, err = _run(cache)
    assert first["backend"] == "Store" and first["summary"]["cached"] == 0 and err == []
    entries = _entries(cache)
    assert len(entries) == 3 and all(entries.values())
    truncated, overwritten, _ = (os.path.join(cache, name) for name in entries)
    os.truncate(truncated, os.path.getsize(truncated) // 2)
    with open(overwritten, "r+b") as f:
        f.seek(100)
        f.write(b"garbage")
    second, err = _run(cache)
    assert second["summary"]["cached"] == 1 and second["out"] == first["out"]
    assert len(err) == 1 and err[0].startswith("warning: compilation cache") and "damaged" in err[0]
    again = _entries(cache)  # whole again, each under its key (a payload holds its compile time)
    assert {k: v and v[0] for k, v in again.items()} == {k: v[0] for k, v in entries.items()}
    third, err = _run(cache)
    assert third["summary"]["cached"] == 3 and third["out"] == first["out"] and err == []


def _tiny_run(tmp_path, cache: str, name: str) -> tuple[dict, list[str]]:
    """The tiny continual config (2 tasks) through `aepg_jax.main` with the cache in `cache`:
    (its results.json, its stderr lines other than progress bars)."""
    from tiny import write_spec

    spec = write_spec(tmp_path / "spec.json", tmp_path / "data", {"data.num_tasks": 2})
    env = {**os.environ, xla_cache.ENV: cache, "JAX_PLATFORMS": "cpu"}
    workdir = tmp_path / name
    cmd = [sys.executable, "-m", "aepg_jax.main", f"--config={spec}", f"--workdir={workdir}"]
    p = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=600)
    assert p.returncode == 0, p.stderr[-3000:]
    lines = [ln for ln in p.stderr.splitlines() if ln.startswith(("warning", "error", "Trace"))]
    return json.loads((workdir / "results.json").read_text()), lines


@pytest.mark.slow
def test_entries_swapped_or_replaced_by_another_programs_are_compiled_again(tmp_path):
    """A run after two entries of one operation were swapped and the train step's was replaced
    by the evaluation's (each whole, so each passes its checksum): one line naming
    the cache, and the clean run's accuracy matrix."""
    cache = str(tmp_path / "xla")
    clean, lines = _tiny_run(tmp_path, cache, "clean")
    assert lines == []
    entries = sorted(os.listdir(cache))
    by_program: dict[str, list[str]] = {}
    for name in entries:
        by_program.setdefault(name.rsplit("-", 1)[0], []).append(name)
    a, b = by_program["jit_add"][:2]  # two shapes of one operation
    step, evaluation = by_program["jit_step"][0], by_program["jit_eval_step"][0]
    path = functools.partial(os.path.join, cache)
    os.rename(path(a), path("swap"))
    os.rename(path(b), path(a))
    os.rename(path("swap"), path(b))
    shutil.copyfile(path(evaluation), path(step))
    again, lines = _tiny_run(tmp_path, cache, "again")
    assert len(lines) == 1 and lines[0].startswith(f"warning: compilation cache {cache}: entry")
    assert "another program" in lines[0]
    assert again["accuracy_matrix"] == clean["accuracy_matrix"]
    assert sorted(os.listdir(cache)) == entries  # written again under their own keys
    _, lines = _tiny_run(tmp_path, cache, "third")
    assert lines == []


def _user_namespace_mounts() -> bool:
    return (
        shutil.which("unshare") is not None
        and subprocess.run(["unshare", "-rm", "true"], capture_output=True).returncode == 0
    )


# `unshare -rm sh -c MOUNT DIR cmd...`: cmd in a mount namespace where DIR is MOUNT's.
READ_ONLY = 'mount --bind "$0" "$0" && mount -o remount,ro,bind "$0" && exec "$@"'
TINY_DISK = 'mount -t tmpfs -o size=8k tmpfs "$0" && exec "$@"'


@pytest.mark.slow
def test_a_read_only_cache_is_read_and_said_once(tmp_path):
    cache = str(tmp_path / "xla")
    first, _ = _run(cache)
    before = _entries(cache)
    if os.geteuid() != 0:
        os.chmod(cache, 0o555)
        wrap = []
    elif _user_namespace_mounts():
        wrap = ["unshare", "-rm", "sh", "-c", READ_ONLY, cache]
    else:
        pytest.skip("root without mount namespaces: no read-only directory to test")
    try:
        again, err = _run(cache, wrap)
    finally:
        os.chmod(cache, 0o755)
    assert again["summary"]["cached"] == 3 and again["out"] == first["out"]
    assert len(err) == 1 and "is read-only" in err[0] and cache in err[0]
    assert _entries(cache) == before


@pytest.mark.slow
def test_a_full_disk_and_a_file_for_a_cache_are_said_once_and_the_run_goes_on(tmp_path):
    without, err = _run("0")
    file = tmp_path / "xla"
    file.write_text("")
    out, err = _run(str(file))
    assert out["out"] == without["out"] and out["summary"]["cached"] == 0
    assert len(err) == 1 and f"{file} is a file" in err[0]
    if not _user_namespace_mounts():
        pytest.skip("no mount namespaces: the full disk is the store's test above")
    disk = tmp_path / "disk"
    disk.mkdir()
    out, err = _run(str(disk), ["unshare", "-rm", "sh", "-c", TINY_DISK, str(disk)])
    assert out["out"] == without["out"]
    assert len(err) == 1 and f"{disk}: the disk is full" in err[0]


def test_a_launched_run_says_it_from_process_0_alone(monkeypatch, capsys):
    from aepg_jax.launch import launch

    for process, said in (("0", True), ("1", False)):
        monkeypatch.setenv(launch.ENV_PROCESS_ID, process)
        xla_cache.say("compilation cache /x is read-only")
        err = capsys.readouterr().err
        assert err == ("warning: compilation cache /x is read-only\n" if said else "")
