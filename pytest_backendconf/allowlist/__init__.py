"""Names read from files, turned into torch objects only through allowlists: operators and dtypes.

Owns `resolve_operator` (an operator overload of the explicit allowlist in
``operators.txt``, or a custom operator the process registered; else
`OperatorRefusedError` naming it and where it came from) and the fixed tables
of dtypes, memory formats and layouts. Every blob, fallback segment, rerun
file and archive that names one goes through here.

May import: the public surface only (``_compat`` for torch's private names).
"""

from ._checks import ARGUMENT_CHECKS, argument_check
from ._operators import ALLOWED, CLOSED_NAMESPACES, RECORDED_RELEASES, TABLE_ONLY, absent_in
from ._names import (
    DTYPES,
    LAYOUTS,
    MAX_NAME,
    MEMORY_FORMATS,
    REFUSED_NAMESPACES,
    REFUSED_OPERATORS,
    UNANNOTATED_ALIASES,
    dtype_named,
    refusal_reason,
    resolve_operator,
    schema_named,
    written_arguments,
)

__all__ = [
    "ARGUMENT_CHECKS",
    "argument_check",
    "ALLOWED",
    "CLOSED_NAMESPACES",
    "RECORDED_RELEASES",
    "TABLE_ONLY",
    "absent_in",
    "DTYPES",
    "LAYOUTS",
    "MAX_NAME",
    "MEMORY_FORMATS",
    "REFUSED_NAMESPACES",
    "REFUSED_OPERATORS",
    "UNANNOTATED_ALIASES",
    "dtype_named",
    "refusal_reason",
    "resolve_operator",
    "schema_named",
    "written_arguments",
]
