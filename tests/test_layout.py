"""The package's shape: packages by concept, each importing only the packages it may; no two
modules import each other (directly or round a circle); and the
textbook (`minibert.model`) never reaches into the run, so it reads on its own."""

import ast
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "minibert"

# Each package, and the packages it must never import (its __init__ docstring says why).
# The modules at the top (the file writers, the label rule, the path checks) sit below every
# package and import none of them.
MAY_NOT_IMPORT = {
    "model": {"training", "data", "tasks", "cli"},
    "data": {"model", "training", "interop", "machine", "cli"},
    "machine": {"training", "tasks", "interop", "cli"},
    "interop": {"tasks", "cli"},
    "tasks": {"training", "cli"},
    "training": {"tasks", "cli"},
    "cli": set(),
}
TOP_LEVEL_MODULES = {"__init__", "atomic", "labels", "paths"}
TEXTBOOK = {"config", "model", "attention", "rope", "heads"}


def _module(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def import_graph() -> dict[str, set[str]]:
    """Module -> the package modules it imports, counting imports inside functions and under
    TYPE_CHECKING too: a circle a reader has to follow is one whenever it is taken."""
    modules = {_module(p): p for p in PACKAGE.rglob("*.py")}
    graph = {}
    for name, path in modules.items():
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        edges = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    anchor = package.split(".")
                    anchor = anchor[:len(anchor) - node.level + 1]
                    base = ".".join(anchor + ([node.module] if node.module else []))
                for alias in node.names:
                    full = f"{base}.{alias.name}"
                    edges.add(full if full in modules else base)
            elif isinstance(node, ast.Import):
                edges.update(alias.name for alias in node.names)
        # A module's own package (its __init__) is not a circle back to it.
        graph[name] = {m for m in edges if m in modules and m != name
                       and not name.startswith(m + ".")}
    return graph


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected groups of more than one module (Tarjan's algorithm)."""
    index, low, stack, on_stack, found = {}, {}, [], set(), []

    def visit(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            group = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                group.append(w)
                if w == v:
                    break
            if len(group) > 1:
                found.append(sorted(group))

    for v in graph:
        if v not in index:
            visit(v)
    return found


def test_no_module_imports_one_that_imports_it_back():
    assert circles(import_graph()) == []


def test_the_circle_finder_finds_circles():
    assert circles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert circles({"a": {"b"}, "b": set()}) == []


def test_ls_minibert_shows_the_packages_and_few_modules():
    modules = {p.stem for p in PACKAGE.glob("*.py")}
    packages = {p.name for p in PACKAGE.iterdir() if (p / "__init__.py").is_file()}
    assert modules == TOP_LEVEL_MODULES
    assert packages == set(MAY_NOT_IMPORT)
    assert {p.stem for p in (PACKAGE / "model").glob("*.py")} == TEXTBOOK | {"__init__"}


@pytest.mark.parametrize("package", sorted(MAY_NOT_IMPORT))
def test_each_package_imports_only_what_it_may(package):
    graph = import_graph()
    for module, edges in graph.items():
        if module.split(".")[1:2] != [package]:
            continue
        reached = {m.split(".")[1] for m in edges if m.count(".") >= 1}
        assert not reached & MAY_NOT_IMPORT[package], \
            f"{module} imports {sorted(reached & MAY_NOT_IMPORT[package])}"


def test_the_modules_at_the_top_import_no_package():
    graph = import_graph()
    for name in TOP_LEVEL_MODULES - {"__init__"}:
        reached = {m.split(".")[1] for m in graph[f"minibert.{name}"]}
        assert not reached & set(MAY_NOT_IMPORT), f"minibert.{name} imports {sorted(reached)}"


@pytest.mark.parametrize("module", ["minibert.model.config", "minibert.model.model",
                                    "minibert.model.heads"])
def test_importing_the_textbook_loads_nothing_of_the_run_or_the_data(module):
    """Transitively, in a fresh interpreter: what `import minibert.model.heads` really loads,
    the packages' __init__ included, not only what the file names."""
    code = ("import sys, json; import " + module + "; "
            "print(json.dumps(sorted(m for m in sys.modules if m.startswith('minibert'))))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True, cwd=PACKAGE.parent).stdout
    loaded = set(json.loads(out))
    assert module in loaded
    forbidden = {m for m in loaded if m.split(".")[1:2] and m.split(".")[1]
                 in MAY_NOT_IMPORT["model"]}  # the run, the data, the tasks, the scripts
    assert not forbidden, f"import {module} loads {sorted(forbidden)}"


MODEL_CLASS = re.compile(r"(Modern)?Bert(Model|For\w+)")  # minibert's and transformers'


def test_no_class_is_identified_by_its_name():
    """Behaviour follows what a class is or declares (`isinstance`, `decodes_vocabulary`, its
    `bert` encoder), never its name compared with a string: a class's name is only written
    (config.json's `architectures`, a checkpoint's `model_class`) and read back through one
    table (`interop.export.exportable`, `hf.architecture`)."""
    found = []
    for path in sorted(PACKAGE.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if not isinstance(node, ast.Compare):
                continue
            sides = [node.left, *node.comparators]
            names = [s for s in sides if isinstance(s, ast.Attribute) and s.attr == "__name__"]
            classes = [c for s in sides for c in ast.walk(s) if isinstance(c, ast.Constant)
                       and isinstance(c.value, str) and MODEL_CLASS.fullmatch(c.value)]
            if names and any(isinstance(s, ast.Constant) for s in sides) or classes:
                found.append(f"{path.relative_to(PACKAGE)}:{node.lineno}")
    assert not found, found
