"""The package's shape: no two modules import each other (directly or round a circle), and
the model half never reaches into the run half, so each half reads on its own."""

import ast
import json
import subprocess
import sys
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "minibert"

# What a BERT is, and what a run does with it (README, "Layout"). The run half may import
# the model half; the model half must not import the run half. Beside both: the tokenizer,
# data/, hf.py's file formats, metrics and the atomic file writes that both halves use.
RUN_HALF = {"engine", "state", "resume", "recovery", "rundir", "checkpoint", "precision",
            "distributed", "memory", "meters", "environment", "rng", "optim", "export",
            "runlog", "signals"}
MODEL_HALF = {"config", "attention", "inputs", "kernels", "model", "pretrained", "heads",
              "multitask", "sentence"}


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


def test_the_model_half_does_not_import_the_run_half():
    graph = import_graph()
    for module in MODEL_HALF:
        reached = {m.split(".")[1] for m in graph[f"minibert.{module}"]}
        assert not reached & RUN_HALF, f"minibert.{module} imports {sorted(reached & RUN_HALF)}"
    on_disk = {p.stem for p in PACKAGE.glob("*.py")}
    assert MODEL_HALF | RUN_HALF <= on_disk  # the lists name modules that exist


@pytest.mark.parametrize("module", ["minibert.config", "minibert.model", "minibert.heads"])
def test_importing_the_textbook_loads_nothing_of_the_run_half_or_the_data(module):
    """Transitively, in a fresh interpreter: what `import minibert.model` really loads, the
    package's __init__ included, not only what the file names."""
    code = ("import sys, json; import " + module + "; "
            "print(json.dumps(sorted(m for m in sys.modules if m.startswith('minibert'))))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True, cwd=PACKAGE.parent).stdout
    loaded = set(json.loads(out))
    assert module in loaded
    run_half = {m for m in loaded if m.partition(".")[2] in RUN_HALF}
    data = {m for m in loaded if m.startswith("minibert.data")}  # download, corpus, task files
    assert not run_half and not data, f"import {module} loads {sorted(run_half | data)}"
