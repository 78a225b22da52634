"""aepg_jax: continual fine-tuning with adaptive entropy annealing (aEPG) in JAX/Flax.

The package's layout is docs/architecture.md.
"""

__version__ = "0.1.0"
