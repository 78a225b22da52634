"""Plain fine-tuning (docs/algorithm.md §7): one set of PEFT modules and the growing head,
trained with the configured loss; nothing else. All of its behaviour is `Method`'s default.

Domain-incremental (`data.scenario=domain`, docs/algorithm.md §17): runs, with one head over
every class trained in every task."""

from __future__ import annotations

from aepg_jax.methods.base import Method


class Plain(Method):
    """Plain fine-tuning of the PEFT modules and heads."""

    name = "plain"
