"""`prepare` at ImageNet-R's real size (> 1 GiB: TFDS's own shuffler would spill through
TensorFlow), in a child process where TensorFlow cannot be imported: the record count, the
split file and the peak RSS. Slow (minutes, ~7 GiB of disk): run it yourself,
`.venv/bin/python -m pytest -m slow tests/test_prepare_real_size.py`; it uses
`$AEPG_REHEARSAL_ARCHIVES/imagenet-r.tar` (from scripts/make_synthetic_archives.py) if present,
else writes that archive into the test's tmp dir first.
"""

import json
import os
import sys
from pathlib import Path

import pytest
import tensorflow_datasets as tfds
from tensorflow_datasets.core import shuffle

from aepg_jax.prepare import shuffler

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "scripts"))
import bench_prepare
import make_synthetic_archives

PEAK_RSS_LIMIT_GIB = 1.0  # measured 0.42 GiB; independent of the archive size (see shuffler.py)


@pytest.mark.slow
def test_real_size_imagenet_r_prepares_without_tensorflow(tmp_path):
    given = os.environ.get("AEPG_REHEARSAL_ARCHIVES", "")
    archive = os.path.join(given, "imagenet-r.tar")
    if not (given and os.path.exists(archive)):
        archive = make_synthetic_archives.make("imagenet_r", str(tmp_path / "archives"))
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
    source = tfds.builder_from_directory(str(version)).as_data_source(
        split="test", decoders={"image": tfds.decode.SkipDecoding()}
    )
    names = [source[i]["file_name"].decode() for i in range(0, len(source))]
    assert (len(listing["train"]), len(listing["test"])) == (24_000, 6_000)
    assert listing["train"] + listing["test"] == names  # test[:80%] / test[80%:], record order
    assert len(set(names)) == 30_000 and len({n.split("/")[0] for n in names}) == 200
    leftovers = [f for _, dirs, files in os.walk(tmp_path / "data") for f in dirs + files]
    assert not [f for f in leftovers if f.startswith((".shuffle", "run_", ".imagenet_r.prep"))]
