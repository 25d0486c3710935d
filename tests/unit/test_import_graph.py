"""No import cycle among the modules of sglang_vlora: data flows one way (request -> policy ->
batch work items -> ATMM -> model -> output processor), with :mod:`sglang_vlora.runtime` at the
bottom. Imports inside functions count too (a cycle dodged by a late import is still a
cycle), and so do relative imports and ``from package import submodule``."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

import sglang_vlora.plugin

PACKAGE_ROOT = Path(sglang_vlora.plugin.__file__).resolve().parent


def module_names(root: Path) -> dict[str, Path]:
    """Dotted name -> file of every module under ``root`` (a package named after its folder)."""
    names = {}
    for path in sorted(root.rglob("*.py")):
        parts = list(path.relative_to(root.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        names[".".join(parts)] = path
    return names


def _base_package(module: str, path: Path, level: int) -> str:
    """The package a relative import of ``level`` dots in ``module`` starts from."""
    parts = module.split(".")
    if path.name != "__init__.py":
        parts.pop()  # a plain module's package is its parent
    return ".".join(parts[: len(parts) - (level - 1)])


def imports_of(module: str, path: Path, known: set[str]) -> set[str]:
    """The modules of ``known`` that ``module`` imports anywhere in its file."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            source = node.module or ""
            if node.level:
                base = _base_package(module, path, node.level)
                source = f"{base}.{source}" if source else base
            for alias in node.names:
                submodule = f"{source}.{alias.name}"
                found.add(submodule if submodule in known else source)
    return {name for name in found if name in known}


def import_graph(root: Path) -> dict[str, set[str]]:
    names = module_names(root)
    known = set(names)
    return {module: imports_of(module, path, known) - {module} for module, path in names.items()}


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One import cycle as ``[a, b, ..., a]``, or None."""
    state: dict[str, str] = {}  # "open" while on the current path, "done" after
    path: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = "open"
        path.append(node)
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == "open":
                return path[path.index(nxt):] + [nxt]
            if nxt not in state:
                cycle = visit(nxt)
                if cycle is not None:
                    return cycle
        path.pop()
        state[node] = "done"
        return None

    for start in sorted(graph):
        if start not in state:
            cycle = visit(start)
            if cycle is not None:
                return cycle
    return None


def test_find_cycle_names_the_cycle_of_a_small_graph():
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": set()}) is None
    assert find_cycle({"a": {"b", "c"}, "b": {"c"}, "c": set()}) is None  # a diamond is no cycle
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert find_cycle({"x": {"a"}, "a": {"b"}, "b": {"a"}}) == ["a", "b", "a"]


def test_the_graph_counts_late_relative_and_submodule_imports(tmp_path):
    """A package whose only cycles go through an import inside a function, a relative import
    and ``from package import submodule``: every one is an edge, and the cycle is found."""
    pkg = tmp_path / "pkg"
    (pkg / "sub").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "a.py").write_text("def f():\n    from pkg import b\n    return b\n")
    (pkg / "b.py").write_text("from .sub import c\n")
    (pkg / "sub" / "__init__.py").write_text("")
    (pkg / "sub" / "c.py").write_text("from .. import a\nfrom pkg.sub import helper_name\n")
    graph = import_graph(pkg)
    assert graph["pkg.a"] == {"pkg.b"}
    assert graph["pkg.b"] == {"pkg.sub.c"}
    assert graph["pkg.sub.c"] == {"pkg.a", "pkg.sub"}
    assert find_cycle(graph) == ["pkg.a", "pkg.b", "pkg.sub.c", "pkg.a"]
    (pkg / "a.py").write_text("import json\n")
    assert find_cycle(import_graph(pkg)) is None


def test_the_graph_of_sglang_vlora_is_read():
    """The walk sees the package's real edges (guards against a graph that is empty by mistake)."""
    graph = import_graph(PACKAGE_ROOT)
    assert "sglang_vlora.runtime" in graph["sglang_vlora.plugin"]
    assert "sglang_vlora.modes.controller" in graph["sglang_vlora.modes.mode_hooks"]
    assert "sglang_vlora.backend" in graph["sglang_vlora.plugin"]  # inside a function


@pytest.mark.parametrize("root", [PACKAGE_ROOT], ids=["sglang_vlora"])
def test_no_import_cycle(root):
    cycle = find_cycle(import_graph(root))
    assert cycle is None, f"import cycle: {' -> '.join(cycle)}"


def test_runtime_is_at_the_bottom():
    """The runtime imports only the options (and, for type hints, what it holds)."""
    graph = import_graph(PACKAGE_ROOT)
    held = {"sglang_vlora.config", "sglang_vlora.heads.task_head", "sglang_vlora.http_api",
            "sglang_vlora.modes.controller", "sglang_vlora.orchestrator.runtime"}
    assert graph["sglang_vlora.runtime"] <= held
