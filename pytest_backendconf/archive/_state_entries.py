"""A lowered module's state in the archive: the manifest's ``state`` list and ``state/<i>.bin`` entries.

An archive of a module with state (docs/archive-format.md, "State") stores
each state buffer's initial value, as exported, never the value of a module
that has run: a loaded module starts from the initial state. It is written
with schema 2.0, a new major, because a reader of 1.x would ignore the state
and hand the backend too few inputs; every other archive keeps its 1.x
schema, and 1.x archives still load.
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING, Any, Callable, Mapping

from ._checks import REWRITE as _REWRITE
from ._checks import kind as _kind
from ._checks import short as _short
from ._tensor_codec import check_tensor_meta, encode_tensor, tensor_entries, tensor_from_checked
from ..errors import ArchiveEntryError, ArchiveManifestError

if TYPE_CHECKING:
    import torch

    from ._method_spec import MethodSpec

#: The schema an archive with state is written with (a 1.x reader must refuse it, not ignore it).
STATE_SCHEMA = (2, 0)
STATE_ENTRY = re.compile(r"state/(0|[1-9][0-9]{0,8})\.bin\Z")
_FQN = re.compile(r"[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z0-9_]+)*\Z")


def is_state_entry(name: str) -> bool:
    return STATE_ENTRY.match(name) is not None


def write_state(initial: Mapping[str, torch.Tensor]) -> tuple[dict[str, Any], dict[str, bytes]]:
    """The manifest field and the entries of a module's initial state (nothing for a module without)."""
    if not initial:
        return {}, {}
    records, entries = [], {}
    for i, (fqn, value) in enumerate(sorted(initial.items())):
        meta, data = encode_tensor(value, f"state {fqn!r}")
        records.append({"fqn": fqn, **meta})
        entries[f"state/{i}.bin"] = data
    return {"state": records}, entries


def read_state(
    manifest: dict,
    contents: Mapping[str, bytes],
    methods: Mapping[str, MethodSpec],
    version: tuple[int, int],
    where: Callable[[str], str],
) -> dict[str, torch.Tensor]:
    """The initial state an archive stores, checked against its methods' state specs."""
    from ._zip import MANIFEST

    here = where(MANIFEST)
    records = manifest.get("state")
    used = {s.fqn: (name, s) for name, spec in methods.items() for s in spec.state}
    if records is None:
        if used:
            raise ArchiveManifestError(
                f"{here}: method {used[next(iter(used))][0]!r} keeps state {next(iter(used))!r}, but the "
                f"manifest has no state; {_REWRITE}"
            )
        if any(is_state_entry(n) for n in contents):
            raise ArchiveEntryError(f"{here}: state entries without a state list; {_REWRITE}")
        return {}
    if version < STATE_SCHEMA:
        raise ArchiveManifestError(
            f"{here}: has state, which schema {version[0]}.{version[1]} does not have; {_REWRITE}"
        )
    if not isinstance(records, list) or not records:
        raise ArchiveManifestError(f"{here}: state must be a non-empty list, got {_kind(records)}; {_REWRITE}")
    metas, names = [], []
    for i, record in enumerate(records):
        if not isinstance(record, dict) or not isinstance(record.get("fqn"), str) or not _FQN.match(record["fqn"]):
            raise ArchiveManifestError(
                f"{here}: state[{i}] must be {{'fqn': buffer name, 'dtype', 'shape'}}, got {_short(record)}; {_REWRITE}"
            )
        metas.append(check_tensor_meta({k: v for k, v in record.items() if k != "fqn"}, f"{here}: state[{i}]"))
        names.append(record["fqn"])
    if len(set(names)) != len(names):
        raise ArchiveManifestError(f"{here}: state names a buffer twice; {_REWRITE}")
    data = tensor_entries(
        metas, contents, "state", f"{MANIFEST} state", [n for n in contents if is_state_entry(n)], where
    )
    state = {
        fqn: tensor_from_checked(d, m, where(f"state/{i}.bin")) for i, (fqn, d, m) in enumerate(zip(names, data, metas))
    }
    for fqn, (method, spec) in used.items():
        value = state.get(fqn)
        if value is None:
            raise ArchiveManifestError(
                f"{here}: method {method!r} keeps state {fqn!r}, which state does not store; {_REWRITE}"
            )
        if str(value.dtype).removeprefix("torch.") != spec.dtype or tuple(value.shape) != spec.shape:
            raise ArchiveManifestError(
                f"{here}: state {fqn!r} is stored as a {str(value.dtype).removeprefix('torch.')}"
                f"{list(value.shape)} tensor, but method {method!r} keeps it as {spec.dtype}{list(spec.shape)}; "
                f"{_REWRITE}"
            )
    unused = sorted(set(state) - set(used))
    if unused:
        raise ArchiveManifestError(f"{here}: state stores {unused}, which no method keeps; {_REWRITE}")
    return state
