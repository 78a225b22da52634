"""The package's shape (docs/architecture.md): no import circles, a short top level, the six
commands' `--help` and no code outside data/ naming a data source."""

from __future__ import annotations

import ast
import pathlib
import subprocess
import sys

import pytest

PACKAGE = pathlib.Path(__file__).resolve().parents[1] / "aepg_jax"
COMMANDS = ("main", "sweep", "tables", "plan", "prepare", "launch", "evaluate")


def _modules() -> dict[str, pathlib.Path]:
    """Every module of the package by dotted name (a package by its own name)."""
    mods = {}
    for path in PACKAGE.rglob("*.py"):
        parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        mods[name] = path
    return mods


def _imported(name: str, path: pathlib.Path, mods: dict) -> set[str]:
    """The package's modules that `name` imports anywhere in its body (functions included),
    with the parent packages Python imports first (except `name`'s own: a package that imports
    its submodules, as a registry does, is no circle)."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                up = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*up, base] if base else up)
            targets = [
                f"{base}.{a.name}" if f"{base}.{a.name}" in mods else base for a in node.names
            ]
        else:
            continue
        for target in targets:
            while target.startswith("aepg_jax"):
                if target in mods and not (name + ".").startswith(target + "."):
                    found.add(target)
                target = target.rpartition(".")[0]
    return found


def _cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One import circle of `graph` (a list of modules, first == last), or None."""
    state: dict[str, int] = {}  # 1: on the current path, 2: finished

    def visit(node: str, path: list[str]) -> list[str] | None:
        state[node] = 1
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == 1:
                return [*path[path.index(nxt) :], nxt]
            if nxt not in state and (found := visit(nxt, [*path, nxt])):
                return found
        state[node] = 2
        return None

    for start in sorted(graph):
        if start not in state and (found := visit(start, [start])):
            return found
    return None


def _graph() -> dict[str, set[str]]:
    mods = _modules()
    return {name: _imported(name, path, mods) for name, path in mods.items()}


def test_the_package_has_no_import_circle():
    assert _cycle(_graph()) is None, " -> ".join(_cycle(_graph()) or [])


# The layers, lowest first: a package imports from its own layer or below. The scores
# (`metrics`) sit below storage (`runs`), which sits below the trainers that write it.
LAYERS = (
    ("launch", "system"),
    ("losses", "schedules", "transforms", "data", "metrics"),
    ("models", "prepare"),
    ("checkpoints", "methods"),
    ("config",),
    ("runs",),
    ("continual", "scratch", "pretraining", "plan"),
    ("main", "evaluate"),
    ("experiments", "sweep", "tables"),
)


def _package(module: str) -> str:
    return module.split(".")[1] if "." in module else module


def test_packages_import_only_their_own_layer_or_below():
    layer = {name: i for i, names in enumerate(LAYERS) for name in names}
    top = {_package(m) for m in _modules() if m != "aepg_jax"}
    assert top == set(layer), f"not in docs/architecture.md's layers: {top ^ set(layer)}"
    upward = sorted(
        f"{a} -> {b}"
        for a, targets in _graph().items()
        for b in targets
        if a != "aepg_jax" and b != "aepg_jax" and layer[_package(b)] > layer[_package(a)]
    )
    assert not upward, "\n".join(upward)


def _reaches(graph: dict[str, set[str]], start: str) -> set[str]:
    """Every module `start` imports, directly or through others."""
    seen, todo = set(), [start]
    while todo:
        for nxt in graph.get(todo.pop(), ()):
            if nxt not in seen:
                seen.add(nxt)
                todo.append(nxt)
    return seen


def test_storage_and_evaluate_know_no_trainer_and_the_scores_import_nothing_above():
    """No module of `runs/` or `evaluate/` reaches `continual/` or `scratch/` (the trainers hand
    storage what it needs: their schemas to the run identity); the scores (`metrics`)
    reach no module of the package."""
    graph = _graph()
    trainers = ("aepg_jax.continual", "aepg_jax.scratch")
    reached = sorted(
        f"{a} -> {b}"
        for a in graph
        if a.startswith(("aepg_jax.runs", "aepg_jax.evaluate"))
        for b in _reaches(graph, a)
        if b.startswith(trainers)
    )
    assert not reached, "\n".join(reached)
    assert _reaches(graph, "aepg_jax.metrics") == set()
    assert {"aepg_jax.metrics"} <= graph["aepg_jax.runs.predictions"]
    assert {"aepg_jax.metrics"} <= graph["aepg_jax.evaluate.evaluate"]


