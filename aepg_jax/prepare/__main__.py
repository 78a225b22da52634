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

The TFDS datasets are written as TFDS `array_record` in `DIR/NAME/<version>/`, the records
those of `tfds build NAME --file_format=array_record` in the same order (see builders.py);
pass `--config.data.data_dir=DIR`. ImageNet-R also gets `DIR/imagenet_r/0.2.0/l2p_split.json`
(L2P's train/test lists) for `data.source=folder` + `data.split_file`. CLRS25 goes to
`DIR/clrs25` (pass that as `data.data_dir`).

Each archive's size and sha256 are checked first (TFDS's values; Keras's for CIFAR's python
tarballs); `--checksums=TSV` (lines `filename size sha256`) replaces them. Errors are one
`error:` line, exit status 2. A killed run leaves nothing a run reads; run it again.
"""

from __future__ import annotations

import argparse
import contextlib
import fcntl
import os
import sys

from aepg_jax.prepare import archives, builders, folder_build, tfds_build
from aepg_jax.system import cli

NAMES = (*builders.BUILDERS, *folder_build.NUM_CLASSES)


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
        help="a downloaded archive (repeat for CUB's two files), or CLRS25's folder",
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
            if args.name in folder_build.NUM_CLASSES:
                (source,) = sources
                where = folder_build.prepare(args.name, source, data_dir, force=args.force)
                print(f"{args.name}: ready in {where}; run with --config.data.data_dir={where}")
                return 0
            where = tfds_build.prepare(
                args.name, sources, data_dir, checksums=args.checksums, force=args.force
            )
    except (archives.ArchiveError, OSError, ValueError) as err:
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
