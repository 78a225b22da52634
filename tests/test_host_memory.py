"""`aepg_jax.system.host_memory`: MemAvailable capped by every enclosing memory cgroup's limit
less its working set (usage less the inactive file pages the kernel reclaims first), read from
fake cgroup trees (v1, v2, hybrid) with hand-computed answers."""

from __future__ import annotations

import os
import pathlib
import subprocess
import sys

import pytest

from aepg_jax.system import host_memory

MIB = 2**20
NO_LIMIT_V1 = 2**63 - 4096


def _write(path: pathlib.Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)


def _v1_level(directory: pathlib.Path, limit: int, usage: int, stat: str) -> None:
    _write(directory / "memory.limit_in_bytes", str(limit))
    _write(directory / "memory.usage_in_bytes", str(usage))
    _write(directory / "memory.stat", stat)


def test_v1_counts_usage_less_total_inactive_file_at_every_level(tmp_path):
    proc = tmp_path / "cgroup"
    _write(proc, "11:cpu,cpuacct:/slurm/uid_0/job_7\n5:memory:/slurm/uid_0/job_7\n")
    fs = tmp_path / "fs"
    v1 = fs / "memory"
    # The job: 2560 MiB limit, 2550 MiB used of which 2400 MiB inactive page cache (its own
    # `inactive_file` is smaller: a child holds the rest; the hierarchical `total_` counts).
    _v1_level(
        v1 / "slurm" / "uid_0" / "job_7",
        2560 * MIB,
        2550 * MIB,
        f"cache {2450 * MIB}\ninactive_file {100 * MIB}\nactive_file {50 * MIB}\n"
        f"total_cache {2450 * MIB}\ntotal_inactive_file {2400 * MIB}\n",
    )
    # The user: 4096 MiB limit, 3500 MiB used, 2400 MiB inactive: 4096 - 1100 = 2996 MiB left.
    _v1_level(
        v1 / "slurm" / "uid_0",
        4096 * MIB,
        3500 * MIB,
        f"total_inactive_file {2400 * MIB}\n",
    )
    _v1_level(v1 / "slurm", NO_LIMIT_V1, 9000 * MIB, "total_inactive_file 0\n")
    _v1_level(v1, NO_LIMIT_V1, 20000 * MIB, "total_inactive_file 0\n")
    # The job: 2560 - (2550 - 2400) = 2410 MiB; the user's 2996 MiB is looser.
    assert host_memory.cgroup_headroom(str(proc), str(fs)) == 2410 * MIB
    # Before this counting, limit - usage: 10 MiB, which refused a run that fits.
    meminfo = tmp_path / "meminfo"
    _write(meminfo, f"MemTotal: 100 kB\nMemAvailable: {3000 * 1024} kB\n")
    assert host_memory.available(str(meminfo), str(proc), str(fs)) == 2410 * MIB
    _write(meminfo, f"MemAvailable: {1000 * 1024} kB\n")  # the host is the tighter one
    assert host_memory.available(str(meminfo), str(proc), str(fs)) == 1000 * MIB


def test_v2_counts_memory_current_less_inactive_file(tmp_path):
    proc = tmp_path / "cgroup"
    _write(proc, "0::/user.slice/job\n")
    root = tmp_path / "fs"
    # The job: no limit of its own ("max"). The slice: 3072 MiB, 2970 used, 2000 inactive:
    # 3072 - 970 = 2102 MiB left. The root has no memory.max (as on a real v2 host).
    _write(root / "user.slice" / "job" / "memory.max", "max\n")
    _write(root / "user.slice" / "job" / "memory.current", str(2900 * MIB))
    _write(root / "user.slice" / "job" / "memory.stat", f"inactive_file {1990 * MIB}\n")
    _write(root / "user.slice" / "memory.max", str(3072 * MIB))
    _write(root / "user.slice" / "memory.current", str(2970 * MIB))
    _write(
        root / "user.slice" / "memory.stat",
        f"anon {900 * MIB}\nfile {2050 * MIB}\nactive_file {50 * MIB}\n"
        f"inactive_file {2000 * MIB}\n",
    )
    _write(root / "memory.current", str(9000 * MIB))
    assert host_memory.cgroup_headroom(str(proc), str(root)) == 2102 * MIB
    # A stat read ahead of the usage (inactive above usage): the working set is 0, not negative.
    _write(root / "user.slice" / "memory.stat", f"inactive_file {3000 * MIB}\n")
    assert host_memory.cgroup_headroom(str(proc), str(root)) == 3072 * MIB
    # No memory.stat: the whole usage counts.
    (root / "user.slice" / "memory.stat").unlink()
    assert host_memory.cgroup_headroom(str(proc), str(root)) == 102 * MIB


