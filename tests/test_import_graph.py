"""The package's modules import each other without cycles.

A cycle makes import order matter and hides which module owns what. The
graph counts every import a module can run: module level and inside
functions (a lazy import still runs, and a cycle through it breaks as soon as
someone hoists it). Imports under ``if TYPE_CHECKING:`` do not count: they
never run. The package's ``__init__`` is a facade whose heavy names load on
first use (its ``_LAZY`` table), so using ``bc.save`` or ``from
pytest_backendconf import save`` is an edge to the module defining ``save``,
and ``__init__`` itself has only its eager imports as edges.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
#: The package's import name -> the folder it is installed from (pyproject.toml's package-dir).
PACKAGES = {"pytest_backendconf": ROOT / "pytest_backendconf", "pytest_backendconf.conformance": ROOT / "conformance"}


def package_modules() -> dict[str, Path]:
    found = {}
    for package, folder in PACKAGES.items():
        for path in sorted(folder.glob("*.py")):
            found[package if path.stem == "__init__" else f"{package}.{path.stem}"] = path
    return found


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _imports(
    tree: ast.AST, module: str, is_package: bool, lazy: dict[str, str] | None = None, submodules: set[str] = frozenset()
) -> set[str]:
    """Every module name ``tree`` imports, resolved to absolute names, skipping TYPE_CHECKING blocks.

    ``lazy`` maps the facade's lazy names to their modules: a use of one
    (``from pytest_backendconf import save``, ``bc.save``) imports its module.
    Importing a submodule imports the package first anyway, so the package is
    an edge only when a name it defines is taken from it (``from . import
    __version__``); ``submodules`` are the package's submodule names.
    """
    here = module if is_package else module.rpartition(".")[0]
    lazy = lazy or {}
    found: set[str] = set()
    facade_aliases: set[str] = set()

    def visit(node: ast.AST) -> None:
        if isinstance(node, ast.If) and _is_type_checking(node.test):
            for child in node.orelse:
                visit(child)
            return
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
            facade_aliases.update(a.asname or a.name for a in node.names if a.name == "pytest_backendconf")
        elif isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id in facade_aliases:
            if node.attr in lazy:
                found.add(lazy[node.attr])
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = here.split(".")[: len(here.split(".")) - (node.level - 1)]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            if target != "pytest_backendconf":
                found.add(target)
            for alias in node.names:
                if target == "pytest_backendconf" and alias.name in lazy:
                    found.add(lazy[alias.name])
                elif target == "pytest_backendconf" and alias.name not in submodules:
                    found.add(target)  # a name __init__ defines or imports eagerly
                else:
                    found.add(f"{target}.{alias.name}")  # `from package import submodule`
        for child in ast.iter_child_nodes(node):
            visit(child)

    visit(tree)
    return found


def _lazy_names(tree: ast.Module) -> dict[str, str]:
    """``__init__``'s ``_LAZY`` table: name -> the module that defines it (imported on first access)."""
    for node in tree.body:
        if isinstance(node, (ast.Assign, ast.AnnAssign)) and isinstance(node.value, ast.Dict):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            if any(isinstance(t, ast.Name) and t.id == "_LAZY" for t in targets):
                return {
                    k.value: "pytest_backendconf" + v.value
                    for k, v in zip(node.value.keys, node.value.values)
                    if isinstance(k, ast.Constant) and isinstance(v, ast.Constant)
                }
    return {}


def import_graph() -> dict[str, set[str]]:
    modules = package_modules()
    trees = {name: ast.parse(path.read_text(encoding="utf-8"), str(path)) for name, path in modules.items()}
    lazy = _lazy_names(trees["pytest_backendconf"])
    submodules = {name.split(".")[1] for name in modules if name.count(".") == 1}
    graph = {}
    for name, tree in trees.items():
        edges = _imports(tree, name, modules[name].stem == "__init__", lazy, submodules)
        graph[name] = {e for e in edges if e in modules and e != name}
    return graph


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One cycle of ``graph`` as a path ``[a, b, …, a]``, or None."""
    state: dict[str, int] = {}  # 1 on the stack, 2 done
    stack: list[str] = []

    def walk(node: str) -> list[str] | None:
        state[node] = 1
        stack.append(node)
        for nxt in sorted(graph[node]):
            if state.get(nxt) == 1:
                return stack[stack.index(nxt) :] + [nxt]
            if nxt not in state and (cycle := walk(nxt)):
                return cycle
        stack.pop()
        state[node] = 2
        return None

    for node in sorted(graph):
        if node not in state and (cycle := walk(node)):
            return cycle
    return None


def test_the_package_has_no_import_cycle() -> None:
    graph = import_graph()
    assert len(graph) > 20, f"the walk found only {sorted(graph)}: are PACKAGES right?"
    cycle = find_cycle(graph)
    assert cycle is None, (
        "import cycle: " + " -> ".join(cycle) + ". Move what both sides need into a module below them "
        "(as _check.py is below _suite.py and the categories)."
    )


def test_the_cycle_finder_finds_cycles() -> None:
    # The check above can fail: a direct cycle, a long one, and a lazy-import edge are all seen.
    assert find_cycle({"a": {"b"}, "b": {"a"}}) == ["a", "b", "a"]
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": set()}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b"}, "b": set()}) is None
    tree = ast.parse("def f():\n    from . import _x\nif TYPE_CHECKING:\n    from . import _y\n")
    found = _imports(tree, "pytest_backendconf.m", False, submodules={"_x", "_y"})
    assert "pytest_backendconf._x" in found and "pytest_backendconf._y" not in found
    assert _imports(ast.parse("from . import __version__"), "pytest_backendconf.m", False) == {"pytest_backendconf"}
    lazy = _lazy_names(ast.parse('_LAZY = {"save": "._archive"}'))
    assert lazy == {"save": "pytest_backendconf._archive"}
    uses = ast.parse("import pytest_backendconf as bc\ndef f():\n    bc.save()\n")
    assert "pytest_backendconf._archive" in _imports(uses, "pytest_backendconf.conformance.m", False, lazy)
    uses = ast.parse("from pytest_backendconf import save\n")
    assert "pytest_backendconf._archive" in _imports(uses, "pytest_backendconf.conformance.m", False, lazy)
