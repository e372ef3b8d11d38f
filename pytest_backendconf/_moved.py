"""The old import paths of modules and names that moved: each still imports, for one more minor release,
with a `DeprecationWarning` naming its new home.

The facade installs `MovedFinder` on ``sys.meta_path``; it answers only for the module names in the
tables below (which no file defines any more), and for any other name costs a dictionary lookup. CHANGELOG.md lists each old path and the release that removes it.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import sys
import types
import warnings
from typing import Any

#: Modules that moved whole: old name -> new name. A submodule follows its package
#: (``pytest_backendconf._reference.ops`` is ``pytest_backendconf.reference.ops``).
MOVED_MODULES = {
    "pytest_backendconf._reference": "pytest_backendconf.reference",
    "pytest_backendconf.conformance.backend_versions": "pytest_backendconf.conformance.serialization.backend_versions",
    "pytest_backendconf.conformance.debug_apart": "pytest_backendconf.conformance.symbolication.debug_apart",
    # Also a command: `python -m pytest_backendconf.conformance._ops_discovery` runs the new one (`get_code`).
    "pytest_backendconf.conformance._ops_discovery": "pytest_backendconf.conformance.ops.discovery",
}
#: Modules that are gone, whose public names live on elsewhere: old module -> {name: its new module}.
MOVED_NAMES = {
    "pytest_backendconf._versions": {
        "same_major_not_newer": "pytest_backendconf.backend",
        "release": "pytest_backendconf.backend",
    },
    "pytest_backendconf._lowering": {
        "to_backend": "pytest_backendconf",
        "user_inputs": "pytest_backendconf.lowering",
        "user_outputs": "pytest_backendconf.lowering",
    },
    "pytest_backendconf._target": {"run_on_target": "pytest_backendconf"},
}
#: When the old paths go.
REMOVED_IN = "0.3"


def warn_moved(old: str, new: str, skip: int = 0) -> None:
    """The one warning every old path gives, attributed to the code that imported it.

    :param skip: frames of the caller's own to pass over (a shim's ``__getattr__`` or module body: 1).
    """
    warnings.warn(
        f"{old} moved to {new}; import it from there (the old path goes in pytest-backendconf {REMOVED_IN})",
        DeprecationWarning,
        stacklevel=_outside_the_import_system() + skip,
    )


def _outside_the_import_system() -> int:
    """The stack level of warn_moved's first caller outside this module.

    `warnings` itself skips importlib's bootstrap frames when it counts levels; only the others count.
    """
    frame: types.FrameType | None = sys._getframe(2)  # warn_moved's caller
    level = 2
    while frame is not None:
        filename = frame.f_code.co_filename
        internal = "importlib" in filename and "_bootstrap" in filename
        if not internal and filename != __file__:
            break
        level += not internal
        frame = frame.f_back
    return level


class _Moved(importlib.abc.Loader):
    """Loads an old name: the new module itself, or a module whose moved names resolve on first use."""

    def __init__(self, old: str) -> None:
        self.old = old
        self.spec: importlib.machinery.ModuleSpec | None = None

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> types.ModuleType | None:
        new = _new_name(self.old)
        if new is not None:
            warn_moved(self.old, new)
            module = importlib.import_module(new)
            self.spec = module.__spec__  # the import system sets the old name's spec on it: undone below
            return module
        return None  # the default: a new, empty module, filled by exec_module

    def exec_module(self, module: types.ModuleType) -> None:
        if self.spec is not None:  # the new module itself: keep its own spec, run nothing
            module.__spec__ = self.spec
            return
        names = MOVED_NAMES[self.old]
        old = self.old

        def __getattr__(name: str) -> Any:
            home = names.get(name)
            if home is None:
                raise AttributeError(f"module {old!r} has no attribute {name!r} (the module is gone)")
            warn_moved(f"{old}.{name}", f"{home}.{name}")
            return getattr(importlib.import_module(home), name)

        module.__getattr__ = __getattr__  # type: ignore[method-assign]
        module.__all__ = sorted(names)  # type: ignore[attr-defined]

    def get_code(self, fullname: str) -> types.CodeType:
        """What ``python -m OLD`` runs (runpy asks the loader for code): the new module's ``main()``."""
        new = _new_name(fullname)
        if new is None or not callable(getattr(importlib.import_module(new), "main", None)):
            raise ImportError(f"{fullname} is gone and was no command; see CHANGELOG.md for its new home")
        warn_moved(fullname, new)
        # runpy put the old spec's origin (none) in argv[0]: the command names its own file.
        text = f"import sys, {new}\nsys.argv[0] = {new}.__file__\nsys.exit({new}.main())"
        return compile(text, f"<{fullname}>", "exec")


def _new_name(old: str) -> str | None:
    """The new name of a module that moved whole, or of a submodule of one."""
    for before, after in MOVED_MODULES.items():
        if old == before or old.startswith(before + "."):
            return after + old[len(before) :]
    return None


class MovedFinder(importlib.abc.MetaPathFinder):
    """Finds the old names of `MOVED_MODULES` and `MOVED_NAMES`, and nothing else."""

    def find_spec(self, fullname: str, path: Any = None, target: Any = None) -> importlib.machinery.ModuleSpec | None:
        if fullname not in MOVED_NAMES and _new_name(fullname) is None:
            return None
        return importlib.machinery.ModuleSpec(fullname, _Moved(fullname))


def install() -> None:
    """Put `MovedFinder` first on ``sys.meta_path``, once.

    First: an old package's submodule (``pytest_backendconf._reference.ops``) would otherwise be found
    as a file in the new package's folder and run a second time under the old name.
    """
    if not any(isinstance(finder, MovedFinder) for finder in sys.meta_path):
        sys.meta_path.insert(0, MovedFinder())
