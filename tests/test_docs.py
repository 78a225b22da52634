"""The documentation holds together: every relative link in README.md, docs/, configs/README.md
and BENCHMARKS.md resolves (file and `#anchor`), every docs page is linked from the README, the
README fits on two screens and opens with its two commands; every `algorithm.md §N` reference
names a section of docs/algorithm.md, nothing cites the unpublished SPEC, and code and docs
carry no issue numbers (history is CHANGELOG.md's)."""

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
    assert slug("Two `words`") == "two-words" and slug("5. PEFT modules (§5)") == "5-peft-modules-5"
    assert relative_links(ROOT / "README.md")


PATH_NAME = re.compile(r"(?<!\.cache/)\baepg_jax/[\w./-]*\w")  # not the user cache's folder
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


ALGORITHM = ROOT / "docs/algorithm.md"
SECTION_REF = re.compile(r"algorithm\.md\s+§(\d+)((?:\s*[-,]\s*§?\d+)*)")
SPEC_DOC = re.compile(r"\bSPEC(_BASELINES)?\b")
ISSUE_NUMBER = re.compile(r"\bissues? #?\d+", re.I)


def text_files(*roots: str) -> list[pathlib.Path]:
    """The text files under `roots` (directories or files)."""
    out = []
    for root in roots:
        base = ROOT / root
        paths = [base] if base.is_file() else sorted(base.rglob("*")) if base.is_dir() else []
        for path in paths:
            rel = path.relative_to(ROOT).as_posix()
            if not path.is_file() or "__pycache__" in rel:
                continue
            try:
                path.read_text(encoding="utf-8")
            except UnicodeDecodeError:
                continue  # binary: weights, fixtures
            out.append(path)
    return out


def cited_sections(text: str) -> set[int]:
    """Section numbers of every `algorithm.md §N` reference, ranges and lists included
    (`§10-§14` gives 10..14, `§6, §16` gives 6 and 16)."""
    sections: set[int] = set()
    for first, rest in SECTION_REF.findall(text):
        numbers = [int(first)]
        for sep, n in re.findall(r"\s*([-,])\s*§?(\d+)", rest):
            if sep == "-":
                numbers.extend(range(numbers[-1] + 1, int(n) + 1))
            else:
                numbers.append(int(n))
        sections.update(numbers)
    return sections


def algorithm_sections() -> set[int]:
    return {int(n) for n in re.findall(r"^## (\d+)\. ", ALGORITHM.read_text(), flags=re.M)}


REFERENCE_ROOTS = ("aepg_jax", "docs", "configs", "README.md", "scripts", "benchmarks")
HISTORY_ROOTS = ("aepg_jax", "docs", "scripts", "benchmarks")
# What a user reads and runs names no tracker's issues and no development machine's folders.
USER_ROOTS = (
    "README.md", "BENCHMARKS.md", "CHANGELOG.md", "docs", "benchmarks", "configs", "scripts",
)  # fmt: skip
TRACKER_NUMBER = re.compile(r"\bissues? #?\d+|(?<![\w&/])#\d+\b|\(issue\b", re.I)
MACHINE_PATH = re.compile(r"(?<![\w.~-])/(?:work|root|home)/")


def test_every_algorithm_reference_names_an_existing_section():
    sections = algorithm_sections()
    assert sections == set(range(1, max(sections) + 1)), sorted(sections)  # contiguous
    bad = [
        f"{p.relative_to(ROOT)}: §{n}"
        for p in text_files(*REFERENCE_ROOTS)
        for n in sorted(cited_sections(p.read_text()) - sections)
    ]
    assert not bad, bad


def test_no_file_cites_the_unpublished_spec():
    bad = [
        f"{p.relative_to(ROOT)}:{i}: {line.strip()}"
        for p in text_files(*REFERENCE_ROOTS)
        for i, line in enumerate(p.read_text().splitlines(), 1)
        if SPEC_DOC.search(line)
    ]
    assert not bad, "\n".join(bad)


def test_no_file_carries_issue_numbers():
    """Code and docs say what is; history with its issue numbers is CHANGELOG.md's."""
    bad = [
        f"{p.relative_to(ROOT)}:{i}: {line.strip()}"
        for p in text_files(*HISTORY_ROOTS)
        for i, line in enumerate(p.read_text().splitlines(), 1)
        if ISSUE_NUMBER.search(line)
    ]
    assert not bad, "\n".join(bad)


def test_what_users_read_names_no_tracker_issue_and_no_machine_path():
    """README, BENCHMARKS, CHANGELOG, docs, benchmarks, configs and scripts speak of the project:
    no issue numbers of a tracker users cannot see, no folders of a development machine (a
    benchmark's output directory is an argument with a relative default)."""
    bad = [
        f"{p.relative_to(ROOT)}:{i}: {line.strip()}"
        for p in text_files(*USER_ROOTS)
        for i, line in enumerate(p.read_text().splitlines(), 1)
        if TRACKER_NUMBER.search(line) or MACHINE_PATH.search(line)
    ]
    assert not bad, "\n".join(bad)


