"""`python -m aepg_jax.launch`: see `aepg_jax/launch/launch.py`."""

import sys

from aepg_jax.launch import launch

sys.exit(launch.main(sys.argv[1:]))
