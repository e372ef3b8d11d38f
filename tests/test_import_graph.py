"""The package's modules import each other without cycles, and only downwards between its layers.

A cycle makes import order matter and hides which module owns what. The
graph counts every import a module can run: module level and inside
functions (a lazy import still runs, and a cycle through it breaks as soon as
someone hoists it). Imports under ``if TYPE_CHECKING:`` do not count: they
never run. The package's ``__init__`` is a facade whose heavy names load on
first use (its ``_LAZY`` table), so using ``bc.save`` or ``from
pytest_backendconf import save`` is an edge to the module defining ``save``,
and ``__init__`` itself has only its eager imports as edges.

Across packages, only public names: no module imports another package's
private module (``a.b._c`` from outside ``a.b``) or private name; the
engines' backends under backends/ are packages too.

The layers, top to bottom (docs/design-notes.md, "The house by domain"):
``cli``; ``suite`` with the categories (``conformance``); ``report``,
``target``, ``diagnostics``; ``lowering``; ``archive``; ``debuginfo``,
``reference``, ``registry``; the check vocabulary (``checks``); the public surface. A module may import its
own layer and the layers below it, never one above.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
#: The package's import name -> the folder it is installed from (pyproject.toml's package-dir).
PACKAGES = {"pytest_backendconf": ROOT / "pytest_backendconf", "pytest_backendconf.conformance": ROOT / "conformance"}

#: The layers, top to bottom; a name is a sub-package, or a top-level module of the public surface.
LAYERS: list[tuple[str, ...]] = [
    ("cli", "rerun"),
    ("suite", "conformance"),
    ("report", "torchscript", "target", "diagnostics"),
    ("lowering",),
    ("archive",),
    ("debuginfo", "reference", "registry", "allowlist", "numerics", "quant"),
    # The check vocabulary: every room that runs, decides or reports a check speaks it; it imports nothing.
    ("checks",),
    (
        "backend",
        "blobs",
        "capabilities",
        "cases",
        "errors",
        "hookspecs",
        "provenance",
        "vendor",
        "_compat",
        "_diagnostic",
        "_quoting",
        "_validation",
        "_moved",
    ),
]
#: Above every layer: the pytest entry module and the facade (its names load lazily, each from its layer).
ENTRIES = ("plugin", "")
#: The one upward import, lazy: ``str()`` of an `UnsupportedNodeError` raised outside `to_backend` (a
#: backend's own test calling ``preprocess``) formats the node's source with debuginfo's formatter.
#: Moving that formatter into errors would put the whole source-location machinery in the public surface.
ALLOWED_UPWARD = {("pytest_backendconf.errors", "pytest_backendconf.debuginfo")}


def package_modules() -> dict[str, Path]:
    found = {}
    for package, folder in PACKAGES.items():
        for path in sorted(folder.rglob("*.py")):
            parts = path.relative_to(folder).with_suffix("").parts
            if parts[-1] == "__init__":
                parts = parts[:-1]
            found[".".join((package, *parts))] = path
    return found


def layer_of(module: str) -> int:
    """The index in `LAYERS` of ``module`` (0 is the top); -1 for the entry module and the facade."""
    room = module.split(".")[1] if module.count(".") else ""
    if room in ENTRIES:
        return -1
    for index, rooms in enumerate(LAYERS):
        if room in rooms:
            return index
    raise AssertionError(f"{module} is in no layer: add its sub-package to LAYERS in {__file__}")


def upward_imports(graph: dict[str, set[str]]) -> list[str]:
    """``a -> b`` for every import of a module from a layer above the importer's."""
    found = []
    for module, edges in sorted(graph.items()):
        for imported in sorted(edges):
            if layer_of(imported) < layer_of(module) and layer_of(imported) >= 0:
                package = ".".join(imported.split(".")[:2])
                if (module, package) not in ALLOWED_UPWARD:
                    found.append(f"{module} -> {imported}")
    return found


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _imports(
    tree: ast.AST,
    module: str,
    is_package: bool,
    lazy: dict[str, str] | None = None,
    submodules: set[str] = frozenset(),
    rooms_lazy: dict[str, dict[str, str]] | None = None,
) -> set[str]:
    """Every module name ``tree`` imports, resolved to absolute names, skipping TYPE_CHECKING blocks.

    ``lazy`` maps the facade's lazy names to their modules: a use of one
    (``from pytest_backendconf import save``, ``bc.save``) imports its module.
    ``rooms_lazy`` does the same for a sub-package whose ``__init__`` has a
    ``_LAZY`` table (the suite's plugins): package -> name -> module.
    Importing a submodule imports the package first anyway, so the package is
    an edge only when a name it defines is taken from it (``from . import
    __version__``); ``submodules`` are the package's submodule names.
    """
    here = module if is_package else module.rpartition(".")[0]
    lazy = lazy or {}
    rooms_lazy = rooms_lazy or {}
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
            if target != "pytest_backendconf" and not node.names:
                found.add(target)
            for alias in node.names:
                if target == "pytest_backendconf" and alias.name in lazy:
                    found.add(lazy[alias.name])
                elif alias.name in rooms_lazy.get(target, {}):
                    found.add(rooms_lazy[target][alias.name])
                elif f"{target}.{alias.name}" in submodules or (
                    target == "pytest_backendconf" and alias.name in submodules
                ):
                    found.add(f"{target}.{alias.name}")  # `from package import submodule`
                else:
                    found.add(target)  # a name the package's __init__ defines or imports
        for child in ast.iter_child_nodes(node):
            visit(child)

    visit(tree)
    return found