def test_the_reference_and_history_checkers_see_what_they_must():
    assert cited_sections("docs/algorithm.md §10-§14 and algorithm.md §6, §16; x") == {
        6,
        10,
        11,
        12,
        13,
        14,
        16,
    }
    assert cited_sections("[algorithm.md §5](algorithm.md#5-peft-modules)") == {5}
    assert SPEC_DOC.search("see SPEC §3") and SPEC_DOC.search("SPEC_BASELINES §1")
    assert not SPEC_DOC.search("GPU_SPECS = LAE_SPEC")
    assert ISSUE_NUMBER.search("After issues 26, 27") and ISSUE_NUMBER.search("issue #33")
    assert not ISSUE_NUMBER.search("the issue that led to it")
    for tracked in ("- Issue 23: the schedule", "CODA-Prompt (issue 11)", "fixed in #12", "(issue"):
        assert TRACKER_NUMBER.search(tracked), tracked
    for fine in ("algorithm.md#4-class-incremental-protocol", "&#8203;", "a known issue"):
        assert not TRACKER_NUMBER.search(fine), fine
    for path in ("--out=/work/rehearsal/archives", "/root/.cache", "see /home/me/x"):
        assert MACHINE_PATH.search(path), path
    for fine in ("--out=rehearsal/archives", "~/.cache/aepg_jax", "runs/work/x", "/tmp/x"):
        assert not MACHINE_PATH.search(fine), fine
    assert text_files("aepg_jax") and text_files("README.md")


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


def test_sweep_help_the_readme_and_the_paper_page_list_every_experiment(capsys):
    from aepg_jax.experiments import registry
    from aepg_jax.sweep import sweep

    with pytest.raises(SystemExit) as done:
        sweep.parse(["--help"])
    assert done.value.code == 0
    shown = capsys.readouterr().out
    pages = {p: (ROOT / p).read_text() for p in ("README.md", "docs/paper.md")}
    for name, experiment in registry.registry().items():
        # --help: one line per experiment, generated from the registry.
        assert re.search(rf"^  {name} +{re.escape(experiment.title)}$", shown, re.M), name
        # The README and docs/paper.md: one table row each.
        for page, text in pages.items():
            assert re.search(rf"^\| `{name}` \| ", text, re.M), f"{page} does not list {name}"


def _section(text: str, start: str, end: str) -> str:
    """The text of `text` from the first line starting with `start` up to the next line
    starting with `end` (exclusive)."""
    lines = text.splitlines()
    first = next(i for i, line in enumerate(lines) if line.startswith(start))
    last = next((i for i in range(first + 1, len(lines)) if lines[i].startswith(end)), len(lines))
    return "\n".join(lines[first:last])


def test_every_registered_method_is_named_where_the_docs_list_methods():
    """Each list of the continual methods names every method of `aepg_jax.methods.REGISTRY` by
    its `method.name` (in backquotes): the README's tour, docs/architecture.md's package table,
    docs/methods.md's and docs/algorithm.md's openings; configs/README.md's `method=` values
    are exactly the registry's."""
    from aepg_jax import methods

    read = {p: (ROOT / p).read_text() for p in ("README.md", "docs/architecture.md")}
    lists = {
        "README.md (tour)": _section(read["README.md"], "| `methods/` |", "|"),
        "docs/architecture.md (packages)": _section(
            read["docs/architecture.md"], "| `methods/` |", "|"
        ),
        "docs/methods.md (opening)": _section((ROOT / "docs/methods.md").read_text(), "#", "##"),
        "docs/algorithm.md (opening)": _section(ALGORITHM.read_text(), "#", "## 1."),
    }
    missing = [
        f"{where}: {name}"
        for where, text in lists.items()
        for name in methods.NAMES
        if f"`{name}`" not in text
    ]
    assert not missing, "\n".join(missing)
    row = _section((ROOT / "configs/README.md").read_text(), "| `method` |", "|")
    values = {v.strip() for v in row.strip("| \n").split("|")[-1].split(",")}
    assert values == set(methods.NAMES), values ^ set(methods.NAMES)


def test_the_docs_name_only_experiments_that_exist():
    """Every `` `NAME` `` a docs page calls an experiment (`--experiment=NAME`, "Demo of `NAME`",
    a table row of the experiment list) is registered."""
    from aepg_jax.experiments import registry

    known = set(registry.registry())
    patterns = (
        r"--experiment=([a-z_0-9]+)\b(?!\.py)",
        r"Demo of `([a-z_0-9]+)`",
        r"^\| `([a-z_0-9]+)` \| (?:Table|Fig|Demo|Every|Backbones|[A-Z][\w-]+ \()",
    )
    bad = [
        f"{page.relative_to(ROOT)}: {name}"
        for page in PAGES
        for pattern in patterns
        for name in re.findall(pattern, page.read_text(), flags=re.M)
        if name not in known and name != "NAME"
    ]
    assert not bad, "\n".join(bad)


def test_every_headless_chromium_command_runs_as_root():
    """Chromium refuses to start as root without `--no-sandbox`: every headless command in the
    docs carries it."""
    bad = [
        f"{page.relative_to(ROOT)}:{i}: {line.strip()}"
        for page in PAGES
        for i, line in enumerate(page.read_text().splitlines(), 1)
        if re.search(r"chromium --headless\b", line) and "--no-sandbox" not in line
    ]
    assert not bad, "\n".join(bad)
