"""The blocks of the ViT a method puts its modules in: a `method.<field>` list of block indices,
cut at the model's depth where it is a default, refused where it names blocks the model lacks."""

from __future__ import annotations

from collections.abc import Sequence


def cut_blocks(blocks: Sequence[int], depth: int) -> tuple[int, ...]:
    """The blocks below the model's depth (defaults name blocks a tiny ViT may not have)."""
    return tuple(int(b) for b in blocks if int(b) < depth)


def block_problems(
    field: str,
    blocks: Sequence[int],
    depth: int,
    default: Sequence[int] | None = None,
    own: bool = True,
) -> list[str]:
    """Problems with a `method.<field>` block list: ints >= 0, distinct; where the method runs
    (`own`), one below the depth and a list other than the `default` (which is cut at the
    depth) all below it."""
    if not all(isinstance(b, int) and b >= 0 for b in blocks) or len(set(blocks)) != len(blocks):
        return [f"method.{field}={tuple(blocks)} must be distinct block indices >= 0."]
    if not own:
        return []
    if not cut_blocks(blocks, depth):
        return [f"method.{field}={tuple(blocks)} has no block below model.depth={depth}."]
    return out_of_depth_problems(field, blocks, depth, default)


def out_of_depth_problems(
    field: str, blocks: Sequence[int], depth: int, default: Sequence[int] | None
) -> list[str]:
    """An explicit block list naming blocks the model does not have is refused, not cut."""
    beyond = [int(b) for b in blocks if int(b) >= depth]
    if not beyond or (default is not None and tuple(blocks) == tuple(default)):
        return []
    return [
        f"method.{field}={tuple(blocks)} names block(s) {tuple(beyond)} of a model with "
        f"model.depth={depth} blocks; use indices 0..{depth - 1}."
    ]