def _lazy_names(tree: ast.Module, package: str = "pytest_backendconf") -> dict[str, str]:
    """``package``'s ``__init__``'s ``_LAZY`` table: name -> the module that defines it (imported on first access)."""
    for node in tree.body:
        if isinstance(node, (ast.Assign, ast.AnnAssign)) and isinstance(node.value, ast.Dict):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            if any(isinstance(t, ast.Name) and t.id == "_LAZY" for t in targets):
                return {
                    k.value: package + v.value
                    for k, v in zip(node.value.keys, node.value.values)
                    if isinstance(k, ast.Constant) and isinstance(v, ast.Constant)
                }
    return {}


def import_graph() -> dict[str, set[str]]:
    modules = package_modules()
    trees = {name: ast.parse(path.read_text(encoding="utf-8"), str(path)) for name, path in modules.items()}
    lazy = _lazy_names(trees["pytest_backendconf"])
    rooms_lazy = {
        name: _lazy_names(tree, name)
        for name, tree in trees.items()
        if name != "pytest_backendconf" and modules[name].stem == "__init__"
    }
    submodules = set(modules)
    graph = {}
    for name, tree in trees.items():
        edges = _imports(tree, name, modules[name].stem == "__init__", lazy, submodules, rooms_lazy)
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
        "(as checks/_check.py is below suite/_suite.py and the categories)."
    )


def test_no_layer_imports_a_layer_above_it() -> None:
    upward = upward_imports(import_graph())
    assert not upward, (
        "imports from a layer above the importer's: " + "; ".join(upward) + ". Move what the lower layer needs "
        "down (as the archive keeps records and lowering builds modules from them), or pass it in as a parameter."
    )


def test_every_module_is_in_a_layer() -> None:
    modules = import_graph()
    assert {layer_of(m) for m in modules} == {-1, *range(len(LAYERS))}


def test_the_layer_check_finds_an_upward_import() -> None:
    # The check above can fail: archive importing lowering, debuginfo importing the suite, a lazy one too.
    graph = import_graph()
    graph["pytest_backendconf.archive._manifest"].add("pytest_backendconf.lowering._lowered_module")
    graph["pytest_backendconf.debuginfo._info"].add("pytest_backendconf.suite")
    assert upward_imports(graph) == [
        "pytest_backendconf.archive._manifest -> pytest_backendconf.lowering._lowered_module",
        "pytest_backendconf.debuginfo._info -> pytest_backendconf.suite",
    ]
    tree = ast.parse("def f():\n    from ..lowering import LoweredModule\n")
    assert "pytest_backendconf.lowering" in _imports(tree, "pytest_backendconf.archive._archive", False)
    assert upward_imports({"pytest_backendconf.archive._archive": {"pytest_backendconf.lowering"}}) == [
        "pytest_backendconf.archive._archive -> pytest_backendconf.lowering"
    ]


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


