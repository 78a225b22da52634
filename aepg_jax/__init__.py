"""aepg_jax: continual fine-tuning with adaptive entropy annealing (aEPG) in JAX/Flax."""

__version__ = "0.1.0"
