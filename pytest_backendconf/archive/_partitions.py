"""The partition layout of an archive (schema 1.1): partitioned methods and their fallback.

A method lowered with ``partition=`` has no ``blobs/<method>.bin``. Instead
(docs/archive-format.md, "Partitions")::

    blobs/<method>.partition<k>.bin     stored  the backend's blob of delegated partition k
    fallback/<method>.fallback<k>.bin   stored  reference-interpreter bytecode of fallback segment k

and the manifest's ``partitions`` field holds, per partitioned method, its
plan (values, steps, outputs, which nodes each partition runs) and the
compile spec each partition's ``preprocess`` got. ``op_nodes`` lists the op
nodes of each whole-method lowering, for `delegation`. Archives of schema
1.0 have neither field and load as before.
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING, Any, Callable, Mapping

from ..errors import ArchiveEntryError, ArchiveManifestError

if TYPE_CHECKING:
    from ..lowering import LoweredModule
    from ._manifest import Archive
    from ._plan import Delegation, Plan

PARTITION_BLOB = re.compile(r"blobs/([A-Za-z][A-Za-z0-9_]*)\.(partition[0-9]+)\.bin\Z")
FALLBACK_BLOB = re.compile(r"fallback/([A-Za-z][A-Za-z0-9_]*)\.(fallback[0-9]+)\.bin\Z")
_REWRITE = "lower the model and save it again with pytest_backendconf.save"


def is_partition_entry(name: str) -> bool:
    return bool(PARTITION_BLOB.match(name) or FALLBACK_BLOB.match(name))


def write(core: LoweredModule) -> tuple[dict[str, Any], dict[str, bytes]]:
    """The manifest fields and the entries of ``core``'s partitions (empty for whole methods)."""
    fields: dict[str, Any] = {}
    entries: dict[str, bytes] = {}
    if core.whole_method_nodes:
        fields["op_nodes"] = {m: list(nodes) for m, nodes in core.whole_method_nodes.items()}
    if core.plans:
        fields["partitions"] = {
            method: {
                "plan": plan.to_json(),
                "compile_specs": {
                    key: core.partition_specs[key] for key in plan.blob_keys if key in core.partition_specs
                },
            }
            for method, plan in core.plans.items()
        }
        for key, blob in core.blobs.items():
            if key not in core.methods:
                entries[f"blobs/{key}.bin"] = bytes(blob)
        for key, blob in core.fallback_blobs.items():
            entries[f"fallback/{key}.bin"] = bytes(blob)
    return fields, entries


class Partitions:
    """What an archive says about partitions, checked against its entries."""

    def __init__(self) -> None:
        self.plans: dict[str, Plan] = {}
        self.compile_specs: dict[str, dict] = {}
        self.delegated_blobs: dict[str, bytes] = {}
        self.fallback_blobs: dict[str, bytes] = {}
        self.op_nodes: dict[str, tuple[str, ...]] = {}

    @property
    def methods(self) -> set[str]:
        return set(self.plans)

    def apply(self, lowered: LoweredModule) -> None:
        lowered.whole_method_nodes.update(self.op_nodes)
        for method, plan in self.plans.items():
            specs = {k: v for k, v in self.compile_specs.items() if k.split(".")[0] == method}
            fallbacks = {k: v for k, v in self.fallback_blobs.items() if k.split(".")[0] == method}
            lowered.add_plan(method, plan, specs, fallbacks)


def read(
    manifest: Mapping[str, Any], contents: Mapping[str, bytes], methods: set[str], where: Callable[[str], str]
) -> Partitions:
    """Check the manifest's partition fields and collect the partition entries.

    :param where: ``where(entry)`` → "archive 'x', entry 'y'", for messages.
    """
    from ._plan import Plan

    found = Partitions()
    op_nodes = manifest.get("op_nodes", {})
    if not isinstance(op_nodes, dict) or not all(
        m in methods and isinstance(v, list) and all(isinstance(n, str) for n in v) for m, v in op_nodes.items()
    ):
        raise ArchiveManifestError(
            f"{where('manifest.json')}: op_nodes must map lowered methods to lists of node names; {_REWRITE}"
        )
    found.op_nodes = {m: tuple(v) for m, v in op_nodes.items()}
    partitions = manifest.get("partitions", {})
    if not isinstance(partitions, dict):
        raise ArchiveManifestError(f"{where('manifest.json')}: partitions must be an object; {_REWRITE}")
    for method, record in partitions.items():
        if method not in methods:
            raise ArchiveManifestError(
                f"{where('manifest.json')}: partitions names method {method!r}, which methods does not list; {_REWRITE}"
            )
        if not isinstance(record, dict) or not isinstance(record.get("compile_specs"), dict):
            raise ArchiveManifestError(
                f"{where('manifest.json')}: partitions[{method!r}] must have a plan and compile_specs; {_REWRITE}"
            )
        try:
            plan = Plan.from_json(record["plan"])
        except (KeyError, TypeError, ValueError) as exc:
            raise ArchiveManifestError(
                f"{where('manifest.json')}: the plan of method {method!r} is malformed: {exc}; {_REWRITE}"
            ) from None
        for step in plan.steps:
            if step.key.split(".")[0] != method:
                raise ArchiveManifestError(
                    f"{where('manifest.json')}: method {method!r} runs step {step.key!r} of another method; {_REWRITE}"
                )
            entry = f"{'blobs' if step.delegated else 'fallback'}/{step.key}.bin"
            if entry not in contents:
                raise ArchiveEntryError(f"{where(entry)}: the blob of {step.key!r} is missing; {_REWRITE}")
            if step.delegated:
                found.delegated_blobs[step.key] = contents[entry]
                spec = record["compile_specs"].get(step.key)
                if not isinstance(spec, dict):
                    raise ArchiveManifestError(
                        f"{where('manifest.json')}: no compile spec for partition {step.key!r}; {_REWRITE}"
                    )
                found.compile_specs[step.key] = spec
            else:
                found.fallback_blobs[step.key] = contents[entry]
        found.plans[method] = plan
    used = {f"blobs/{k}.bin" for k in found.delegated_blobs} | {f"fallback/{k}.bin" for k in found.fallback_blobs}
    for name in contents:
        if is_partition_entry(name) and name not in used:
            raise ArchiveEntryError(f"{where(name)}: no partition of manifest.json refers to it; {_REWRITE}")
    return found


def delegation(archive: Archive) -> dict[str, Delegation]:
    """`bc.delegation` of an archive's module, read without a backend (for `backendconf inspect`)."""
    from ._plan import Delegation

    found = archive.partitions or Partitions()
    out: dict[str, Delegation] = {}
    for method in archive.methods:
        if method in found.plans:
            out[method] = found.plans[method].delegation
            continue
        nodes = found.op_nodes.get(method)
        if nodes is None:  # schema 1.0: the op nodes from the debug info
            nodes = tuple(
                info.node
                for _, info in sorted(archive.debug.items())
                if info.method == method and info.op not in ("placeholder", "output", "get_attr")
            )
        out[method] = Delegation(1, nodes, (), (nodes,))
    return out
