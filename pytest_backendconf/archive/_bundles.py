"""Bundled inputs (schema 1.4): inputs to run a lowered method on, eager's expected outputs, the tolerance.

An archive saved with ``save(..., bundled_inputs=...)`` carries, per method,
a list of bundles (docs/archive-format.md, "Bundled inputs")::

    bundles.json       stored  {"methods": {method: [bundle, ...]}, "tensors": [{"dtype", "shape"}, ...]}
    bundles/<n>.bin    stored  raw little-endian bytes of tensor n

where a bundle is ``{"inputs": value, "expected": value, "rtol": float,
"atol": float, "tolerance": str, "check": str or null}``: the positional
inputs (a tuple) and the expected outputs in the value encoding of
`_tensor_codec`, the tolerance to hold the outputs to and where it came
from, and the conformance check that wrote it (golden folders). Like every
entry, both are covered by the manifest's SHA-256, so a changed expected
output is refused as a damaged archive. Nothing in them is ever run.

This module reads and writes records only and never imports torch at
import time; `Bundles.decode` builds tensors (with ``torch.frombuffer``).
"""

from __future__ import annotations

import dataclasses
import json
import math
import re
from typing import Any, Callable, Mapping, Sequence

from ._checks import REWRITE as _REWRITE
from ._checks import kind as _kind
from ._checks import short as _short
from ._tensor_codec import (
    ValueEncoder,
    check_tensor_meta,
    check_value,
    decode_value,
    tensor_entries,
    tensor_from_checked,
)
from ..errors import ArchiveEntryError, ArchiveError, ArchiveManifestError

BUNDLES = "bundles.json"
BUNDLE_TENSOR = re.compile(r"bundles/(0|[1-9][0-9]{0,8})\.bin\Z")
#: The schema an archive with bundles is written as; archives without keep their version.
BUNDLE_SCHEMA = (1, 4)
_FIELDS = frozenset({"inputs", "expected", "rtol", "atol", "tolerance", "check"})


@dataclasses.dataclass(frozen=True)
class Bundle:
    """One bundled input of a method: what to call it with, what it must return, and how close.

    ``inputs`` is the tuple of positional arguments; ``expected`` the
    outputs eager PyTorch returned for them on the host; a backend's output
    ``a`` matches an expected ``e`` when ``|a - e| <= atol + rtol * |e|``
    element-wise (integer and boolean outputs exactly). ``tolerance`` says
    where ``rtol``/``atol`` came from; ``check`` names the conformance check
    that wrote the bundle (golden folders), else ``None``.
    """

    inputs: tuple
    expected: object
    rtol: float
    atol: float
    tolerance: str = "given to save()"
    check: str | None = None


def is_bundle_entry(name: str) -> bool:
    return name == BUNDLES or bool(BUNDLE_TENSOR.match(name))


def encode_bundles(bundles: Mapping[str, Sequence[Bundle]], methods: Sequence[str]) -> dict[str, bytes]:
    """The entries of ``bundles`` (``{method: [Bundle, ...]}``); an `ArchiveError` names a bad one."""
    encoder = ValueEncoder()
    document: dict[str, Any] = {}
    for method, items in bundles.items():
        if method not in methods:
            raise ArchiveError(
                f"bundled_inputs names method {method!r}, which the lowered module does not have "
                f"(its methods: {', '.join(methods)})"
            )
        records = []
        for i, bundle in enumerate(items):
            where = f"bundled_inputs[{method!r}][{i}]"
            if not isinstance(bundle, Bundle):
                raise ArchiveError(f"{where} is a {type(bundle).__name__}, not a Bundle")
            if not isinstance(bundle.inputs, tuple):
                raise ArchiveError(f"{where}: inputs must be a tuple of positional arguments")
            for name in ("rtol", "atol"):
                value = getattr(bundle, name)
                if type(value) not in (int, float) or not math.isfinite(value) or value < 0:
                    raise ArchiveError(f"{where}: {name} must be a finite number >= 0, got {value!r}")
            records.append(
                {
                    "inputs": encoder.encode(bundle.inputs, f"{where}, inputs"),
                    "expected": encoder.encode(bundle.expected, f"{where}, expected outputs"),
                    "rtol": float(bundle.rtol),
                    "atol": float(bundle.atol),
                    "tolerance": str(bundle.tolerance),
                    "check": None if bundle.check is None else str(bundle.check),
                }
            )
        if records:
            document[method] = records
    if not document:
        return {}
    text = json.dumps({"methods": document, "tensors": encoder.meta}, separators=(",", ":"), ensure_ascii=True)
    entries = {BUNDLES: text.encode("ascii")}
    for i, data in enumerate(encoder.data):
        entries[f"bundles/{i}.bin"] = data
    return entries


