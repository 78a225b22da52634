"""Prepares a paper dataset from the official archive(s) you downloaded; offline, no TensorFlow.

    python -m aepg_jax.prepare NAME --source=PATH [--source=PATH ...] --data_dir=DIR

| NAME              | --source: the file(s) to download                                  |
|-------------------|--------------------------------------------------------------------|
| imagenet_r        | https://people.eecs.berkeley.edu/~hendrycks/imagenet-r.tar         |
| food101           | http://data.vision.ee.ethz.ch/cvl/food-101.tar.gz                  |
| caltech_birds2011 | CUB_200_2011.tgz: https://data.caltech.edu/records/65de6-vp158     |
|                   | segmentations.tgz: https://data.caltech.edu/records/w9d68-gec53    |
| cifar10           | https://www.cs.toronto.edu/~kriz/cifar-10-python.tar.gz (or -binary) |
| cifar100          | https://www.cs.toronto.edu/~kriz/cifar-100-python.tar.gz (or -binary) |
| clrs25            | the unpacked CLRS folder (ROOT/<class>/*)                          |
| imagenet_a        | PILOT's ina.zip unpacked: ROOT/{train,test}/<class>/*              |
| objectnet         | PILOT's objnet.tgz unpacked: ROOT/{train,test}/<class>/*           |
| omnibenchmark     | PILOT's omnibenchmark.zip unpacked: ROOT/{train,test}/<class>/*    |
| vtab              | PILOT's vtab.zip unpacked: vtab-cil/vtab/{train,test}/<class>/*    |
| domainnet         | the folder holding the six <domain>.zip and twelve                 |
|                   | <domain>_{train,test}.txt of the cleaned release:                  |
|                   | http://ai.bu.edu/M3SDA/ (domains: clipart infograph painting       |
|                   | quickdraw real sketch)                                             |

The TFDS datasets are written as TFDS `array_record` in `DIR/NAME/<version>/`, the records
those of `tfds build NAME --file_format=array_record` in the same order (see builders.py);
pass `--config.data.data_dir=DIR`. ImageNet-R also gets `DIR/imagenet_r/0.2.0/l2p_split.json`
(L2P's train/test lists) for `data.source=folder` + `data.split_file`. The image folders
(CLRS25, PILOT's four) go to `DIR/<name>` (pass that as `data.data_dir` with
`data.source=folder`; docs/data.md links PILOT's downloads). DomainNet is written as the six
TFDS configs `DIR/domainnet/<domain>/1.0.0/` that `tfds build domainnet
--file_format=array_record` writes.

Each archive's size and sha256 are checked first (TFDS's values; Keras's for CIFAR's python
tarballs; none are published for DomainNet's 18 files); `--checksums=TSV` (lines `filename
size sha256`) replaces them. Errors are one
`error:` line, exit status 2. A killed run leaves nothing a run reads; run it again.
"""

from __future__ import annotations

import argparse
import contextlib
import errno
import fcntl
import os
import shutil
import sys

from aepg_jax.prepare import archives, builders, domainnet, folder_build, tfds_build
from aepg_jax.system import cli

NAMES = (*builders.BUILDERS, *folder_build.NUM_CLASSES, domainnet.NAME)


@contextlib.contextmanager
def _alone(data_dir: str, name: str):
    """Holds `DIR/.<name>.lock` (flock): two preparations of one dataset never share a
    staging dir. The kernel releases it when the process dies."""
    with open(os.path.join(data_dir, f".{name}.lock"), "w") as lock:
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise archives.ArchiveError(
                f"another preparation of {name} is writing into {data_dir}; wait for it to end."
            ) from None
        yield


STAGING_SUFFIX = ".preparing"


def _size(path: str) -> int:
    total = 0
    for root, _, files in os.walk(path):
        for f in files:
            with contextlib.suppress(OSError):
                total += os.lstat(os.path.join(root, f)).st_size
    return total


