"""Run the conformance suite with pytester against a backend class from one of tests/' modules."""

from __future__ import annotations

import re
from pathlib import Path
from types import ModuleType

TESTS_DIR = Path(__file__).parent

CONFTEST = """
import sys
sys.path.insert(0, {tests!r})
from {module} import {cls}

def backendconf_register_backends(register):
    register({cls}())
"""


def run_with(pytester, module: ModuleType | None, cls: str | None, select: list[str]):
    """The suite's run against ``module.cls`` registered by a conftest (``None``: the reference backend)."""
    name = "reference"
    if module is not None and cls is not None:
        pytester.makeconftest(CONFTEST.format(tests=str(TESTS_DIR), module=module.__name__, cls=cls))
        name = getattr(module, cls).name
    return pytester.runpytest(
        f"--backend={name}", "-p", "no:cacheprovider", "-rfs", *(f"--backendconf-select={s}" for s in select)
    )


def failed_ids(result) -> set[str]:
    return {m.group(1) for m in re.finditer(r"^FAILED (backendconf::\S+?)(?: - .*)?$", result.stdout.str(), re.M)}
