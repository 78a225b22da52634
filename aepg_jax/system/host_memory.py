"""Host memory this process may still allocate before the kernel's OOM killer acts.

    available = min(MemAvailable, min over enclosing memory cgroups of (limit - working set))
    working set = usage - reclaimable file pages           (as the kubelet counts it)

`MemAvailable` (/proc/meminfo) is the kernel's own estimate for the whole host; it already
counts reclaimable page cache as available. A memory cgroup's usage counts page cache too
(files read or written inside it, a memory-mapped dataset): the kernel reclaims its inactive
file pages before it OOM-kills anything in the cgroup, so they are subtracted:

    cgroup v1   memory.limit_in_bytes - (memory.usage_in_bytes - total_inactive_file)
    cgroup v2   memory.max            - (memory.current        - inactive_file)

(`total_inactive_file` of v1's `memory.stat` and `inactive_file` of v2's cover the cgroup and
its children, as the usage does.) Every level counts: the process's own cgroup and each parent
up to the root (a SLURM job's limit inside a user's, a container's inside a pod's), under each
hierarchy `/proc/self/cgroup` names (a hybrid layout has both). A level without a limit (`max`,
v1's 2^63 - page size) is skipped.
"""

from __future__ import annotations

import os

UNLIMITED = 2**60  # cgroup v1 writes ~2^63 for "no limit"

# (controller directory under the cgroup root, limit file, usage file, reclaimable stat key)
V1 = ("memory", "memory.limit_in_bytes", "memory.usage_in_bytes", "total_inactive_file")
V2 = ("", "memory.max", "memory.current", "inactive_file")


def _read_int(path: str) -> int | None:
    try:
        with open(path) as f:
            text = f.read().strip()
    except OSError:
        return None
    return int(text) if text.isdigit() else None


def mem_available(meminfo: str = "/proc/meminfo") -> int | None:
    """The host's `MemAvailable` in bytes, None where the file lacks it."""
    try:
        with open(meminfo) as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None


def memory_stat(path: str) -> dict[str, int]:
    """A cgroup's `memory.stat` as `{key: value}` (empty when unreadable)."""
    try:
        with open(path) as f:
            pairs = [line.split() for line in f]
    except OSError:
        return {}
    return {p[0]: int(p[1]) for p in pairs if len(p) == 2 and p[1].isdigit()}


def cgroup_levels(
    proc_cgroup: str = "/proc/self/cgroup", root: str = "/sys/fs/cgroup"
) -> list[tuple[str, tuple[str, str, str, str]]]:
    """`(directory, layout)` of every memory cgroup level this process is in, its own cgroup
    first and then each parent, for each hierarchy `proc_cgroup` names (`layout`: `V1`/`V2`)."""
    try:
        with open(proc_cgroup) as f:
            lines = [line.strip().split(":", 2) for line in f if line.strip()]
    except OSError:
        return []
    levels = []
    for _, controllers, path in (x for x in lines if len(x) == 3):
        if controllers == "":  # v2, or the unified half of a hybrid layout
            unified = os.path.join(root, "unified")
            base, layout = (unified if os.path.isdir(unified) else root), V2
        elif "memory" in controllers.split(","):
            base, layout = os.path.join(root, V1[0]), V1
        else:
            continue
        parts = [p for p in path.split("/") if p]
        for depth in range(len(parts), -1, -1):
            levels.append((os.path.join(base, *parts[:depth]), layout))
    return levels


def cgroup_headroom(
    proc_cgroup: str = "/proc/self/cgroup", root: str = "/sys/fs/cgroup"
) -> int | None:
    """The least `limit - (usage - reclaimable file pages)` over `cgroup_levels` (clamped at
    0); None when no level has a limit."""
    headroom = None
    for directory, (_, limit_file, usage_file, reclaimable) in cgroup_levels(proc_cgroup, root):
        limit = _read_int(os.path.join(directory, limit_file))
        usage = _read_int(os.path.join(directory, usage_file))
        if limit is None or usage is None or limit >= UNLIMITED:
            continue
        inactive = memory_stat(os.path.join(directory, "memory.stat")).get(reclaimable, 0)
        left = max(limit - max(usage - inactive, 0), 0)
        headroom = left if headroom is None else min(headroom, left)
    return headroom


def available(
    meminfo: str = "/proc/meminfo",
    proc_cgroup: str = "/proc/self/cgroup",
    root: str = "/sys/fs/cgroup",
) -> int | None:
    """Bytes the process may still allocate on the host: `mem_available` capped by
    `cgroup_headroom`; None when neither is known."""
    host, headroom = mem_available(meminfo), cgroup_headroom(proc_cgroup, root)
    if headroom is None:
        return host
    return headroom if host is None else min(host, headroom)
