"""Run folder names: what a person finds a run by, within the file system's limits.

A run's folder is `<config stem>/<leaf>` below the sweep's directory, two path levels whatever
the values, each at most `MAX_BYTES` bytes:

    <leaf> = <arguments>[+<field>=<value>...][,seeds=A-B][+<field>=<value>...]
              the run's    the grid's overrides  vmapped   the sweep's overrides that change
              arguments    (reference settings)  seeds     its result (`layout.Unit.changed`)

(`defaults` when there is nothing to show). Text that could change the path or be read as this
syntax is escaped as %XX: `%`, `/`, `\\`, NUL and the other control characters, a whole `.` or
`..`, and in every field and value `+`, `=` and `,` (a value `1+b=2` is `1%2Bb%3D2`, never a
second pair). A leaf longer than `MAX_BYTES` shows the grid's overrides as one
`+overrides-<digest>` (the field's experiments carry 10-16 reference settings per run); still
too long, the sweep's overrides join the digest; arguments longer still are cut and digested
too. `<digest>` is the first `DIGEST_HEX` hex digits
of the sha256 of the digested pairs as JSON (`digest`); the pairs themselves are in the run's
config.json (as the config's values) and under `digests` in the sweep's sweep.json. A leaf that
fits keeps every override readable: names that fit are the same as before digests existed.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence

Pairs = Sequence[tuple[str, str]]

# Linux allows 255 bytes per path component; `--rerun_changed` appends `.replaced-<time>`
# (25 bytes) to a run folder, so a name keeps that much room.
MAX_BYTES = 230
DIGEST_HEX = 10
DIGEST_TAG = "overrides-"
ARGS_KEY = ""  # the digested pairs' key of cut arguments


PATH_CHARS = "%/\\"  # with the control characters: what could change the path
SYNTAX_CHARS = "+=,"  # what separates the leaf's pairs and their fields from their values


def escape(text: str, syntax: bool = False) -> str:
    """`text` as part of one path component: `%`, `/`, `\\` and control characters (and with
    `syntax`, `+`, `=` and `,`) as %XX; a whole `.` or `..` as %2E."""
    special = PATH_CHARS + (SYNTAX_CHARS if syntax else "")
    out = "".join(
        f"%{ord(c):02X}" if c in special or ord(c) < 0x20 or ord(c) == 0x7F else c for c in text
    )
    return out.replace(".", "%2E") if out in (".", "..") else out


def _pairs(pairs: Pairs, before: str, between: str) -> str:
    return between.join(f"{before}{escape(k, True)}={escape(v, True)}" for k, v in pairs)


def readable(pairs: Pairs) -> str:
    """`+<field>=<value>` per pair, escaped."""
    return _pairs(pairs, "+", "")


def arguments(pairs: Pairs) -> str:
    """`<key>=<value>,...` of a run's arguments, escaped."""
    return _pairs(pairs, "", ",")


def digest(pairs: Pairs) -> str:
    """The first `DIGEST_HEX` hex digits of sha256(JSON of the pairs, in order)."""
    text = json.dumps([[k, v] for k, v in pairs])
    return hashlib.sha256(text.encode()).hexdigest()[:DIGEST_HEX]


def token(pairs: Pairs) -> str:
    """`+overrides-<digest>` of `pairs` ("" for none)."""
    return f"+{DIGEST_TAG}{digest(pairs)}" if pairs else ""


def _fits(text: str) -> bool:
    return len(text.encode()) <= MAX_BYTES


def _cut(text: str, room: int) -> str:
    """The longest start of `text` of at most `room` bytes (whole characters)."""
    return text.encode()[: max(room, 0)].decode(errors="ignore")


def leaf_and_digested(
    args: Pairs, grid: Pairs = (), changed: Pairs = (), seeds: str = ""
) -> tuple[str, tuple[tuple[str, str], ...]]:
    """(the leaf of a run with the arguments `args`, the grid's overrides `grid`, the sweep's
    overrides `changed` and, for a vmapped program, `seeds` (`seeds=A-B`); the pairs its
    `+overrides-<digest>` stands for, () when it has none)."""
    head, grid, changed = arguments(args), tuple(grid), tuple(changed)

    def join(base: str, after: str) -> str:
        if not base and not seeds:
            base = "defaults"
        return (f"{base},{seeds}" if base and seeds else base or seeds) + after

    candidates = (
        (join(head + readable(grid), readable(changed)), ()),
        (join(head + token(grid), readable(changed)), grid),
        (join(head + token(grid + changed), ""), grid + changed),
    )
    for text, digested in candidates:
        if _fits(text):
            return text, digested
    # Arguments too long for any name: cut, and the digest covers them as well.
    digested = ((ARGS_KEY, head), *grid, *changed)
    tail = token(digested)
    room = MAX_BYTES - len(tail.encode()) - (len(seeds) + 1 if seeds else 0)
    return join(_cut(head, room) + tail, ""), digested


def leaf(args: Pairs, grid: Pairs = (), changed: Pairs = (), seeds: str = "") -> str:
    """The leaf (`leaf_and_digested`)."""
    return leaf_and_digested(args, grid, changed, seeds)[0]


def stem(text: str) -> str:
    """A config file's stem as the first level of its runs' folders (escaped; a stem over
    `MAX_BYTES` is cut and digested)."""
    out = escape(text) or "%"
    if _fits(out):
        return out
    tail = token(((ARGS_KEY, text),))
    return _cut(out, MAX_BYTES - len(tail.encode())) + tail