@dataclasses.dataclass(frozen=True, eq=False)
class Bundles:
    """The verified bundles of an archive: records and tensor bytes, decoded on demand."""

    records: dict[str, list[dict[str, Any]]]
    tensor_meta: list[dict[str, Any]]
    tensor_bytes: list[bytes]
    where: str

    def methods(self) -> list[str]:
        return list(self.records)

    def sizes(self) -> dict[str, tuple[int, int]]:
        """``{method: (bundles, bytes of their tensors)}``."""
        out = {}
        for method, records in self.records.items():
            used: set[int] = set()
            for record in records:
                used |= _tensor_indices(record["inputs"]) | _tensor_indices(record["expected"])
            out[method] = (len(records), sum(len(self.tensor_bytes[i]) for i in used))
        return out

    def decode(self, method: str) -> list[Bundle]:
        """The bundles of ``method`` with their tensors (needs torch)."""
        tensors = [
            tensor_from_checked(data, meta, f"{self.where}, tensor {i}")
            for i, (meta, data) in enumerate(zip(self.tensor_meta, self.tensor_bytes))
        ]
        return [
            Bundle(
                inputs=decode_value(r["inputs"], tensors, self.where),
                expected=decode_value(r["expected"], tensors, self.where),
                rtol=r["rtol"],
                atol=r["atol"],
                tolerance=r["tolerance"],
                check=r["check"],
            )
            for r in self.records.get(method, [])
        ]

    def input_dtypes(self, method: str, index: int) -> list[str]:
        """The dtypes of the tensors among bundle ``index``'s inputs (torch-free)."""
        found = sorted(_tensor_indices(self.records[method][index]["inputs"]))
        return list(dict.fromkeys(self.tensor_meta[i]["dtype"] for i in found))

    def entries(self) -> dict[str, bytes]:
        """The archive entries these bundles were read from (what a re-save writes back)."""
        document = {
            "methods": self.records,
            "tensors": [{"dtype": m["dtype"], "shape": m["shape"]} for m in self.tensor_meta],
        }
        entries = {BUNDLES: json.dumps(document, separators=(",", ":"), ensure_ascii=True).encode("ascii")}
        for i, data in enumerate(self.tensor_bytes):
            entries[f"bundles/{i}.bin"] = data
        return entries


def read_bundles(
    document: object,
    contents: Mapping[str, bytes],
    methods: set[str],
    version: tuple[int, int],
    where: Callable[[str], str],
) -> Bundles | None:
    """Check ``bundles.json`` (already parsed, or None when absent) against the entries; None without bundles."""
    names = [n for n in contents if BUNDLE_TENSOR.match(n)]
    if document is None:
        if names:
            raise ArchiveEntryError(f"{where(names[0])}: a bundle tensor, but the archive has no {BUNDLES}; {_REWRITE}")
        return None
    here = where(BUNDLES)
    if version < BUNDLE_SCHEMA:
        raise ArchiveEntryError(
            f"{here}: bundled inputs are schema {BUNDLE_SCHEMA[0]}.{BUNDLE_SCHEMA[1]}, but the archive says "
            f"{version[0]}.{version[1]}; {_REWRITE}"
        )

    def bad(what: str) -> ArchiveManifestError:
        return ArchiveManifestError(f"{here}: {what}; {_REWRITE}")

    if not isinstance(document, dict) or set(document) != {"methods", "tensors"}:
        raise bad(f'must be {{"methods": {{...}}, "tensors": [...]}}, got {_kind(document)}')
    records, tensors = document["methods"], document["tensors"]
    if not isinstance(records, dict) or not isinstance(tensors, list):
        raise bad("must have an object 'methods' and a list 'tensors'")
    metas = [check_tensor_meta(meta, f"{here}, tensors[{i}]") for i, meta in enumerate(tensors)]
    for method, items in records.items():
        if method not in methods:
            raise bad(f"has bundles for method {_short(method)}, which the manifest does not list")
        if not isinstance(items, list) or not items:
            raise bad(f"methods[{method!r}] must be a non-empty list of bundles")
        for i, record in enumerate(items):
            at = f"{here}, bundle {method}[{i}]"
            if not isinstance(record, dict) or set(record) != _FIELDS:
                raise ArchiveManifestError(f"{at}: must have exactly the fields {sorted(_FIELDS)}; {_REWRITE}")
            inputs = record["inputs"]
            if not (isinstance(inputs, dict) and set(inputs) == {"tuple"}):
                raise ArchiveManifestError(f"{at}: inputs must be an encoded tuple; {_REWRITE}")
            check_value(inputs, len(metas), f"{at}, inputs")
            check_value(record["expected"], len(metas), f"{at}, expected outputs")
            for name in ("rtol", "atol"):
                value = record[name]
                if type(value) not in (int, float) or not math.isfinite(value) or value < 0:
                    raise ArchiveManifestError(f"{at}: {name} must be a number >= 0, got {_short(value)}; {_REWRITE}")
            if not isinstance(record["tolerance"], str) or not (
                record["check"] is None or isinstance(record["check"], str)
            ):
                raise ArchiveManifestError(f"{at}: tolerance must be a string and check a string or null; {_REWRITE}")
    tensor_bytes = tensor_entries(metas, contents, "bundles", BUNDLES, names, where)
    return Bundles({m: list(v) for m, v in records.items()}, metas, tensor_bytes, here)


def _tensor_indices(tree: object) -> set[int]:
    found: set[int] = set()
    stack = [tree]
    while stack:
        node = stack.pop()
        if isinstance(node, list):
            stack.extend(node)
        elif isinstance(node, dict):
            ((tag, body),) = node.items()
            if tag == "tensor":
                found.add(body)
            elif tag in ("tuple", "dict"):
                stack.append(body)
    return found
