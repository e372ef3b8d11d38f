"""serialization, backend versions: an archive from a far-future backend release is refused cleanly, or works.

The saved archive's manifest is rewritten to record a backend version no
release has yet (``FUTURE_VERSION``); every other byte stays. Loading it must
either raise `ArchiveVersionError` naming both versions (the backend's
``accepts_blob_version`` said no), or give a module whose outputs equal the
original's (the backend accepts it). Anything else — a crash inside
``compile``, a contract error from ``accepts_blob_version``, different
outputs — fails (docs/writing-a-backend.md, "Versions").
"""

from __future__ import annotations

import functools
import io
import json
import zipfile
from typing import TYPE_CHECKING, Any, Iterator

import pytest_backendconf as bc
from pytest_backendconf.archive import MANIFEST, pack
from pytest_backendconf.checks import Check, fail
from pytest_backendconf.archive import declared_version
from pytest_backendconf.errors import ArchiveVersionError

from .._session_work import same_outputs
from .._spec import section

if TYPE_CHECKING:
    from pytest_backendconf.suite import SuiteContext

FUTURE_VERSION = "9999.0.0"


def checks(ctx: SuiteContext, saved: Any, call: Any) -> Iterator[Check]:
    """:param saved: the serialization category's ``_saved(ctx, case, dtype)`` (its shared archive and
    outputs); ``call``: its ``call_fresh(function, args, kwargs)`` (fresh inputs for every call)."""
    for case in section("serialization").get("version_cases", []):
        dtype = ctx.first_dtype(case) if case in ctx.cases else None
        if dtype is not None:
            yield Check(
                "serialization",
                f"future_backend_version[{case}]",
                functools.partial(check_future_backend_version, case=case, dtype=dtype, saved=saved, call=call),
                stage="load",
                case=case,
            )


def with_backend_version(data: bytes, version: str) -> bytes:
    """The archive ``data`` with its manifest recording backend ``version`` (every entry kept)."""
    with zipfile.ZipFile(io.BytesIO(data)) as z:
        entries = [(info.filename, z.read(info)) for info in z.infolist()]
    manifest = json.loads(entries[0][1])
    manifest["backend"]["version"] = version
    text = json.dumps(manifest, indent=1, ensure_ascii=True, allow_nan=False).encode("ascii")
    return pack([(MANIFEST, text)] + entries[1:])


def check_future_backend_version(ctx: SuiteContext, *, case: str, dtype: str, saved: Any, call: Any) -> None:
    original = saved(ctx, case, dtype)
    future = with_backend_version(original.data, FUTURE_VERSION)
    ours = declared_version(ctx.registered.backend, ctx.registered.source.version)
    try:
        loaded = bc.load(future)
    except ArchiveVersionError as exc:
        text = str(exc)
        missing = [v for v in (FUTURE_VERSION, ours) if v and v not in text]
        if missing:
            fail(
                f"{case} ({dtype}): loading an archive written by backend version {FUTURE_VERSION} was "
                f"refused, but the message does not name version(s) {', '.join(missing)}: {text}"
            )
        return
    except Exception as exc:
        fail(
            f"{case} ({dtype}): loading an archive written by backend version {FUTURE_VERSION} (this "
            f"backend: {ours or 'no version declared'}) raised {type(exc).__name__}: {exc}\nA backend "
            "that cannot read blobs of another release should say so from accepts_blob_version(version) "
            "-> bool, so that load refuses the archive naming both versions, before compile() sees a blob."
        )
    for method, examples in original.calls.items():
        for (args, kwargs), expected in zip(examples, original.outputs[method]):
            try:
                got = call(getattr(loaded, method), args, kwargs)
            except Exception as exc:
                fail(
                    f"{case}.{method} ({dtype}): the backend accepted an archive of backend version "
                    f"{FUTURE_VERSION}, then running it raised {type(exc).__name__}: {exc}; refuse such "
                    "archives from accepts_blob_version(version)"
                )
            problem = same_outputs(got, expected)
            if problem:
                fail(
                    f"{case}.{method} ({dtype}): the backend accepted an archive of backend version "
                    f"{FUTURE_VERSION}, but its outputs differ from the original's:\n{problem}"
                )
