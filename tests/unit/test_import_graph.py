"""The compiler's modules import each other without a cycle.

A cycle made parse.py import a rule lazily inside a function (issue 21); this
test reads every module's `ivm_compiler` imports, function-level ones
included, and names the first cycle it finds.
"""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[2] / "ivm_compiler"


def _module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _is_module(name: str) -> bool:
    path = PACKAGE.parent / name.replace(".", "/")
    return path.with_suffix(".py").exists() or (path / "__init__.py").exists()


def _imports(path: Path) -> set[str]:
    """The package modules a module imports (`from ivm_compiler import x`: x if a module)."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names if a.name.split(".")[0] == "ivm_compiler"}
        elif isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] == (
            "ivm_compiler"
        ):
            for alias in node.names:
                submodule = f"{node.module}.{alias.name}"
                found.add(submodule if _is_module(submodule) else str(node.module))
    return found


def import_graph() -> dict[str, set[str]]:
    graph = {_module_name(path): _imports(path) for path in sorted(PACKAGE.rglob("*.py"))}
    return {module: imports - {module} for module, imports in graph.items()}


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One cycle of the graph as [a, b, ..., a], or None."""
    done: set[str] = set()

    def visit(module: str, path: list[str]) -> list[str] | None:
        if module in path:
            return path[path.index(module) :] + [module]
        if module in done:
            return None
        for imported in sorted(graph.get(module, ())):
            cycle = visit(imported, [*path, module])
            if cycle is not None:
                return cycle
        done.add(module)
        return None

    for module in sorted(graph):
        cycle = visit(module, [])
        if cycle is not None:
            return cycle
    return None


def test_a_cycle_is_found_and_named() -> None:
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b", "c"}, "b": {"c"}, "c": set()}) is None


def test_the_graph_is_read() -> None:
    graph = import_graph()
    assert "ivm_compiler.sql" in graph["ivm_compiler.parse"]
    assert graph["ivm_compiler.sql"] == set()


def test_the_compiler_has_no_import_cycle() -> None:
    cycle = find_cycle(import_graph())
    assert cycle is None, "import cycle: " + " -> ".join(cycle or [])
