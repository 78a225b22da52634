"""Metrics recomputed from a run's kept predictions (`python -m aepg_jax.evaluate`)."""
