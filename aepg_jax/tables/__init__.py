"""An experiment's tables (`tables`) and plots (`plots`) from a sweep's results.

python -m aepg_jax.tables --help
"""
