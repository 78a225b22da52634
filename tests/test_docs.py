"""The documentation holds together: every relative link in README.md, docs/, configs/README.md
and BENCHMARKS.md resolves (file and `#anchor`), every docs page is linked from the README, the
README fits on two screens and opens with its two commands."""

from __future__ import annotations

import os
import pathlib
import re

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
DOCS = sorted((ROOT / "docs").glob("*.md"))
PAGES = [
    ROOT / "README.md",
    *DOCS,
    ROOT / "configs/README.md",
    ROOT / "BENCHMARKS.md",
    ROOT / "benchmarks/README.md",
]
README_MAX_LINES = 250
# The two commands at the top of README.md, as .ci/run and a fresh clone run them.
COMMANDS = ["bash scripts/run_default.sh", "bash scripts/test.sh"]

LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)")


def prose(text: str) -> str:
    """`text` without fenced code blocks and inline code spans (links there are not links)."""
    text = re.sub(r"^ *```.*?^ *```", "", text, flags=re.M | re.S)
    return re.sub(r"`[^`\n]*`", "", text)


def slug(heading: str) -> str:
    """GitHub's anchor of a heading: lower case, punctuation dropped, spaces to hyphens."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def anchors(path: pathlib.Path) -> set[str]:
    text = re.sub(r"^ *```.*?^ *```", "", path.read_text(), flags=re.M | re.S)
    seen: dict[str, int] = {}
    out = set()
    for heading in re.findall(r"^#{1,6} +(.+?) *#*$", text, flags=re.M):
        base = slug(heading)
        n = seen.get(base, 0)
        seen[base] = n + 1
        out.add(base if n == 0 else f"{base}-{n}")
    return out


def relative_links(path: pathlib.Path) -> list[str]:
    return [
        target
        for target in LINK.findall(prose(path.read_text()))
        if not re.match(r"[a-z][a-z0-9+.-]*:", target)  # http:, https:, mailto:
    ]


def test_the_pages_exist():
    names = {p.name for p in DOCS}
    assert {"architecture.md", "running.md", "paper.md"} <= names, names
    assert all(p.exists() for p in PAGES)


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_relative_link_resolves(page):
    broken = []
    for target in relative_links(page):
        file, _, anchor = target.partition("#")
        dest = (page.parent / file).resolve() if file else page
        if not dest.exists():
            broken.append(f"{target}: no file {os.path.relpath(dest, ROOT)}")
        elif anchor and dest.suffix == ".md" and anchor not in anchors(dest):
            broken.append(f"{target}: no heading with anchor #{anchor}")
    assert not broken, f"{page.relative_to(ROOT)}: " + "; ".join(broken)


def test_every_docs_page_is_linked_from_the_readme():
    linked = {(ROOT / t.partition("#")[0]).resolve() for t in relative_links(ROOT / "README.md")}
    assert not [p.name for p in DOCS if p.resolve() not in linked]


def test_readme_fits_on_two_screens():
    lines = (ROOT / "README.md").read_text().splitlines()
    assert len(lines) <= README_MAX_LINES, len(lines)


def test_readme_opens_with_its_two_commands():
    """The first fenced block holds exactly the two documented commands, which are what the
    embedded default and CI run."""
    text = (ROOT / "README.md").read_text()
    first = re.search(r"^```\w*\n(.*?)^```", text, flags=re.M | re.S)
    assert first and text.index(first[0]) < text.index("\n## ")
    commands = [line.split("#")[0].strip() for line in first[1].splitlines() if line.strip()]
    assert commands == COMMANDS
    default = (ROOT / "scripts/run_default.sh").read_text()
    assert "-m aepg_jax.main --config=configs/default.py" in default
    assert "bash scripts/test.sh" in (ROOT / ".ci/run").read_text()


def test_the_link_checker_sees_links_and_anchors():
    """The helpers find what they must (so that the tests above cannot pass vacuously)."""
    sample = "[a](docs/x.md#two-words) `[b](no.md)`\n```\n[c](no.md)\n```\n[d](https://x.org)"
    assert LINK.findall(prose(sample)) == ["docs/x.md#two-words", "https://x.org"]
    assert slug("Two `words`") == "two-words" and slug("Losses (SPEC §1)") == "losses-spec-1"
    assert relative_links(ROOT / "README.md")


PATH_NAME = re.compile(r"\baepg_jax/[\w./-]*\w")
MODULE_NAME = re.compile(r"(?<![\w/.])aepg_jax(?:\.[a-z_]\w*)+")


def test_every_package_path_and_module_the_docs_name_exists():
    """`aepg_jax/...` paths and `aepg_jax.x.y` modules named in the docs (code spans included)
    exist, so that a page cannot point at a module that moved."""
    missing = []
    for page in PAGES:
        text = page.read_text()
        for path in set(PATH_NAME.findall(text)):
            if not (ROOT / path).exists() and not (ROOT / f"{path}.py").exists():
                missing.append(f"{page.relative_to(ROOT)}: {path}")
        for module in set(MODULE_NAME.findall(text)):
            parts = module.split(".")
            # the longest prefix that is a module or package; what follows is an attribute
            found = any(
                (ROOT / "/".join(parts[:n])).with_suffix(".py").exists()
                or (ROOT / "/".join(parts[:n]) / "__init__.py").exists()
                for n in range(len(parts), 1, -1)
            )
            if not found:
                missing.append(f"{page.relative_to(ROOT)}: {module}")
    assert not missing, "\n".join(sorted(missing))


TOOL_PATH = re.compile(r"(?<![\w/.-])(?:scripts|benchmarks|tests)/[\w-]+\.(?:py|sh|md)\b")


def test_every_script_benchmark_and_test_file_named_exists():
    """`scripts/...`, `benchmarks/...` and `tests/...` files named in the docs, CI, configs, the
    package, the scripts, the benchmarks and the tests exist, so that nothing points at a tool
    that moved (`scripts/` holds what a user runs, `benchmarks/` the benchmarks)."""
    sources = [*PAGES, ROOT / ".ci/run", ROOT / "pyproject.toml", *ROOT.glob("configs/*.py")]
    sources += [*(ROOT / "aepg_jax").rglob("*.py")]
    for folder in ("scripts", "benchmarks", "tests"):
        sources += [p for p in (ROOT / folder).iterdir() if p.suffix in (".py", ".sh", ".md")]
    missing = [
        f"{source.relative_to(ROOT)}: {path}"
        for source in sources
        for path in sorted(set(TOOL_PATH.findall(source.read_text())))
        if not (ROOT / path).exists()
    ]
    assert not missing, "\n".join(missing)
    assert len([p for p in (ROOT / "scripts").iterdir() if p.is_file()]) <= 12  # user commands
