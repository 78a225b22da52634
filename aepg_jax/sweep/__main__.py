"""`python -m aepg_jax.sweep`: see `aepg_jax/sweep/sweep.py`."""

import sys

from aepg_jax.sweep import sweep

sys.exit(sweep.main(sys.argv[1:]))
