"""`prepare` at ImageNet-R's real size (> 1 GiB: TFDS's own shuffler would spill through
TensorFlow), in a child process where TensorFlow cannot be imported: the record count, the
split file and the peak RSS; with `AEPG_TF_PYTHON` (the python of a separate venv with
`tensorflow-cpu tensorflow-datasets array_record importlib_resources`), also that the records
and their order equal `tfds build`'s of the same archive. Slow (minutes, ~7 GiB of disk; the
TFDS comparison ~15 GiB): run it yourself,
`.venv/bin/python -m pytest -m slow tests/test_prepare_real_size.py`; it uses
`$AEPG_REHEARSAL_ARCHIVES/imagenet-r.tar` (from benchmarks/make_synthetic_archives.py) if present,
else writes that archive into the test's tmp dir first.
"""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import tensorflow_datasets as tfds
from tensorflow_datasets.core import shuffle

from aepg_jax.prepare import shuffler

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
import bench_prepare
import make_synthetic_archives

ROOT = Path(__file__).resolve().parents[1]
TF_PYTHON = os.environ.get("AEPG_TF_PYTHON")
PEAK_RSS_LIMIT_GIB = 1.0  # measured 0.42 GiB; independent of the archive size (see shuffler.py)


def _archive(tmp_path) -> str:
    given = os.environ.get("AEPG_REHEARSAL_ARCHIVES", "")
    archive = os.path.join(given, "imagenet-r.tar")
    if not (given and os.path.exists(archive)):
        archive = make_synthetic_archives.make("imagenet_r", str(tmp_path / "archives"))
    return archive


def _source(version_dir):
    return tfds.builder_from_directory(str(version_dir)).as_data_source(
        split="test", decoders={"image": tfds.decode.SkipDecoding()}
    )


@pytest.mark.slow
def test_real_size_imagenet_r_prepares_without_tensorflow(tmp_path):
    archive = _archive(tmp_path)
    size = os.path.getsize(archive)
    assert size > shuffle.MAX_MEM_BUFFER_SIZE and size > 4 * shuffler.MEM_LIMIT

    result = bench_prepare.run_prepare("imagenet_r", archive, str(tmp_path / "data"))
    print(json.dumps(result))
    assert result["exit"] == 0
    assert result["records"] == {"test": 30_000}
    assert result["peak_rss_gib"] < PEAK_RSS_LIMIT_GIB

    version = tmp_path / "data" / "imagenet_r" / "0.2.0"
    with open(version / "l2p_split.json") as f:
        listing = json.load(f)
    source = _source(version)
    names = [source[i]["file_name"].decode() for i in range(0, len(source))]
    assert (len(listing["train"]), len(listing["test"])) == (24_000, 6_000)
    assert listing["train"] + listing["test"] == names  # test[:80%] / test[80%:], record order
    assert len(set(names)) == 30_000 and len({n.split("/")[0] for n in names}) == 200
    leftovers = [f for _, dirs, files in os.walk(tmp_path / "data") for f in dirs + files]
    assert not [f for f in leftovers if f.startswith((".shuffle", "run_", ".imagenet_r.prep"))]


@pytest.mark.slow
@pytest.mark.skipif(not TF_PYTHON, reason="AEPG_TF_PYTHON (a venv with TensorFlow) not set")
def test_real_size_record_order_equals_tfds_build(tmp_path):
    archive = _archive(tmp_path)
    assert os.path.getsize(archive) > shuffle.MAX_MEM_BUFFER_SIZE  # TFDS spills to buckets
    reference = [TF_PYTHON, str(ROOT / "tests" / "tfds_reference_build.py")]
    subprocess.run([*reference, "imagenet_r", str(tmp_path / "tfds"), archive], check=True)
    result = bench_prepare.run_prepare("imagenet_r", archive, str(tmp_path / "ours"))
    assert result["exit"] == 0
    ours = _source(tmp_path / "ours" / "imagenet_r" / "0.2.0")
    theirs = _source(tmp_path / "tfds" / "imagenet_r" / "0.2.0")
    assert len(ours) == len(theirs) == 30_000
    for i in range(len(theirs)):
        a, b = ours[i], theirs[i]
        assert a.keys() == b.keys()
        for key in a:  # file name, label and JPEG bytes, record by record
            assert a[key] == b[key], f"record {i}: {key}"
