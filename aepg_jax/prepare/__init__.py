"""Offline preparation of the paper's datasets from the archives a user downloads.

    python -m aepg_jax.prepare NAME --source=PATH [--source=PATH2] --data_dir=DIR

See `__main__.py` for the command, `archives.py` for the checks, `builders.py` for how each
archive becomes TFDS `array_record` data without TensorFlow or network (`domainnet.py`:
DomainNet's six zips and twelve lists).
"""
