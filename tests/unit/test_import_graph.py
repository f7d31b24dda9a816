"""The compiler's modules, and the adapter's, import each other without a cycle.

A cycle made parse.py import a rule lazily inside a function (issue 21), and
one made schema_changes.py import delta.py's types only for the type checker;
this test reads every module's imports of either package, function-level
and TYPE_CHECKING ones included, and names the first cycle it finds. A
package's `__init__` importing its modules is not an edge back from them:
Python runs it first, as it would for any package.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("ivm_compiler", "dbt.adapters.spark_ivm")
ADAPTER = "dbt.adapters.spark_ivm"


def _module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _is_module(name: str) -> bool:
    path = ROOT / name.replace(".", "/")
    return path.with_suffix(".py").exists() or (path / "__init__.py").exists()


def _in_packages(name: str) -> bool:
    return any(name == package or name.startswith(f"{package}.") for package in PACKAGES)


def _imports(path: Path) -> set[str]:
    """The package modules a module imports (`from ivm_compiler import x`: x if a module)."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names if _in_packages(a.name)}
        elif isinstance(node, ast.ImportFrom) and _in_packages(node.module or ""):
            for alias in node.names:
                submodule = f"{node.module}.{alias.name}"
                found.add(submodule if _is_module(submodule) else str(node.module))
    return found


def import_graph() -> dict[str, set[str]]:
    paths = [
        path
        for package in PACKAGES
        for path in sorted((ROOT / package.replace(".", "/")).rglob("*.py"))
    ]
    graph = {_module_name(path): _imports(path) for path in paths}
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
    assert f"{ADAPTER}.delta.history" in graph[f"{ADAPTER}.delta.tables"]
    assert f"{ADAPTER}.runtime.server" in graph[f"{ADAPTER}.runtime.cluster"]
    assert f"{ADAPTER}.refresh.recipe" in graph[f"{ADAPTER}.impl"]


def test_the_compiler_and_the_adapter_have_no_import_cycle() -> None:
    cycle = find_cycle(import_graph())
    assert cycle is None, "import cycle: " + " -> ".join(cycle or [])


def test_the_compiler_imports_nothing_of_the_adapter() -> None:
    graph = import_graph()
    reaching = {
        module: sorted(i for i in imports if i.startswith(ADAPTER))
        for module, imports in graph.items()
        if module.startswith("ivm_compiler")
    }
    assert not any(reaching.values()), {m: i for m, i in reaching.items() if i}


def test_delta_and_the_runtimes_import_nothing_of_the_adapter_but_themselves() -> None:
    """The lowest layers of the adapter (docs/architecture.md): Delta through SQL, and Spark."""
    graph = import_graph()
    for layer in ("delta", "runtime"):
        inside = f"{ADAPTER}.{layer}"
        outside = {
            module: sorted(i for i in imports if i.startswith(ADAPTER) and not i.startswith(inside))
            for module, imports in graph.items()
            if module.startswith(inside)
        }
        assert not any(outside.values()), {m: i for m, i in outside.items() if i}
