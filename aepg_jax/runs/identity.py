"""A run's identity: the config fields that change its result.

Every field of a run's config is part of its identity except those of `NOT_IDENTITY`: where
its inputs and caches are, how often it logs and checkpoints, how its processes start. Two
configs that differ only there give the same results (a moved dataset directory resumes its
run); any other difference is another run. `aepg_jax.main` refuses to resume a run with a
config of another identity, `aepg_jax.sweep` gives such a config a workdir of its own and
`aepg_jax.tables` leaves out results of another identity than the experiment's.
"""

from __future__ import annotations

import json
from typing import Any

# Config fields that do not change a run's result: where its inputs and caches are, how often it
# logs and checkpoints, how its processes start. Every other field is part of a run's identity.
NOT_IDENTITY = frozenset({
    "data.data_dir", "data.cache_dir", "data.verify_cache", "model.checkpoint",
    "pretrain.data_dir", "pretrain.cache_dir", "log_every_steps", "checkpoint_every_steps",
    "checkpoint_every_minutes", "checkpoint_every_epochs", "tensorboard", "distributed",
})  # fmt: skip

# Fields added after runs were recorded: a recorded config without one ran with this value.
ADDED_DEFAULTS = {"data.scenario": "class", "data.class_order_rng": "default"}


def flatten(config: dict, prefix: str = "") -> dict[str, Any]:
    """`{"a": {"b": 1}}` -> `{"a.b": 1}`."""
    out: dict[str, Any] = {}
    for k, v in config.items():
        if isinstance(v, dict):
            out |= flatten(v, f"{prefix}{k}.")
        else:
            out[f"{prefix}{k}"] = v
    return out


def differences(a: dict, b: dict) -> list[str]:
    """The fields (dotted) in which the configs `a` and `b` (JSON dicts) give different
    results: every field but `NOT_IDENTITY`'s, sorted."""
    fa, fb = ADDED_DEFAULTS | flatten(a), ADDED_DEFAULTS | flatten(b)
    return sorted(
        k for k in fa.keys() | fb.keys() if k not in NOT_IDENTITY and fa.get(k) != fb.get(k)
    )


def value_text(value: Any) -> str:
    """A config value as a run name shows it: text as is, anything else as compact JSON."""
    return value if isinstance(value, str) else json.dumps(value, separators=(",", ":"))