def test_the_circle_finder_finds_a_circle():
    assert _cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == ["a", "b", "c", "a"]
    assert _cycle({"a": {"b"}, "b": set(), "c": {"a", "b"}}) is None


def test_function_level_imports_count():
    graph = _graph()
    # tables imports plots inside main() (matplotlib only when plotting): still an edge
    assert "aepg_jax.tables.plots" in graph["aepg_jax.tables.tables"]


def test_the_top_level_holds_at_most_eight_modules():
    top = sorted(p.stem for p in PACKAGE.glob("*.py") if p.name != "__init__.py")
    assert len(top) <= 8, top
    assert {"main", "losses", "schedules"} <= set(top)


def _module_dicts_keyed_by_id(tree: ast.Module) -> set[str]:
    """Module-level dicts that are indexed (`d[id(x)]`, `d.get(id(x))`, ...) by an `id(...)`."""
    dicts = set()
    for node in tree.body:
        value = getattr(node, "value", None)
        if isinstance(node, ast.Assign | ast.AnnAssign) and isinstance(value, ast.Dict):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            dicts |= {t.id for t in targets if isinstance(t, ast.Name)}

    def is_id(n) -> bool:
        return isinstance(n, ast.Call) and getattr(n.func, "id", None) == "id"

    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Subscript) and is_id(node.slice):
            found.add(getattr(node.value, "id", None))
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
            if node.args and is_id(node.args[0]):
                found.add(getattr(node.func.value, "id", None))
    return dicts & found


def _defined(module: str) -> set[str]:
    tree = ast.parse((PACKAGE / "continual" / f"{module}.py").read_text())
    return {n.name for n in tree.body if isinstance(n, (ast.FunctionDef, ast.ClassDef))}


def test_the_continual_trainer_is_the_loop_and_reads_in_one_module():
    """At most 10 modules in continual/; `trainer` holds both the task loop (`run`) and the step
    loop (`train_task`) in at most 600 lines, the programs (`programs`), the fit check (`fit`)
    and the evaluation (`evaluation`) beside it; no module of the package keeps a cache keyed by
    `id(...)`."""
    modules = sorted(p.stem for p in (PACKAGE / "continual").glob("*.py"))
    assert len(modules) <= 10, modules
    assert {"run", "train_task"} <= _defined("trainer")
    assert len((PACKAGE / "continual" / "trainer.py").read_text().splitlines()) <= 600
    assert {"Programs", "build_programs", "plan_task", "task_spec"} <= _defined("programs")
    assert "check_programs" in _defined("fit") and "evaluate" in _defined("evaluation")
    keyed_by_id = [
        f"{path.relative_to(PACKAGE)}: {name}"
        for path in PACKAGE.rglob("*.py")
        for name in _module_dicts_keyed_by_id(ast.parse(path.read_text()))
    ]
    assert not keyed_by_id, keyed_by_id


def _source_branches(path: pathlib.Path) -> int:
    """Comparisons of an attribute `source` (`d.source == "digits"`, `x.source in (...)`)."""
    return sum(
        isinstance(node, ast.Compare)
        and any(
            isinstance(side, ast.Attribute) and side.attr == "source"
            for side in (node.left, *node.comparators)
        )
        for node in ast.walk(ast.parse(path.read_text()))
    )


def test_only_data_names_the_data_sources():
    """Datasets are registered in data/datasets.py: code outside data/ asks the registry and
    never branches on `data.source`."""
    found = {
        name: n
        for name, path in _modules().items()
        if not name.startswith("aepg_jax.data") and (n := _source_branches(path))
    }
    assert not found, found


@pytest.mark.parametrize("command", COMMANDS)
def test_every_command_has_help_that_exits_0(command):
    out = subprocess.run(
        [sys.executable, "-m", f"aepg_jax.{command}", "--help"],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert out.returncode == 0, out.stderr[-2000:]
    assert "usage" in out.stdout.lower() or "python -m aepg_jax" in out.stdout, out.stdout[:500]
