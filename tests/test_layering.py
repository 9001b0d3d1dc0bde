"""The layers hold: Qt only in the GUI, the import-linter contracts of ``pyproject.toml`` kept,
and no import cycle between the modules of ``workbench``.

Three checks that see different things:

- every module outside ``workbench.gui`` is imported for real, in a fresh interpreter per
  package, and must leave no Qt module in ``sys.modules`` (catches a Qt import at module top,
  however indirect, even one a static tool cannot see);
- ``lint-imports`` checks the contracts (layers, Qt only in the GUI, the GUI through the
  runtime, no torch in the GUI) on the static import graph, function-level imports included;
- an ``ast`` walk builds the import graph of ``workbench`` and fails on any cycle. It counts
  every import statement: module top, inside functions and under ``if TYPE_CHECKING:`` (a
  cycle of type-only imports still ties the two modules together), and resolves
  ``from package import name`` through the package's lazy ``_EXPORTS`` to the submodule
  that defines the name.
"""

from __future__ import annotations

import ast
import importlib
import pkgutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

import workbench

ROOT = Path(__file__).resolve().parent.parent
PACKAGE_DIR = Path(workbench.__file__).parent
QT_PACKAGES = ("PySide6", "pyqtgraph", "shiboken6")
GUI_PACKAGE = "workbench.gui"

# Imports each module in turn and names the first one after which a Qt module is loaded.
_IMPORT_ALL_CODE = """
import importlib, sys
qt = {qt!r}
for name in {modules!r}:
    importlib.import_module(name)
    loaded = sorted(m for m in sys.modules if m.split(".")[0] in qt)
    if loaded:
        print(f"{{name}} loaded {{', '.join(loaded[:5])}}")
        sys.exit(1)
print("imported", len({modules!r}), "modules")
"""


def all_modules() -> list[str]:
    """Every module of ``workbench`` (packages included), found on disk."""
    names = ["workbench"]
    for info in pkgutil.walk_packages([str(PACKAGE_DIR)], prefix="workbench."):
        names.append(info.name)
    return sorted(names)


def _layer_of(module: str) -> str:
    parts = module.split(".")
    return ".".join(parts[:2]) if len(parts) > 1 else module


def non_gui_layers() -> dict[str, list[str]]:
    """The modules outside ``workbench.gui``, grouped by their top-level package or module."""
    layers: dict[str, list[str]] = {}
    for module in all_modules():
        if module == GUI_PACKAGE or module.startswith(GUI_PACKAGE + "."):
            continue
        layers.setdefault(_layer_of(module), []).append(module)
    return layers


def test_the_walk_finds_every_layer() -> None:
    layers = non_gui_layers()
    for package in ("workbench.big_modeling", "workbench.models", "workbench.runtime"):
        assert len(layers[package]) > 3, layers.get(package)
    assert "workbench.cli" in layers
    assert GUI_PACKAGE not in layers


@pytest.mark.parametrize("layer", sorted(non_gui_layers()))
def test_non_gui_modules_import_no_qt(layer: str) -> None:
    modules = non_gui_layers()[layer]
    code = _IMPORT_ALL_CODE.format(qt=QT_PACKAGES, modules=modules)
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=300
    )
    assert result.returncode == 0, f"{layer}: {result.stdout}{result.stderr[-3000:]}"


def test_import_linter_contracts_are_kept() -> None:
    code = "from importlinter.cli import lint_imports_command; lint_imports_command()"
    result = subprocess.run(
        [sys.executable, "-c", code, "--no-cache", "--no-logo"],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=300,
    )
    assert result.returncode == 0, f"broken import contracts:\n{result.stdout}\n{result.stderr}"
    assert "0 broken" in result.stdout, result.stdout


def _module_path(module: str) -> Path:
    relative = Path(*module.split(".")[1:])
    package_init = PACKAGE_DIR / relative / "__init__.py"
    return package_init if package_init.is_file() else (PACKAGE_DIR / relative).with_suffix(".py")


def _lazy_exports(package: str, modules: set[str]) -> dict[str, str]:
    """``name -> defining module`` for a package that re-exports lazily (``_EXPORTS``)."""
    exports = getattr(importlib.import_module(package), "_EXPORTS", None) or {}
    return {
        name: f"{package}.{sub}" for name, sub in exports.items() if f"{package}.{sub}" in modules
    }


def _imported_modules(
    module: str, tree: ast.AST, modules: set[str], is_package: bool
) -> Iterator[str]:
    """The ``workbench`` modules that the import statements of ``tree`` name."""
    package = module if is_package else module.rpartition(".")[0]
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name in modules:
                    yield alias.name
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")
                anchor = anchor[: len(anchor) - (node.level - 1)]
                base = ".".join([*anchor, base] if base else anchor)
            if base not in modules:
                continue
            exports = (
                _lazy_exports(base, modules) if _module_path(base).name == "__init__.py" else {}
            )
            for alias in node.names:
                submodule = f"{base}.{alias.name}"
                if submodule in modules:
                    yield submodule
                elif alias.name in exports:
                    yield exports[alias.name]
                else:
                    yield base


def import_graph() -> dict[str, set[str]]:
    """``module -> modules it imports`` over all of ``workbench`` (self-imports left out)."""
    modules = set(all_modules())
    graph: dict[str, set[str]] = {}
    for module in modules:
        path = _module_path(module)
        tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
        is_package = path.name == "__init__.py"
        graph[module] = set(_imported_modules(module, tree, modules, is_package)) - {module}
    return graph


def import_cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components with more than one module (Tarjan), sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    components: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for target in sorted(graph.get(node, ())):
            if target not in index:
                visit(target)
                low[node] = min(low[node], low[target])
            elif target in on_stack:
                low[node] = min(low[node], index[target])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                components.append(sorted(component))

    limit = sys.getrecursionlimit()
    sys.setrecursionlimit(max(limit, 10 * len(graph) + 100))
    try:
        for node in sorted(graph):
            if node not in index:
                visit(node)
    finally:
        sys.setrecursionlimit(limit)
    return sorted(components)


def test_cycle_finder_sees_a_cycle_and_a_chain() -> None:
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}, "e": set()}
    assert import_cycles(graph) == [["a", "b", "c"]]
    assert import_cycles({"a": {"b"}, "b": set()}) == []


def test_relative_and_lazy_imports_resolve_to_the_defining_module() -> None:
    modules = set(all_modules())
    tree = ast.parse("from . import errors\nfrom workbench.runtime import BadInputError\n")
    found = set(_imported_modules("workbench.big_modeling.utils", tree, modules, False))
    defining = importlib.import_module("workbench.runtime")._EXPORTS["BadInputError"]
    assert found == {"workbench.big_modeling.errors", f"workbench.runtime.{defining}"}


def test_no_import_cycles_between_workbench_modules() -> None:
    graph = import_graph()
    assert graph["workbench.cli"], "the graph lost the CLI's imports"
    cycles = import_cycles(graph)
    described = "\n".join(
        " <-> ".join(cycle)
        + "\n    "
        + "; ".join(f"{m} -> {', '.join(sorted(graph[m] & set(cycle)))}" for m in cycle)
        for cycle in cycles
    )
    assert not cycles, f"{len(cycles)} import cycle(s):\n{described}"
