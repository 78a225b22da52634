"""`python -m aepg_jax.tables`: see `aepg_jax/tables/tables.py`."""

import sys

from aepg_jax.tables import tables

sys.exit(tables.main(sys.argv[1:]))
