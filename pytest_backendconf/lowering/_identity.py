"""The backend's part of the preprocess cache's key: its code, its settings and the file that registered it.

Everything of the backend that may change a blob goes in (docs/backend-contract.md, "Caching
preprocess results"): its name and version, a hash of the files of the packages its class comes from,
its settings (what ``cache_identity()`` returns, else its attributes as plain data) and a hash of the
file that registered it (a conftest, a ``-p`` plugin module, an entry point's module), which may set
it up in ways its attributes do not show. When a part cannot be known, the backend is not cached and
`BackendIdentity.reason` says why and how to enable it.
"""

from __future__ import annotations

import dataclasses
import enum
import hashlib
import json
import sys
from pathlib import Path, PurePath
from typing import TYPE_CHECKING

import torch

if TYPE_CHECKING:
    from ..registry import Source

#: Where a backend that cannot be cached learns how to enable it.
_HOW = (
    "define cache_identity(self) -> str on the backend, returning every setting that changes a blob "
    '(docs/backend-contract.md, "Caching preprocess results")'
)


@dataclasses.dataclass(frozen=True)
class BackendIdentity:
    """The backend's part of every key (``text``), or None and why it is not cached (``reason``)."""

    text: str | None
    reason: str = ""


class _NoStableForm(Exception):
    """A value that is not the same text in every process (an object, a lock, a function)."""

    def __init__(self, where: str, value: object) -> None:
        super().__init__(where)
        self.where = where
        self.value = value


def backend_identity(backend: object, version: str | None, source: Source | None) -> BackendIdentity:
    """The identity of ``backend`` as registered by ``source`` (None: a backend object nobody registered).

    Computed once per cache, i.e. per run: the files are read once.
    """
    name = getattr(backend, "name", "?")
    cls = type(backend)
    files = backend_files_digest(cls)
    if files is None:
        return BackendIdentity(
            None,
            f"its class {cls.__module__}.{cls.__qualname__} has no file (defined in __main__ of python -c?), so an "
            "edit of it could not be seen; define the class in a module",
        )
    settings = backend_settings(backend)
    if settings.text is None:
        return settings
    registration = registration_digest(source)
    if registration.text is None:
        return registration
    parts = [name, version, f"{cls.__module__}.{cls.__qualname__}", files, settings.text, registration.text]
    return BackendIdentity(json.dumps(parts))


def backend_settings(backend: object) -> BackendIdentity:
    """What the backend's ``cache_identity()`` returns, else its attributes as plain data, as text."""
    hook = getattr(backend, "cache_identity", None)
    if callable(hook):
        try:
            declared = hook()
        except Exception as exc:
            return BackendIdentity(
                None, f"its cache_identity() raised {type(exc).__name__}: {exc}; make it return a str"
            )
        if declared is None:
            return BackendIdentity(None, "its cache_identity() returned None (never cache this backend)")
        if not isinstance(declared, str):
            return BackendIdentity(
                None,
                f"its cache_identity() returned {type(declared).__name__}, not a str; return a str naming every "
                "setting that changes a blob, or None never to cache",
            )
        return BackendIdentity(json.dumps({"cache_identity": declared}))
    try:
        state = {name: _stable(value, name, set()) for name, value in sorted(_attributes(backend).items())}
    except _NoStableForm as exc:
        what = f"{type(exc.value).__module__}.{type(exc.value).__qualname__}"
        return BackendIdentity(None, f"its attribute {exc.where} ({what}) has no stable form across processes; {_HOW}")
    return BackendIdentity(json.dumps({"attributes": state}, sort_keys=True))


def registration_digest(source: Source | None) -> BackendIdentity:
    """A hash of the bytes of the file that registered the backend ("" when no registry did)."""
    if source is None:
        return BackendIdentity("")
    if source.file is None:
        return BackendIdentity(
            None,
            f"it was registered by {source}, which has no file to hash (code typed into python -c or a notebook), "
            "so an edit of it could not be seen; register it from a conftest.py or a plugin module",
        )
    try:
        return BackendIdentity(hashlib.sha256(Path(source.file).read_bytes()).hexdigest())
    except OSError as exc:
        return BackendIdentity(
            None, f"the file that registered it, {source.file}, cannot be read ({exc.strerror or exc}) to hash it"
        )


