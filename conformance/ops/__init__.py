"""The ops category: every ATen overload of the shipped samples, lowered alone, against eager.

Owns the samples (``discovery``, also the command that makes them:
``python -m pytest_backendconf.conformance.ops.discovery``), the one-op
programs, the judgement of an op's outputs (ties, in-place writes, long
samples) and the quantized-op checks. The ``quantized`` category and the
``rerun`` command use the names below.
"""

from . import discovery
from ._category import (
    WritesInPlace,
    checks,
    judge,
    names_in_default_selection,
    notice,
    prepare_samples,
    samples_record,
    samples_needed,
)
from ._long_samples import long_samples
from ._program import OpCall, build_program, op_call_class
from ._ties import InvalidIndices, settle_ties

__all__ = [
    "InvalidIndices",
    "OpCall",
    "WritesInPlace",
    "build_program",
    "checks",
    "discovery",
    "judge",
    "long_samples",
    "names_in_default_selection",
    "notice",
    "op_call_class",
    "prepare_samples",
    "samples_record",
    "samples_needed",
    "settle_ties",
]
