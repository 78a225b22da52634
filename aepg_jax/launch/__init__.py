"""Several processes of `aepg_jax.main` on one machine, as one multi-host run (`launch`).

python -m aepg_jax.launch --help
"""