#: Each engine's backend package (backends/*/backendconf_*): a room of its own, held to the same rule.
BACKENDS = {folder.name: folder for folder in sorted(ROOT.glob("backends/*/backendconf_*")) if folder.is_dir()}


def checked_modules() -> dict[str, tuple[Path, bool]]:
    """Every module the reach-in rule covers -> (its file, whether it is a package's ``__init__``).

    The package and its suite, and the engines' backends. Not ``tests/`` or ``benchmarks/``: a test of
    a room may import that room's private modules to test them (and a benchmark to time them); what
    ships must use other rooms' public names.
    """
    found = {name: (path, path.stem == "__init__") for name, path in package_modules().items()}
    for package, folder in BACKENDS.items():
        for path in sorted(folder.rglob("*.py")):
            parts = path.relative_to(folder).with_suffix("").parts
            if parts[-1] == "__init__":
                parts = parts[:-1]
            found[".".join((package, *parts))] = (path, path.stem == "__init__")
    return found


def _private(name: str) -> bool:
    return name.startswith("_") and not name.startswith("__")


def private_names(tree: ast.AST, module: str, is_package: bool) -> set[str]:
    """Every dotted name ``tree`` imports that has a private part: ``a.b._c`` (a private module, or a
    private name ``_c`` of ``a.b``), type-checking imports included (they name the private module too)."""
    here = module if is_package else module.rpartition(".")[0]
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = here.split(".")[: len(here.split(".")) - (node.level - 1)]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            names = [target] + [f"{target}.{alias.name}" for alias in node.names]
        else:
            continue
        found.update(name for name in names if any(_private(part) for part in name.split(".")))
    return found


def owner(name: str, packages: set[str]) -> str:
    """The package whose private part ``name`` reaches: the package that holds its first private part.

    ``a.b._c`` is private to package ``a.b``; a private name of a plain module
    (``a.b.m._x``) is private to that module's package ``a.b``.
    """
    parts = name.split(".")
    first = next(i for i, part in enumerate(parts) if _private(part))
    holder = ".".join(parts[:first])
    return holder if holder in packages or "." not in holder else holder.rpartition(".")[0]


def reach_ins(imports: dict[str, set[str]], packages: set[str]) -> list[str]:
    """``importer -> name`` for every import of a private module or name from outside its package.

    ``imports`` maps a module to its `private_names`. Only names of our own packages count (a
    private module of torch is ``_compat``'s business, and ruff's).
    """
    found = []
    for module, names in sorted(imports.items()):
        for name in sorted(names):
            if not name.startswith(("pytest_backendconf", *BACKENDS)):
                continue
            package = owner(name, packages)
            inside = module == package or module.startswith(package + ".")
            # pytest_backendconf.conformance is installed inside pytest_backendconf but is a room of its own.
            if package == "pytest_backendconf" and module.startswith("pytest_backendconf.conformance"):
                inside = name.split(".")[1] == "_compat"  # every private torch name lives there, for every room
            if not inside:
                found.append(f"{module} -> {name}")
    return found


def private_imports() -> tuple[dict[str, set[str]], set[str]]:
    modules = checked_modules()
    packages = {name for name, (_, is_package) in modules.items() if is_package}
    imports = {}
    for name, (path, is_package) in modules.items():
        imports[name] = private_names(ast.parse(path.read_text(encoding="utf-8"), str(path)), name, is_package)
    return imports, packages


def test_no_package_imports_another_packages_private_modules() -> None:
    imports, packages = private_imports()
    assert {"backendconf_reference", "backendconf_onnxruntime", "backendconf_executorch"} <= packages
    found = reach_ins(imports, packages)
    assert not found, (
        "private modules or names of another package: " + "; ".join(found) + ". Export what the importer needs "
        "from the owning package's __init__ (with __all__) and import it from there (docs/design-notes.md, "
        '"Public names across rooms").'
    )