def _attributes(obj: object) -> dict[str, object]:
    """``vars(obj)``, with the values of its ``__slots__`` too."""
    found = dict(getattr(obj, "__dict__", {}))
    for klass in type(obj).__mro__:
        slots = klass.__dict__.get("__slots__", ())
        for slot in [slots] if isinstance(slots, str) else slots:
            if slot not in ("__dict__", "__weakref__") and hasattr(obj, slot):
                found.setdefault(slot, getattr(obj, slot))
    return found


def _stable(value: object, where: str, active: set[int]) -> object:
    """``value`` as JSON data that is the same in every process, or `_NoStableForm` naming the part that is not.

    Plain data only: str, int, float, bool, None, bytes, enums, torch dtypes and devices, paths, and
    lists, tuples, sets, dicts and dataclasses of them; and an object with a ``cache_identity()`` of
    its own, as what that returns.
    """
    if isinstance(value, enum.Enum):
        return {"enum": f"{type(value).__module__}.{type(value).__qualname__}.{value.name}"}
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if isinstance(value, torch.dtype):
        return {"dtype": str(value)}
    if isinstance(value, torch.device):
        return {"device": str(value)}
    if isinstance(value, PurePath):
        return {"path": str(value)}
    if isinstance(value, bytes):
        return {"bytes": hashlib.sha256(value).hexdigest()}
    hook = getattr(type(value), "cache_identity", None)
    if callable(hook):  # a helper object that names its own settings (bc.AvailabilityProbe: none)
        declared = hook(value)
        if not isinstance(declared, str):
            raise _NoStableForm(where, value)
        return {"cache_identity": declared}
    if id(value) in active:
        raise _NoStableForm(where, value)  # it contains itself
    active.add(id(value))
    try:
        kind = f"{type(value).__module__}.{type(value).__qualname__}"
        if isinstance(value, (list, tuple)):
            return {kind: [_stable(v, f"{where}[{i}]", active) for i, v in enumerate(value)]}
        if isinstance(value, (set, frozenset)):
            items = [_stable(v, f"{where}{{...}}", active) for v in value]
            return {kind: sorted(items, key=lambda i: json.dumps(i, sort_keys=True))}
        if isinstance(value, dict):
            pairs = [
                [_stable(k, f"{where} key", active), _stable(v, f"{where}[{k!r}]", active)] for k, v in value.items()
            ]
            return {kind: sorted(pairs, key=lambda p: json.dumps(p[0], sort_keys=True))}
        if dataclasses.is_dataclass(value) and not isinstance(value, type):
            fields = dataclasses.fields(value)
            return {kind: {f.name: _stable(getattr(value, f.name), f"{where}.{f.name}", active) for f in fields}}
    finally:
        active.discard(id(value))
    raise _NoStableForm(where, value)


def backend_files_digest(cls: type) -> str | None:
    """A hash of the files of every package (or lone module) a class of the backend's MRO comes from.

    None when one of them has no file (defined in ``__main__`` of ``python -c``): such a backend
    is never cached, since an edit of it could not be seen. Where the packages are installed is not
    in it: the same files in another folder (another CI runner's checkout) give the same hash.
    """
    roots: set[str] = set()
    for klass in cls.__mro__:
        if klass.__module__ == "builtins":
            continue
        top = sys.modules.get(klass.__module__.split(".")[0])
        paths = list(getattr(top, "__path__", None) or []) or [getattr(top, "__file__", None)]
        if not paths or None in paths:
            return None
        roots.update(str(p) for p in paths)
    digests = []
    for root in roots:
        files = _files_digest(Path(root))
        if files is None:
            return None
        digests.append(files)  # the files' names below the root's folder are in it; not where it is installed
    return hashlib.sha256("\0".join(sorted(digests)).encode()).hexdigest()


def _files_digest(root: Path) -> str | None:
    digest = hashlib.sha256()
    try:
        files = [root] if root.is_file() else sorted(p for p in root.rglob("*") if p.is_file())
        for path in files:
            if "__pycache__" in path.parts or path.suffix == ".pyc":
                continue
            digest.update(f"{path.relative_to(root.parent)}\0".encode())
            digest.update(hashlib.sha256(path.read_bytes()).digest())
    except OSError:
        return None
    return digest.hexdigest()
