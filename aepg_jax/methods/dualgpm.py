"""InfLoRA's subspace memory (DualGPM) and its down-projections, on the host in float64 numpy.

Per block the memory is an orthonormal basis F (D, k) and a mode (docs/algorithm.md §15, InfLoRA's
`methods/inflora.py` `update_DualGPM`; `update_GPM` for `gpm`):
  - 'remove': F spans the input subspace of earlier tasks; a new task's A avoids it;
  - 'retain': F spans its orthogonal complement; a new task's A stays inside it.
The memory is kept zero-padded to (D, D) with its column count, so its shape never changes.

With `cov` a block's input covariance `mean_tokens x x^T` (D, D) and S its singular values:
  new A_t         U[:, :r]^T / sqrt(3),  U from svd(cov - F F^T cov) ('remove', or at t = 0
                  with F empty) or svd(F F^T cov) ('retain')
  threshold       th_t = (lame - lamb) t / T + lamb          (t 0-based, T tasks)
  first update    keep r' = #{i : cumsum(S^2)_i / sum(S^2) < th} leading directions (>= 1)
  'remove'        add directions of svd(cov - F F^T cov) while the captured energy is < th
  'retain'        drop directions of svd(F F^T cov) from F while the rest is >= 1 - th
  dualgpm         a 'remove' basis wider than D / 2 becomes its complement, 'retain'

A first task that needs r >= D / 2 directions: the reference stores those r directions
themselves as a 'retain' basis, so its own check fails (AssertionError) for r > D / 2, and at
r = D / 2 the protected directions become the allowed ones; here the first memory is 'remove'
and, like any wider than D / 2, switches to its complement
(`test_a_wide_remove_basis_becomes_its_retained_complement`).
"""

from __future__ import annotations

import dataclasses

import numpy as np

MODES = ("dualgpm", "gpm")  # gpm: always 'remove' (InfLoRA-b5's code), no switch to 'retain'


@dataclasses.dataclass(frozen=True)
class Memory:
    """One block's memory: `basis` (D, k) orthonormal columns, `retain` its mode."""

    basis: np.ndarray
    retain: bool = False

    @classmethod
    def empty(cls, width: int) -> Memory:
        return cls(np.zeros((width, 0)), False)

    @classmethod
    def from_padded(cls, padded: np.ndarray, dim: int, retain: bool) -> Memory:
        """From the (D, D) zero-padded basis and its column count."""
        return cls(np.asarray(padded, np.float64)[:, :dim], bool(retain))

    def padded(self) -> np.ndarray:
        """The basis zero-padded to (D, D)."""
        width, dim = self.basis.shape
        return np.pad(self.basis, ((0, 0), (0, width - dim)))

    def projector(self) -> np.ndarray:
        return self.basis @ self.basis.T


def threshold(lamb: float, lame: float, task: int, num_tasks: int) -> float:
    """`th_t = (lame - lamb) t / T + lamb`, t 0-based."""
    return (lame - lamb) * task / num_tasks + lamb


def down_projection(cov: np.ndarray, memory: Memory, rank: int) -> np.ndarray:
    """A_t (rank, D): the leading left singular vectors of the covariance projected against
    the memory, scaled by 1/sqrt(3) (the reference's scale)."""
    cov = np.asarray(cov, np.float64)
    p = memory.projector()
    projected = p @ cov if memory.retain else cov - p @ cov
    u = np.linalg.svd(projected)[0]
    return u[:, :rank].T / np.sqrt(3.0)


def _energy(cov: np.ndarray) -> float:
    return float(np.sum(np.linalg.svd(cov, compute_uv=False) ** 2))


def _first(cov: np.ndarray, th: float) -> Memory:
    u, s, _ = np.linalg.svd(cov)
    ratio = s**2 / np.sum(s**2)
    kept = int(np.sum(np.cumsum(ratio) < th))
    return Memory(u[:, : max(kept, 1)], False)


def _grow_removed(cov: np.ndarray, memory: Memory, th: float) -> Memory:
    """'remove': append the new directions needed for the captured energy to reach th."""
    total = _energy(cov)
    u, s, _ = np.linalg.svd(cov - memory.projector() @ cov)
    ratio = s**2 / total
    captured = (total - np.sum(s**2)) / total
    added = 0
    for r in ratio:  # the reference's loop, kept as is: the order of additions matters
        if captured >= th:
            break
        captured += r
        added += 1
    basis = np.hstack([memory.basis, u[:, :added]])[:, : cov.shape[0]]
    return Memory(basis, False)


def _shrink_retained(cov: np.ndarray, memory: Memory, th: float) -> Memory:
    """'retain': drop from the complement the directions that still carry energy >= 1 - th."""
    total = _energy(cov)
    u, s, _ = np.linalg.svd(memory.projector() @ cov)
    ratio = s**2 / total
    left = np.sum(s**2) / total
    dropped = 0
    for r in ratio:
        if left < 1.0 - th:
            break
        left -= r
        dropped += 1
    if dropped == 0:
        return memory
    ud = u[:, :dropped]
    rest = np.linalg.svd(memory.basis - ud @ (ud.T @ memory.basis))[0]
    return Memory(rest[:, : memory.basis.shape[1] - dropped], True)


def update(cov: np.ndarray, memory: Memory, th: float, mode: str) -> Memory:
    """The memory after a task whose (trained-model) input covariance is `cov`."""
    cov = np.asarray(cov, np.float64)
    width = cov.shape[0]
    if memory.basis.shape[1] == 0 and not memory.retain:
        memory = _first(cov, th)
    elif memory.retain:
        memory = _shrink_retained(cov, memory, th)
    else:
        memory = _grow_removed(cov, memory, th)
    if mode == "dualgpm" and not memory.retain and memory.basis.shape[1] > width / 2:
        # Keep the smaller of the two: the complement of a wide protected subspace.
        u = np.linalg.svd(memory.basis)[0]
        memory = Memory(u[:, memory.basis.shape[1] :], True)
    return memory
