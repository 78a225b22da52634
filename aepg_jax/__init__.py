"""aepg_jax: continual fine-tuning with adaptive entropy annealing (aEPG) in JAX/Flax.

The package's layout is docs/architecture.md. Config and experiment files written for the flat
layout before it (`from aepg_jax import config_lib`) are refused with the module that holds the
name now (`aepg_jax.config.command_line.OLD_NAMES`) and the last version that reads them.
"""

__version__ = "0.1.0"