def clean_leftovers(data_dir: str, own: str) -> None:
    """Removes the staging dirs (`.<name>.preparing/`) that killed preparations left in
    `data_dir`, each with one line; one whose dataset is being prepared now (its `.<name>.lock`
    held by another process) is left alone. `own`: the dataset this process prepares (its lock
    held here)."""
    for entry in sorted(os.listdir(data_dir)):
        if not (entry.startswith(".") and entry.endswith(STAGING_SUFFIX)):
            continue
        name = entry[1 : -len(STAGING_SUFFIX)]
        path = os.path.join(data_dir, entry)
        with contextlib.ExitStack() as stack:
            if name != own:
                lock = stack.enter_context(open(os.path.join(data_dir, f".{name}.lock"), "w"))
                try:
                    fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
                except BlockingIOError:
                    continue  # being prepared right now
            size = _size(path)
            shutil.rmtree(path, ignore_errors=True)
            print(f"removed {path} ({size / 2**20:.0f} MiB), left by a preparation of {name} "
                  "that was stopped before it ended.", flush=True)  # fmt: skip


def _out_of_space(err: BaseException) -> bool:
    return (isinstance(err, OSError) and err.errno == errno.ENOSPC) or (
        "No space left on device" in str(err)
    )


def space_message(name: str, data_dir: str, sources: list[str]) -> str:
    """One line: the disk under `data_dir` filled while `name` was written."""
    need = 2 * sum(os.path.getsize(s) if os.path.isfile(s) else _size(s) for s in sources)
    free = shutil.disk_usage(data_dir).free
    return (
        f"the disk under {data_dir} filled while {name} was written: it needs about "
        f"{need / 2**30:.1f} GiB free there (twice its archives), {free / 2**30:.1f} GiB are; "
        "free space (or pass another --data_dir) and run the same command again."
    )


class _Parser(argparse.ArgumentParser):
    def error(self, message: str):  # one `error:` line, not argparse's usage block
        cli.fail(f"{message} (python -m aepg_jax.prepare --help lists the datasets and flags)")


def main(argv: list[str] | None = None) -> int:
    parser = _Parser(
        prog="python -m aepg_jax.prepare",
        description=__doc__.splitlines()[0],
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="\n".join(__doc__.splitlines()[3:]),
    )
    parser.add_argument("name", choices=NAMES, help="the dataset")
    parser.add_argument(
        "--source",
        action="append",
        required=True,
        help="a downloaded archive (repeat for CUB's two files), an image folder (CLRS25, "
        "PILOT's), or the folder of DomainNet's 18 files",
    )
    parser.add_argument("--data_dir", required=True, help="where the prepared dataset goes")
    parser.add_argument("--checksums", help="TSV of `filename size sha256` replacing ours")
    parser.add_argument("--force", action="store_true", help="rebuild a prepared dataset")
    args = parser.parse_args(argv)
    data_dir = os.path.abspath(os.path.expanduser(args.data_dir))
    sources = [os.path.abspath(os.path.expanduser(s)) for s in args.source]
    try:
        os.makedirs(data_dir, exist_ok=True)
        with _alone(data_dir, args.name):
            clean_leftovers(data_dir, args.name)
            if args.name in folder_build.NUM_CLASSES:
                (source,) = sources
                where = folder_build.prepare(args.name, source, data_dir, force=args.force)
                print(
                    f"{args.name}: ready in {where}; run with --config.data.data_dir={where} or "
                    f"{data_dir} (the data root, shared with the datasets prepared beside it)"
                )
                return 0
            if args.name == domainnet.NAME:
                where = domainnet.prepare(
                    sources, data_dir, checksums=args.checksums, force=args.force
                )
            else:
                where = tfds_build.prepare(
                    args.name, sources, data_dir, checksums=args.checksums, force=args.force
                )
    except Exception as err:
        if _out_of_space(err):
            cli.fail(space_message(args.name, data_dir, sources))
        if not isinstance(err, archives.ArchiveError | OSError | ValueError):
            raise
        cli.fail(str(err))
    except KeyboardInterrupt:
        print(
            f"\ninterrupted: nothing of {args.name} was written where a run reads; run the same "
            "command to start again",
            file=sys.stderr,
        )
        return 130
    print(f"{args.name}: ready in {where}; run with --config.data.data_dir={data_dir}")
    if args.name == "imagenet_r":
        print(
            f"image-folder users: --config.data.split_file={where}/{tfds_build.SPLIT_FILE} "
            "gives the same train/test split"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
