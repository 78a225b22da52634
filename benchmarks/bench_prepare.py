"""Wall time, peak RSS and disk of `python -m aepg_jax.prepare` on real-size archives.

    python benchmarks/bench_prepare.py --archives=rehearsal/archives --data_dir=D [NAME ...]

For each NAME (default: every dataset whose archive is in --archives, e.g. from
make_synthetic_archives.py) runs the preparation in a child process in which TensorFlow cannot
be imported (as in the project's venv) and prints one JSON line: wall seconds, the child's peak
RSS (`wait4`), the peak disk of `D` during the run (sampled every second: staging, shuffle runs
and shards together), the prepared dataset's size and record count; then a Markdown table row.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import threading
import time

# name -> its download(s) (`--source` each; `<first>.checksums.tsv` lists them all); those of
# the image folders (CLRS25, PILOT's four) are the unpacked folder.
ARCHIVES = {
    "imagenet_r": ("imagenet-r.tar",),
    "food101": ("food-101.tar.gz",),
    "caltech_birds2011": ("CUB_200_2011.tgz", "segmentations.tgz"),
    "cifar10": ("cifar-10-python.tar.gz",),
    "cifar100": ("cifar-100-python.tar.gz",),
    "clrs25": ("CLRS",),
    "imagenet_a": ("imagenet-a",),
    "objectnet": ("objectnet",),
    "omnibenchmark": ("omnibenchmark",),
    "vtab": ("vtab-cil",),
    "domainnet": ("domainnet",),  # the folder of its six zips and twelve lists
}
# Run in the child: tensorflow is not importable, then `python -m aepg_jax.prepare ARGS`.
CHILD = f"""
import runpy, sys
sys.path.insert(0, {os.path.dirname(os.path.abspath(__file__))!r})
import no_tensorflow
sys.meta_path[:] = no_tensorflow.hidden_meta_path()
sys.argv = ["aepg_jax.prepare", *sys.argv[1:]]
runpy.run_module("aepg_jax.prepare", run_name="__main__")
"""


def du(path: str) -> int:
    """Bytes of the files under `path` (0 if absent; files vanishing meanwhile are skipped)."""
    total = 0
    for root, _, files in os.walk(path):
        for f in files:
            try:
                total += os.lstat(os.path.join(root, f)).st_size
            except OSError:
                pass
    return total


def run_prepare(name: str, archive: str | list[str], data_dir: str, *, force: bool = True) -> dict:
    """Prepares `name` from `archive` (a path, or CUB's two; `<first>.checksums.tsv` beside
    it) into `data_dir` in a TensorFlow-free child; returns the measurements."""
    sources = [archive] if isinstance(archive, str) else list(archive)
    args = [name, *(f"--source={s}" for s in sources), f"--data_dir={data_dir}"]
    if os.path.exists(f"{sources[0]}.checksums.tsv"):
        args.append(f"--checksums={sources[0]}.checksums.tsv")
    if force:
        args.append("--force")
    os.makedirs(data_dir, exist_ok=True)
    peak_disk, done = [du(data_dir)], threading.Event()
    base = peak_disk[0]

    def sample() -> None:
        while not done.wait(1.0):
            peak_disk[0] = max(peak_disk[0], du(data_dir))

    sampler = threading.Thread(target=sample, daemon=True)
    start = time.time()
    child = subprocess.Popen([sys.executable, "-c", CHILD, *args])
    sampler.start()
    _, status, usage = os.wait4(child.pid, 0)
    wall = time.time() - start
    done.set()
    sampler.join()
    child.returncode = os.waitstatus_to_exitcode(status)
    prepared = os.path.join(data_dir, name)
    return {
        "dataset": name,
        "archive_gib": sum(du(s) if os.path.isdir(s) else os.path.getsize(s) for s in sources)
        / 2**30,
        "exit": child.returncode,
        "wall_s": wall,
        "peak_rss_gib": usage.ru_maxrss * 1024 / 2**30,
        "peak_disk_gib": (max(peak_disk[0], du(data_dir)) - base) / 2**30,
        "prepared_gib": du(prepared) / 2**30,
        "records": _count(prepared) if child.returncode == 0 else None,
    }


def _count(prepared: str) -> dict[str, int]:
    """Records per split (TFDS's dataset_info.json; `<config>/<split>` for a dataset of
    configs, DomainNet's domains), or images of an image folder (CLRS25; per split for PILOT's
    `train/` and `test/`)."""
    entries = sorted(v for v in os.listdir(prepared) if not v.startswith("."))
    if entries == ["test", "train"]:
        return {s: _count(os.path.join(prepared, s))["images"] for s in ("train", "test")}
    first = os.path.join(prepared, entries[0])
    configs = [os.path.join(first, v) for v in os.listdir(first)]
    if all(os.path.exists(os.path.join(c, "dataset_info.json")) for c in configs):
        return {
            f"{config}/{split}": n
            for config in entries
            for split, n in _count(os.path.join(prepared, config)).items()
        }
    if not os.path.exists(os.path.join(first, "dataset_info.json")):
        return {"images": sum(len(os.listdir(os.path.join(prepared, c))) for c in entries)}
    (version,) = entries
    with open(os.path.join(prepared, version, "dataset_info.json")) as f:
        info = json.load(f)
    return {s["name"]: sum(int(n) for n in s["shardLengths"]) for s in info["splits"]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("names", nargs="*", help=f"of {sorted(ARCHIVES)} (default: all found)")
    parser.add_argument("--archives", required=True)
    parser.add_argument("--data_dir", required=True)
    args = parser.parse_args()
    names = args.names or [
        n for n, a in ARCHIVES.items() if os.path.exists(f"{args.archives}/{a[0]}")
    ]
    unknown = sorted(set(names) - set(ARCHIVES))
    if unknown:
        sys.exit(f"error: unknown dataset(s) {unknown}: choose from {sorted(ARCHIVES)}")
    rows = []
    for name in names:
        sources = [os.path.join(args.archives, a) for a in ARCHIVES[name]]
        result = run_prepare(name, sources, args.data_dir)
        print(json.dumps(result), flush=True)
        rows.append(result)
    print("| dataset | archive | records | wall | peak RSS | peak disk (data_dir) | prepared |")
    print("|---|---|---|---|---|---|---|")
    for r in rows:
        print(
            f"| {r['dataset']} | {r['archive_gib']:.2f} GiB | {r['records']} | "
            f"{r['wall_s'] / 60:.1f} min | {r['peak_rss_gib']:.2f} GiB | "
            f"{r['peak_disk_gib']:.2f} GiB | {r['prepared_gib']:.2f} GiB |"
        )


if __name__ == "__main__":
    main()
