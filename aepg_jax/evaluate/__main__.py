"""`python -m aepg_jax.evaluate`: see `aepg_jax/evaluate/evaluate.py`."""

import sys

from aepg_jax.evaluate import evaluate

sys.exit(evaluate.main(sys.argv[1:]))
