"""`CheckContext`: what the check machinery reads of the session a check runs in.

A check's ``run`` gets the whole session (``suite.SuiteContext``: models, exports, lowerings), which
imports torch and so cannot be named in this room. The machinery around checks (`run_check`, the
subject a dying backend host names, the minimiser's choice of program) reads only what this
protocol names; ``SuiteContext`` satisfies it structurally, and a `Check` is generic in the
context its ``run`` takes, bounded by it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Mapping, Protocol, TypeVar

if TYPE_CHECKING:
    from ..cases import ModelCase


class CheckContext(Protocol):
    """The backend under test by name, the model cases by name, and the dtypes each runs in."""

    @property
    def name(self) -> str:
        """The backend's registered name."""
        ...

    @property
    def cases(self) -> Mapping[str, ModelCase]:
        """Every model case of the session, by name."""
        ...

    def dtypes_for(self, case: ModelCase) -> list[str]:
        """The dtype ids ``case`` runs in with this backend."""
        ...

    def first_dtype(self, case_name: str) -> str | None:
        """The dtype a per-model check of ``case_name`` uses (None: unknown case, or no dtype runs)."""
        ...


#: The context a check's ``run`` takes: the suite's own, or a test's stand-in.
ContextT = TypeVar("ContextT", bound=CheckContext)
