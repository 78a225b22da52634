"""Test-wide settings: the fit check (`continual/fit.py`) compiles each run's step once more;
the tests skip it except where they test it (`tests/test_fit.py` sets AEPG_FIT_CHECK=1)."""

import os

os.environ.setdefault("AEPG_FIT_CHECK", "0")
