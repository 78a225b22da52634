"""Builds a dataset with TFDS's own, unmodified builder from a local archive (needs TensorFlow).

    TFVENV/bin/python tests/tfds_reference_build.py NAME DATA_DIR ARCHIVE [ARCHIVE ...]

The reference for `aepg_jax.prepare` (tests/test_prepare_slow.py,
tests/test_prepare_real_size.py): TFDS's download manager takes each archive from a manual dir
(its official file name), with the archive's own size and sha256 registered in place of the
official ones (test archives are not the official files), then
`download_and_prepare(file_format=array_record)` runs TFDS's code path untouched. Run it in a
separate venv with `tensorflow-cpu tensorflow-datasets array_record importlib_resources`
(and `opencv-python-headless` for caltech_birds2011), never in the project's venv.
"""

from __future__ import annotations

import os
import shutil
import sys
import tempfile


def main(argv: list[str]) -> int:
    name, data_dir, *paths = argv
    import tensorflow_datasets as tfds
    from tensorflow_datasets.core.download import checksums

    cls = tfds.builder_cls(name)
    urls = {}  # file name -> every URL TFDS knows for it (CUB lists two per file)
    for url, info in cls.url_infos.items():
        urls.setdefault(info.filename, []).append(url)
    manual = tempfile.mkdtemp()
    infos = {}
    for path in paths:
        filename = os.path.basename(path)
        shutil.copyfile(path, os.path.join(manual, filename))
        info = checksums.compute_url_info(path)
        for url in urls[filename]:
            infos[url] = checksums.UrlInfo(info.size, info.checksum, filename)
    cls.url_infos = infos  # the test archive's own digests, not the official files'
    builder = tfds.builder(name, data_dir=data_dir, file_format="array_record")
    builder.download_and_prepare(
        download_dir=os.path.join(manual, "dl"),
        download_config=tfds.download.DownloadConfig(manual_dir=manual),
    )
    print(builder.data_path)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
