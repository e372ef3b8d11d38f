"""symbolication, debug info apart: a handles-only archive tells nothing of the source; its .debug file tells all.

For each case of ``[symbolication] separate_cases``: the lowered module is
saved with ``debug_info="separate"``. The archive's bytes — the file as
written and every entry inflated, blobs included — must contain none of the
model's source lines, source file names or its own class names (the debug
info of the embedded form says which), and its ``.debug`` file must pair
with it and symbolicate every handle exactly as the embedded form does. A
backend that copies stack traces or source into its blob fails here.
"""

from __future__ import annotations

import functools
import io
import os
import zipfile
from typing import TYPE_CHECKING, Iterator

import torch

from pytest_backendconf import archive as _archive
from pytest_backendconf import lowering as _lowering
from pytest_backendconf.archive import PortablePaths
from pytest_backendconf.archive import check_pair, read_sidecar
from pytest_backendconf.checks import Check, Unsupported, fail
from pytest_backendconf.debuginfo import SymbolTable
from pytest_backendconf.errors import UnsupportedNodeError

from .._spec import section

if TYPE_CHECKING:
    from pytest_backendconf.suite import SuiteContext

#: Shorter source lines and class names (``N``, ``x``) occur in any bytes by chance.
MIN_LINE, MIN_NAME = 8, 4


def checks(ctx: SuiteContext) -> Iterator[Check]:
    for case in section("symbolication").get("separate_cases", ()):
        dtype = ctx.first_dtype(case) if case in ctx.cases else None
        if dtype is not None:
            yield Check(
                "symbolication",
                f"debug_info_apart[{case}]",
                functools.partial(check_debug_info_apart, case=case, dtype=dtype),
                stage="save",
                case=case,
                needs_available=False,
            )


def secrets(debug: dict) -> dict[str, str]:
    """``{text: what it is}`` that a handles-only archive must not contain, from embedded debug info."""
    found: dict[str, str] = {}
    portable = PortablePaths()
    for info in debug.values():
        for frame in info.frames:
            if frame.source and len(frame.source.strip()) >= MIN_LINE:
                found.setdefault(frame.source.strip(), f"source line {frame.file}:{frame.line}")
            if not frame.file.startswith("<"):
                found.setdefault(os.path.basename(frame.file), "source file name")
                found.setdefault(portable.relative(frame.file), "source file path")
        for _, cls in info.module_hierarchy:
            # torch.nn's own classes (Linear, Conv2d) are library names, not the model's.
            if len(cls) >= MIN_NAME and not hasattr(torch.nn, cls):
                found.setdefault(cls, "model class name")
    return found


def leaks(data: bytes, forbidden: dict[str, str]) -> list[str]:
    """Where each forbidden text occurs: in the file's bytes, or in an entry once inflated."""
    places = [("the archive file", data)]
    with zipfile.ZipFile(io.BytesIO(data)) as z:
        places += [(f"entry {info.filename!r}", z.read(info)) for info in z.infolist()]
    out = []
    for text, what in sorted(forbidden.items()):
        needle = text.encode("utf-8")
        where = [name for name, content in places if needle in content]
        if where:
            out.append(f"{what} {text!r} in {', '.join(where)}")
    return out


def check_debug_info_apart(ctx: SuiteContext, *, case: str, dtype: str) -> None:
    try:
        lowered = ctx.lower(case, dtype)
    except UnsupportedNodeError as exc:
        raise Unsupported.from_rejection(exc) from exc
    archive_bytes, sidecar_bytes = _lowering.to_bytes_separate(lowered)
    embedded = lowered.lowered.debug
    found = leaks(archive_bytes, secrets(embedded))
    if found:
        fail(
            f'{case} ({dtype}): the handles-only archive (save(..., debug_info="separate")) still holds '
            f"{len(found)} piece(s) of the model's source:\n  "
            + "\n  ".join(found[:12])
            + "\nA blob must carry debug handles only (no stack traces, file names or source text); "
            "the debug info belongs in the .debug file."
        )
    archive = _archive.read_archive(archive_bytes)
    sidecar = read_sidecar(sidecar_bytes, _archive.DEFAULT_LIMITS)
    check_pair(archive, sidecar)
    if set(archive.handles) != set(embedded):
        fail(
            f"{case} ({dtype}): the handles-only archive lists {len(archive.handles)} handles, the module has "
            f"{len(embedded)}"
        )
    apart, together = SymbolTable(sidecar.debug), SymbolTable(embedded)
    differing = [h for h in sorted(embedded) if apart.text(h) != together.text(h)]
    if differing:
        h = differing[0]
        fail(
            f"{case} ({dtype}): the .debug file symbolicates {len(differing)} handle(s) differently from the "
            f"embedded debug info; handle {h}:\n--- .debug file\n{apart.text(h)}\n--- embedded\n{together.text(h)}"
        )
