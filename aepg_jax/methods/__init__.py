"""Continual methods, one module each, behind the `Method` interface of `base.py`.

The task loop, the train and eval steps, checkpointing, multi-seed vmapping and the reports
know no method by name: they call the hooks of `get(cfg.method.name)(cfg)` (see `base.py` for
the interface and when each hook runs). Plain's behaviour is `Method`'s defaults.

How to add a method: docs/methods.md "How to add a method" (its module, built from the shared
pieces of `base.py` and `models/head.py`, and its line in `REGISTRY` below).
"""

from __future__ import annotations

from typing import Any

from aepg_jax.methods.aper import Aper
from aepg_jax.methods.base import OFFICIAL_HEAD_INIT, Method, Network, TaskContext, TaskSpec
from aepg_jax.methods.coda_prompt import CodaPrompt
from aepg_jax.methods.dualprompt import DualPrompt
from aepg_jax.methods.ease import Ease
from aepg_jax.methods.hide_prompt import HiDePrompt
from aepg_jax.methods.inflora import InfLoRA
from aepg_jax.methods.l2p import L2P
from aepg_jax.methods.lae import LAE
from aepg_jax.methods.lwf import LwF
from aepg_jax.methods.plain import Plain
from aepg_jax.methods.ranpac import RanPAC
from aepg_jax.methods.sd_lora import SDLoRA
from aepg_jax.methods.simplecil import SimpleCIL
from aepg_jax.methods.slca import SLCA

_ORDER: tuple[type[Method], ...] = (
    Plain, LAE, LwF, L2P, DualPrompt, CodaPrompt, InfLoRA, SimpleCIL, Aper, Ease, RanPAC, SDLoRA,
    SLCA, HiDePrompt,
)  # fmt: skip
REGISTRY: dict[str, type[Method]] = {m.name: m for m in _ORDER}
NAMES = tuple(REGISTRY)

__all__ = [
    "NAMES",
    "OFFICIAL_HEAD_INIT",
    "REGISTRY",
    "Method",
    "Network",
    "TaskContext",
    "TaskSpec",
    "defaults",
    "get",
]


def get(name: str) -> type[Method]:
    """The method class registered under `name`."""
    if name not in REGISTRY:
        raise ValueError(f"method.name={name!r} is unknown; use one of {', '.join(REGISTRY)}.")
    return REGISTRY[name]


def defaults() -> dict[str, Any]:
    """Every method's `method.*` config fields with their defaults."""
    out: dict[str, Any] = {}
    for method in REGISTRY.values():
        out.update(method.defaults)
    return out
