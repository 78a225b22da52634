"""Many seeds as one program: per-seed trees stacked on a leading axis, functions vmapped.

With `S = 1` nothing is stacked or vmapped: the trees and functions are exactly those of a
single run, so a one-seed run compiles the same program as before multi-seed support.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np


def stack(trees: Sequence[Any]) -> Any:
    """Stacks equally shaped trees on a new leading (seed) axis."""
    return jax.tree.map(lambda *xs: jnp.stack(xs), *trees)


@dataclasses.dataclass(frozen=True)
class SeedAxis:
    """The seeds of a run and how its trees and functions carry them."""

    seeds: tuple[int, ...]

    @property
    def vmapped(self) -> bool:
        return len(self.seeds) > 1

    def stack(self, trees: Sequence[Any]) -> Any:
        """One tree per seed -> the run's tree (stacked when vmapped, else the only one)."""
        return stack(trees) if self.vmapped else trees[0]

    def unstack(self, tree: Any) -> list[Any]:
        """The run's tree -> one tree per seed."""
        if not self.vmapped:
            return [tree]
        return [jax.tree.map(lambda x, i=i: x[i], tree) for i in range(len(self.seeds))]

    def map(self, fn: Callable[..., Any], *trees: Any) -> Any:
        """`fn(seed_index, *per_seed_trees)` on each seed (host side), restacked."""
        per_seed = zip(*(self.unstack(t) for t in trees), strict=True)
        return self.stack([fn(i, *args) for i, args in enumerate(per_seed)])

    def lift(self, fn: Callable, in_axes: tuple) -> Callable:
        """`fn` of one seed -> `fn` of the run (vmapped over the seed axis when S > 1)."""
        return jax.vmap(fn, in_axes=in_axes) if self.vmapped else fn

    def per_seed(self, x: Any) -> np.ndarray:
        """A host copy of a per-seed scalar (or per-seed vector `(S, k)`): shape (S, ...)."""
        x = np.asarray(jax.device_get(x))
        return x.reshape(len(self.seeds), *x.shape[int(self.vmapped) :])

    def first(self, x: Any) -> int:
        """A counter that is the same for every seed (global or task step)."""
        return int(self.per_seed(x).reshape(-1)[0])