def test_hybrid_layout_reads_the_v1_memory_controller_and_the_unified_tree(tmp_path):
    proc = tmp_path / "cgroup"
    _write(proc, "12:memory:/job\n1:name=systemd:/job\n0::/job\n")
    fs = tmp_path / "fs"
    _v1_level(fs / "memory" / "job", 1024 * MIB, 1000 * MIB, f"total_inactive_file {600 * MIB}\n")
    _write(fs / "unified" / "job" / "cgroup.procs", "")  # no memory controller there
    assert host_memory.cgroup_headroom(str(proc), str(fs)) == 624 * MIB
    # The unified half with a limit of its own (512 MiB, 300 used, 100 inactive) also counts.
    _write(fs / "unified" / "job" / "memory.max", str(512 * MIB))
    _write(fs / "unified" / "job" / "memory.current", str(300 * MIB))
    _write(fs / "unified" / "job" / "memory.stat", f"inactive_file {100 * MIB}\n")
    assert host_memory.cgroup_headroom(str(proc), str(fs)) == 312 * MIB


def test_no_limit_anywhere_leaves_mem_available(tmp_path):
    proc = tmp_path / "cgroup"
    _write(proc, "0::/\n")
    meminfo = tmp_path / "meminfo"
    _write(meminfo, "MemTotal: 100 kB\nMemAvailable:   524288 kB\n")
    assert host_memory.cgroup_headroom(str(proc), str(tmp_path / "none")) is None
    assert host_memory.available(str(meminfo), str(proc), str(tmp_path / "none")) == 2**29
    assert host_memory.available(str(tmp_path / "missing"), str(proc), str(tmp_path)) is None


def test_a_real_cgroup_full_of_page_cache_leaves_its_limit_available(tmp_path):
    """A child process in a 512 MiB memory cgroup that this test creates (v1 or v2, as root)
    writes 384 MiB of files: the cgroup's usage counts them, the memory available does not
    (the kernel reclaims them first). Skipped with the reason where no cgroup can be made."""
    fs_type = subprocess.run(
        ["stat", "-f", "-c", "%T", str(tmp_path)], capture_output=True, text=True
    )
    if fs_type.stdout.strip() in ("tmpfs", "ramfs"):
        pytest.skip("tmp_path is in memory: its files are not reclaimable page cache")
    name = f"aepg-host-memory-test-{os.getpid()}"
    for base, limit_file, usage in (
        ("/sys/fs/cgroup/memory", "memory.limit_in_bytes", "memory.usage_in_bytes"),
        ("/sys/fs/cgroup", "memory.max", "memory.current"),
    ):
        group, usage_file = pathlib.Path(base) / name, usage
        try:
            group.mkdir()
            (group / limit_file).write_text(str(512 * MIB))
        except OSError:
            if group.exists():
                group.rmdir()
            continue
        break
    else:
        pytest.skip("no memory cgroup can be created here (needs root and a cgroup fs)")
    cache = tmp_path / "page_cache"
    code = "from aepg_jax.system import host_memory; print(host_memory.available())"
    script = (
        f"echo $$ > {group / 'cgroup.procs'} && "
        f"dd if=/dev/zero of={cache} bs=1M count=384 status=none && "
        f'cat {group / usage_file} && exec "$0" -c "$1"'
    )
    try:
        proc = subprocess.run(
            ["sh", "-c", script, sys.executable, code],
            capture_output=True,
            text=True,
            timeout=120,
            cwd=pathlib.Path(__file__).resolve().parents[1],
        )
    finally:
        cache.unlink(missing_ok=True)
        group.rmdir()
    assert proc.returncode == 0, proc.stderr[-2000:]
    usage, available = (int(x) for x in proc.stdout.split())
    assert usage >= 384 * MIB  # the files are charged to the cgroup
    assert 384 * MIB <= available <= 512 * MIB  # limit - usage would leave < 128 MiB
