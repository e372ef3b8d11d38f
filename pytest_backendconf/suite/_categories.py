"""The category modules of the suite, and every check they generate.

Below both the pytest side (`_suite`) and the backend host (`_host`), which
generate the same checks in their two processes and must agree on them.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ..backend import TorchScriptBackend
from ..checks import CATEGORIES, Check
from ..conformance import (
    availability,
    contract,
    delegation,
    ops,
    parity,
    quantized,
    reliability,
    serialization,
    stateful,
    symbolication,
)

if TYPE_CHECKING:
    from ._context import SuiteContext

#: The module of each category: it yields the category's `Check` records from ``checks(ctx)``.
CATEGORY_MODULES = {
    "contract": contract,
    "parity": parity,
    "availability": availability,
    "serialization": serialization,
    "symbolication": symbolication,
    "reliability": reliability,
    "delegation": delegation,
    "ops": ops,
    "quantized": quantized,
    "stateful": stateful,
}
assert tuple(CATEGORY_MODULES) == CATEGORIES, "a category needs its module here and its name in _check.CATEGORIES"


def generate_checks(ctx: SuiteContext) -> list[Check]:
    """Every check of every category for the context's backend, in a stable order.

    A `TorchScriptBackend` gets the suite's TorchScript form (``conformance/torchscript/``).
    """
    if isinstance(ctx.backend, TorchScriptBackend):
        from ..conformance import torchscript

        return list(torchscript.checks(ctx))
    found: list[Check] = []
    for module in CATEGORY_MODULES.values():
        found.extend(module.checks(ctx))
    return found
