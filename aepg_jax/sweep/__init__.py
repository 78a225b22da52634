"""Runs an experiment's runs resumably: `sweep` (the command), `claims` (workers that claim
runs), `preflight` (every run's config validated and costed before the first run),
`overview` (`--status`/`--list`).

    python -m aepg_jax.sweep --help
"""