def test_the_reach_in_check_finds_a_reach_in() -> None:
    # The check above can fail: a conformance module taking the suite's private context module, a backend
    # importing lowering's private module (a lazy import too), a private name from another room's face.
    packages = {"pytest_backendconf", "pytest_backendconf.suite", "pytest_backendconf.lowering"}
    text = (
        "from pytest_backendconf.suite._context import SuiteContext\n"
        "def f():\n    from pytest_backendconf.lowering._lowering import user_inputs\n"
        "from pytest_backendconf.lowering import _preprocess\n"
        "from pytest_backendconf.suite import SuiteContext\n"
    )
    names = private_names(ast.parse(text), "pytest_backendconf.conformance.ops", False)
    assert reach_ins({"pytest_backendconf.conformance.ops": names}, packages) == [
        "pytest_backendconf.conformance.ops -> pytest_backendconf.lowering._lowering",
        "pytest_backendconf.conformance.ops -> pytest_backendconf.lowering._lowering.user_inputs",
        "pytest_backendconf.conformance.ops -> pytest_backendconf.lowering._preprocess",
        "pytest_backendconf.conformance.ops -> pytest_backendconf.suite._context",
        "pytest_backendconf.conformance.ops -> pytest_backendconf.suite._context.SuiteContext",
    ]
    backend = private_names(
        ast.parse("from pytest_backendconf import _compat\n"), "backendconf_executorch.lowering", False
    )
    assert reach_ins({"backendconf_executorch.lowering": backend}, packages) == [
        "backendconf_executorch.lowering -> pytest_backendconf._compat"
    ]
    # ... while a room's own private modules, relative imports inside it, and _compat inside the package are fine.
    own = private_names(
        ast.parse("from ._context import SuiteContext\nfrom .. import _compat\n"),
        "pytest_backendconf.suite._suite",
        False,
    )
    assert own == {
        "pytest_backendconf.suite._context",
        "pytest_backendconf.suite._context.SuiteContext",
        "pytest_backendconf._compat",
    }
    assert reach_ins({"pytest_backendconf.suite._suite": own}, packages) == []
    # The real tree, with one reach-in added to a real module, fails the check.
    imports, real_packages = private_imports()
    imports["backendconf_onnxruntime.exporter"] = imports["backendconf_onnxruntime.exporter"] | {
        "pytest_backendconf.registry._registry"
    }
    assert reach_ins(imports, real_packages) == [
        "backendconf_onnxruntime.exporter -> pytest_backendconf.registry._registry"
    ]


def benchmark_graph() -> dict[str, set[str]]:
    """The benchmark scripts' imports of each other (they import their siblings by file name)."""
    folder = ROOT / "benchmarks"
    scripts = {path.stem: path for path in folder.glob("*.py")}
    graph = {}
    for name, path in scripts.items():
        edges = _imports(ast.parse(path.read_text(encoding="utf-8")), name, False)
        graph[name] = {e.split(".")[0] for e in edges if e.split(".")[0] in scripts and e.split(".")[0] != name}
    return graph


def test_the_benchmarks_have_no_import_cycle() -> None:
    graph = benchmark_graph()
    assert {"run", "bench_peers", "bench_timing"} <= set(graph)
    cycle = find_cycle(graph)
    assert cycle is None, "import cycle between the benchmark scripts: " + " -> ".join(cycle)


def test_every_package_folder_is_installed() -> None:
    # A sub-package missing from pyproject's list works in an editable install and is absent from a wheel.
    import tomllib

    listed = set(tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["tool"]["setuptools"]["packages"])
    folders = {
        name for name, path in package_modules().items() if path.name == "__init__.py" and "tests" not in path.parts
    }
    assert folders == listed, f"pyproject.toml's packages differ from the package folders: {sorted(folders ^ listed)}"


def test_conformance_keeps_its_families_in_sub_packages() -> None:
    # A family of modules (ops, torchscript, serialization, ...) is a sub-package, not a name prefix.
    flat = sorted(path.name for path in (ROOT / "conformance").glob("*.py"))
    assert len(flat) <= 16, f"conformance/ has {len(flat)} flat modules: {flat}"
    assert not [name for name in flat if name.startswith(("_ops_", "_ts_"))], flat
