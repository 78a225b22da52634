"""aepg_jax: continual fine-tuning with adaptive entropy annealing (aEPG) in JAX/Flax.

The package's layout is docs/architecture.md. The flat module names
(`from aepg_jax import config_lib, config_args`) resolve to the modules that hold them (`MOVED`),
so config and experiment files that import them load.
"""

import importlib

__version__ = "0.1.0"

# flat module name -> the module that holds it
MOVED = {
    "config_lib": "aepg_jax.config.schema",
    "config_args": "aepg_jax.config.arguments",
    "config_checks": "aepg_jax.config.validation",
    "input_files": "aepg_jax.config.input_files",
    "paper": "aepg_jax.experiments.paper",
    "sweep_layout": "aepg_jax.experiments.layout",
    "sweep_claims": "aepg_jax.sweep.claims",
    "sweep_configs": "aepg_jax.sweep.preflight",
    "sweep_status": "aepg_jax.sweep.overview",
    "table_plots": "aepg_jax.tables.plots",
    "hosts": "aepg_jax.system.hosts",
    "cli": "aepg_jax.system.cli",
    "compiles": "aepg_jax.system.compiles",
    "environment": "aepg_jax.system.environment",
    "memory": "aepg_jax.system.memory",
    "progress": "aepg_jax.system.progress",
    "partition": "aepg_jax.models.partition",
    "pretrain": "aepg_jax.models.pretrain",
}


def __getattr__(name: str):
    """`from aepg_jax import config_lib` (the flat layout's names) -> the moved module."""
    if name in MOVED:
        return importlib.import_module(MOVED[name])
    raise AttributeError(f"module 'aepg_jax' has no attribute {name!r}")
