"""The archive's manifest: what it records, the verified `Archive`, and the reader that builds one.

``manifest.json`` names the format, the schema version, the backend, the
torch version, every method's `MethodSpec` and compile spec, and the size
and SHA-256 of every other entry. `ArchiveReader` verifies the whole file
(zip layout, every entry's size and hash, every JSON entry's shape) before
anything in it is used; docs/archive-format.md describes the layout.
"""

from __future__ import annotations

import dataclasses
import hashlib
import re
from typing import TYPE_CHECKING, Any

from ._bundles import BUNDLE_SCHEMA, BUNDLES, is_bundle_entry, read_bundles
from ._state_entries import STATE_SCHEMA, is_state_entry, read_state
from ._partitions import is_partition_entry
from ._partitions import read as read_partitions
from ._attributes import RESERVED_METHODS, check_attributes, restore_attributes
from . import _structure as structure
from ._checks import REWRITE as _REWRITE
from ._checks import field as _field
from ._checks import is_int as _is_int
from ._checks import kind as _kind
from ._checks import short as _short
from ._zip import _STORED, DEBUG, MANIFEST, ZipEntry, ZipReader, method_for
from ..debuginfo import DebugInfo
from ._debug_table import decode_debug
from ._limits import DEFAULT_LIMITS, Limits  # noqa: F401  (re-exported)
from ._method_spec import MethodSpec
from ._tensor_codec import tensor_entries, tensor_from_checked
from ._sidecar import SIDECAR_FORMAT, decode_handles, read_manifest_field
from ._versions import check_blob_version
from ..errors import (
    ArchiveBackendError,
    ArchiveChecksumError,
    ArchiveEntryError,
    ArchiveFormatError,
    ArchiveManifestError,
    ArchiveSizeError,
    ArchiveVersionError,
    RegistryError,
)

if TYPE_CHECKING:
    from ..backend import Backend
    from ..lowering import WrapperModule
    from ._partitions import Partitions

FORMAT_NAME = "backendconf-archive"
#: (major, minor): a reader loads any minor of its major; a new major is refused.
#: 1.1: partitioned methods (`_partitions`); 1.0 archives still load.
#: 1.2: method structures in the project's own JSON (`_structure`) instead of torch's treespec
#: strings; 1.0 and 1.1 strings are still read, by a parser that imports nothing.
#: 1.3: handles-only archives (`_sidecar`, ``save(..., debug_info="separate")``) are written with
#: 1.3; embedded ones keep 1.2, so that readers of 1.2 still read every embedded archive.
#: 1.4: bundled inputs (`_bundles`, ``save(..., bundled_inputs=...)``); only archives that carry
#: bundles are written with 1.4 (a 1.2 or 1.3 reader ignores the entries of a newer minor).
#: 2.0: state (`_state_entries`): only archives of a module with state are written with 2.0, a new
#: major because a 1.x reader must refuse them rather than run them without their state; this
#: reader reads 1.x and 2.x.
SCHEMA_VERSION = (1, 2)
#: The majors this reader reads.
READ_MAJORS = (1, 2)
ATTRIBUTES = "attributes.json"
BLOB = re.compile(r"blobs/([A-Za-z][A-Za-z0-9_]*)\.bin\Z")
TENSOR = re.compile(r"tensors/(0|[1-9][0-9]{0,8})\.bin\Z")
_BACKEND_NAME = re.compile(r"[a-z][a-z0-9_]*\Z")


@dataclasses.dataclass(frozen=True)
class EntryInfo:
    """One zip entry: its name, uncompressed and stored sizes, compression, SHA-256."""

    name: str
    size: int
    stored_size: int
    compression: str  # "stored" or "deflated"
    sha256: str


@dataclasses.dataclass(frozen=True, eq=False)
class Archive:
    """A verified archive: everything `load` needs except the backend."""

    source: str
    file_size: int
    schema_version: tuple[int, int]
    writer: str | None
    torch_version: str
    backend_name: str
    backend_version: str | None
    methods: dict[str, MethodSpec]
    method_compile_spec: dict[str, dict]
    blobs: dict[str, bytes]
    debug: dict[int, DebugInfo]
    entries: tuple[EntryInfo, ...]
    manifest: dict[str, Any]
    #: ``(raw, stored)`` bytes of debug.json.
    debug_sizes: tuple[int, int]
    _attributes: list[dict[str, Any]] = dataclasses.field(repr=False)
    _tensor_meta: list[dict[str, Any]] = dataclasses.field(repr=False)
    _tensor_bytes: list[bytes] = dataclasses.field(repr=False)
    #: Partitioned methods (schema 1.1), a `_partitions.Partitions`.
    partitions: Partitions | None = dataclasses.field(default=None, repr=False)
    #: A handles-only archive (schema 1.3, `_sidecar`): the manifest's ``debug_info`` field, the
    #: handles, and the SHA-256 of the archive file; ``debug`` is empty until a sidecar is attached.
    separate_debug: dict[str, Any] | None = None
    handles: tuple[int, ...] = ()
    sha256: str | None = None
    #: Bundled inputs (schema 1.4), a `_bundles.Bundles`, or None.
    #: (``Any``: target/_replay.py reads it without asking for None; its type is ``Bundles | None``.)
    bundles: Any = dataclasses.field(default=None, repr=False)
    #: The initial value of each state buffer (schema 2.0, `_state_entries`), by name; empty without.
    state: dict[str, Any] = dataclasses.field(default_factory=dict, repr=False)

    def where(self, entry: str) -> str:
        return f"archive {self.source!r}, entry {entry!r}"

    def registered_backend(self) -> Backend:
        """The backend registered here under the manifest's name (`ArchiveBackendError` if none)."""
        from ..registry import lookup_backend

        try:
            return lookup_backend(self.backend_name).backend
        except RegistryError as exc:
            raise ArchiveBackendError(
                f"{self.where(MANIFEST)}: the archive was lowered for backend {self.backend_name!r}, "
                f"which cannot be used here: {exc}"
            ) from None

    def check_blob_version(self, backend: object) -> None:
        """Refuse blobs that ``backend`` does not accept (`ArchiveVersionError`)."""
        check_blob_version(backend, self.backend_version, self.where(MANIFEST))

    def separate_debug_record(self) -> dict[str, Any]:
        """What a module loaded from this handles-only archive keeps of its ``.debug`` file."""
        from ._sidecar import symbolicate_hint

        assert self.separate_debug is not None
        return dict(self.separate_debug, handles=self.handles, hint=symbolicate_hint(self.source))

    def setup_error(self, exc: Exception) -> ArchiveManifestError:
        """The error for methods that a lowered module cannot be set up from."""
        return ArchiveManifestError(
            f"{self.where(MANIFEST)}: its methods cannot be set up: {type(exc).__name__}: {exc}; {_REWRITE}"
        )

    def restore_attributes(self, wrapper: WrapperModule) -> None:
        """Set the wrapper attributes this archive records on ``wrapper``, tensors included."""
        tensors = [
            tensor_from_checked(data, meta, f"{self.where(f'tensors/{i}.bin')}")
            for i, (meta, data) in enumerate(zip(self._tensor_meta, self._tensor_bytes))
        ]
        restore_attributes(wrapper, self._attributes, tensors, self.where(ATTRIBUTES))


class ArchiveReader(ZipReader):
    """Reads the manifest and every entry of an archive in memory into an `Archive`."""

    # The order matters: the manifest's version is checked before the
    # layout, so that an archive from another major version says so.
    def read(self) -> Archive:
        entries = self._parse_zip()
        if not entries or entries[0].name != MANIFEST:
            first = entries[0].name if entries else "nothing"
            raise ArchiveEntryError(
                f"archive {self.source!r}: its first entry is {first!r}, not {MANIFEST!r}: it is not a "
                "pytest-backendconf archive, or it was damaged; write archives with pytest_backendconf.save"
            )
        manifest = self._stored_json(entries[0])
        if not isinstance(manifest, dict):
            raise ArchiveManifestError(
                f"{self.where(MANIFEST)}: must be a JSON object, got {_kind(manifest)}; {_REWRITE}"
            )
        version = self._check_format_and_version(manifest)
        if self.layout_problem:
            raise ArchiveFormatError(self.layout_problem)
        by_name = self._check_names(entries)
        return self._read_contents(manifest, version, entries, by_name)

    def _check_format_and_version(self, manifest: dict) -> tuple[int, int]:
        if manifest.get("format") == SIDECAR_FORMAT:
            raise ArchiveFormatError(
                f"{self.where(MANIFEST)}: this is the .debug file of a handles-only archive, not the archive: "
                "load the archive itself (the .debug file beside it is found), and symbolicate with this one "
                "(backendconf symbolicate FILE HANDLE)"
            )
        if manifest.get("format") != FORMAT_NAME:
            raise ArchiveFormatError(
                f"{self.where(MANIFEST)}: format is {manifest.get('format')!r}, not {FORMAT_NAME!r}: this "
                "is not a pytest-backendconf archive; write archives with pytest_backendconf.save"
            )
        version = manifest.get("schema_version")
        if (
            not isinstance(version, list)
            or len(version) != 2
            or not all(_is_int(v) and 0 <= v < 2**31 for v in version)
        ):
            raise ArchiveManifestError(
                f"{self.where(MANIFEST)}: schema_version must be [major, minor] (two integers), got "
                f"{_short(version)}; {_REWRITE}"
            )
        major, minor = version
        if major not in READ_MAJORS:
            from .. import __version__

            ours = f"{SCHEMA_VERSION[0]}.{SCHEMA_VERSION[1]}"
            if major > READ_MAJORS[-1]:
                todo = (
                    f"upgrade pytest-backendconf to a release that reads schema {major}.x, or re-lower "
                    f"the model and save it with pytest-backendconf {__version__}"
                )
            else:
                todo = (
                    f"re-lower the model and save it with pytest-backendconf {__version__}, or load it "
                    "with the older release that wrote it and save it with this one"
                )
            raise ArchiveVersionError(
                f"{self.where(MANIFEST)}: schema version {major}.{minor}, but pytest-backendconf "
                f"{__version__} reads schema {SCHEMA_VERSION[0]}.x (it writes {ours}) and {READ_MAJORS[-1]}.x "
                f"(for a module with state); {todo}"
            )
        return major, minor

    def _read_contents(
        self, manifest: dict, version: tuple[int, int], entries: list[ZipEntry], by_name: dict[str, ZipEntry]
    ) -> Archive:
        where = self.where(MANIFEST)
        # 1.3 (handles-only), 1.4 (bundled inputs) and 2.0 (state) are known here too.
        newer = version > STATE_SCHEMA or (version[0] == BUNDLE_SCHEMA[0] and version > BUNDLE_SCHEMA)
        backend = _field(manifest, "backend", dict, where)
        backend_name = _field(backend, "name", str, f"{where}: backend")
        if not _BACKEND_NAME.match(backend_name):
            raise ArchiveManifestError(
                f"{where}: backend name {_short(backend_name)} is not a backend name ([a-z][a-z0-9_]*); {_REWRITE}"
            )
        backend_version = backend.get("version")
        if backend_version is not None and not isinstance(backend_version, str):
            raise ArchiveManifestError(
                f"{where}: backend.version must be a string or null, got {_kind(backend_version)}; {_REWRITE}"
            )
        torch_version = _field(manifest, "torch_version", str, where)
        writer = manifest.get("writer")
        if writer is not None and not isinstance(writer, str):
            raise ArchiveManifestError(f"{where}: writer must be a string, got {_kind(writer)}; {_REWRITE}")
        compile_spec = _field(manifest, "method_compile_spec", dict, where)
        methods = self._methods(_field(manifest, "methods", list, where), compile_spec, version)
        listed = _field(manifest, "entries", dict, where)

        # The entry set must be the one the manifest lists.
        for name in by_name:
            if name != MANIFEST and name not in listed:
                raise ArchiveEntryError(
                    f"{self.where(name)}: is in the zip but not listed in {MANIFEST} (added after the "
                    f"archive was written?); {_REWRITE}"
                )
        unknown: set[str] = set()  # entries of a newer minor schema: verified as stored, never inflated
        for name, record in listed.items():
            if name == MANIFEST:
                raise ArchiveManifestError(f"{where}: entries lists {MANIFEST} itself; {_REWRITE}")
            if name not in by_name:
                raise ArchiveEntryError(
                    f"{self.where(name)}: listed in {MANIFEST} but missing from the zip; {_REWRITE}"
                )
            if (
                not isinstance(record, dict)
                or not _is_int(record.get("size"))
                or not isinstance(record.get("sha256"), str)
            ):
                raise ArchiveManifestError(
                    f'{where}: entries[{name!r}] must be {{"size": int, "sha256": str}}, got {_short(record)}; {_REWRITE}'
                )
            known = (
                name in (DEBUG, ATTRIBUTES)
                or BLOB.match(name)
                or TENSOR.match(name)
                or is_partition_entry(name)
                or is_bundle_entry(name)
                or is_state_entry(name)
            )
            if not known and newer:
                unknown.add(name)
            if not known and not newer:
                raise ArchiveEntryError(
                    f"{self.where(name)}: not an entry of schema {version[0]}.{version[1]} "
                    f"({MANIFEST}, {ATTRIBUTES}, {DEBUG}, blobs/<method>.bin, tensors/<n>.bin); {_REWRITE}"
                )
            # Only debug.json is deflated: a deflated tensor or blob would be a bomb's vehicle.
            if known and by_name[name].method != method_for(name):
                raise ArchiveFormatError(
                    f"{self.where(name)}: is {'deflated' if by_name[name].method != _STORED else 'stored'}, "
                    f"but this format {'deflates' if method_for(name) != _STORED else 'stores'} it; {_REWRITE}"
                )
        for name in (DEBUG, ATTRIBUTES):
            if name not in by_name:
                raise ArchiveEntryError(f"{self.where(name)}: missing from the archive; {_REWRITE}")

        # Verify every entry before using any.
        contents: dict[str, bytes] = {}
        for entry in entries[1:]:
            record = listed[entry.name]
            cap, option = (
                (self.limits.max_debug_bytes, "max_debug_bytes")
                if entry.name == DEBUG
                else (self.limits.max_json_bytes, "max_json_bytes")
                if entry.name in (ATTRIBUTES, BUNDLES)
                else (None, None)
            )
            if cap is not None and entry.size > cap:
                raise ArchiveSizeError(
                    f"{self.where(entry.name)}: {entry.size} bytes of JSON, more than the limit of "
                    f"{cap}; pass limits=Limits({option}=...) if the archive is trusted"
                )
            # The hash covers the bytes as stored, before inflating: a deflate
            # stream has padding bits that can change without changing what
            # it inflates to, and hostile data is refused before it is inflated.
            digest = hashlib.sha256(entry.raw).hexdigest()
            if digest != record["sha256"]:
                raise ArchiveChecksumError(
                    f"{self.where(entry.name)}: SHA-256 is {digest}, but {MANIFEST} records "
                    f"{_short(record['sha256'])}; {_REWRITE}"
                )
            if entry.name in unknown:
                # Nothing here reads an entry a newer minor added: it is skipped as it is stored (its
                # hash checked above), never inflated nor kept (a small file could inflate to gigabytes).
                continue
            data = self._bytes(entry)
            if record["size"] != len(data):
                raise ArchiveSizeError(
                    f"{self.where(entry.name)}: has {len(data)} bytes, but {MANIFEST} records "
                    f"{record['size']}; {_REWRITE}"
                )
            contents[entry.name] = data

        partitions = read_partitions(manifest, contents, set(methods), self.where)
        blobs: dict[str, bytes] = dict(partitions.delegated_blobs)
        for name in methods:
            if name in partitions.methods:
                continue  # its partitions' blobs, read above
            entry_name = f"blobs/{name}.bin"
            if entry_name not in contents:
                raise ArchiveEntryError(f"{self.where(entry_name)}: the blob of method {name!r} is missing; {_REWRITE}")
            blobs[name] = contents[entry_name]
        for name in contents:
            match = BLOB.match(name)
            if match and match[1] not in methods:
                raise ArchiveEntryError(
                    f"{self.where(name)}: a blob for method {match[1]!r}, which {MANIFEST} does not list; {_REWRITE}"
                )

        separate = read_manifest_field(manifest, version, where)
        handles: tuple[int, ...] = ()
        if separate is None:
            debug = decode_debug(self._parse_json(DEBUG, contents[DEBUG]), self.where(DEBUG), set(methods))
        else:  # handles only: the debug info is in the .debug file (_sidecar)
            debug = {}
            handles = decode_handles(self._parse_json(DEBUG, contents[DEBUG]), self.where(DEBUG))
        attributes, tensor_meta = check_attributes(
            self._parse_json(ATTRIBUTES, contents[ATTRIBUTES]), self.where(ATTRIBUTES), set(methods)
        )
        tensors = [name for name in contents if TENSOR.match(name)]
        tensor_bytes = tensor_entries(tensor_meta, contents, "tensors", ATTRIBUTES, tensors, self.where)

        state = read_state(manifest, contents, methods, version, self.where)
        bundle_doc = self._parse_json(BUNDLES, contents[BUNDLES]) if BUNDLES in contents else None
        bundles = read_bundles(bundle_doc, contents, set(methods), version, self.where)

        infos = tuple(
            EntryInfo(
                e.name,
                e.size,
                len(e.raw),
                "stored" if e.method == _STORED else "deflated",
                hashlib.sha256(self._bytes(e)).hexdigest() if e.name == MANIFEST else listed[e.name]["sha256"],
            )
            for e in entries
        )
        return Archive(
            source=self.source,
            file_size=len(self.data),
            schema_version=version,
            writer=writer,
            torch_version=torch_version,
            backend_name=backend_name,
            backend_version=backend_version,
            methods=methods,
            method_compile_spec=compile_spec,
            blobs=blobs,
            debug=debug,
            entries=infos,
            manifest=manifest,
            debug_sizes=(by_name[DEBUG].size, len(by_name[DEBUG].raw)),
            _attributes=attributes,
            _tensor_meta=tensor_meta,
            _tensor_bytes=tensor_bytes,
            partitions=partitions,
            separate_debug=separate,
            handles=handles,
            sha256=hashlib.sha256(self.data).hexdigest() if separate is not None else None,
            bundles=bundles,
            state=state,
        )

    def _methods(self, records: list, compile_spec: dict, version: tuple[int, int]) -> dict[str, MethodSpec]:
        where = self.where(MANIFEST)
        if not records:
            raise ArchiveManifestError(f"{where}: methods is empty; a lowered module has at least one; {_REWRITE}")
        methods: dict[str, MethodSpec] = {}
        for i, record in enumerate(records):
            if not isinstance(record, dict):
                raise ArchiveManifestError(f"{where}: methods[{i}] must be an object, got {_kind(record)}; {_REWRITE}")
            if version < (1, 2):
                record = self._structures_1_0(record, i, version)
            try:
                spec = MethodSpec.from_json(record)
                spec.signature()
            except (ValueError, KeyError, TypeError, AttributeError, IndexError) as exc:
                raise ArchiveManifestError(
                    f"{where}: methods[{i}] is not a valid method spec ({type(exc).__name__}: {exc}); {_REWRITE}"
                ) from None
            name = record.get("name")
            if not isinstance(name, str) or not name.isidentifier() or name.startswith("_") or name in RESERVED_METHODS:
                raise ArchiveManifestError(
                    f"{where}: methods[{i}] has name {_short(name)}, which cannot be a lowered method's "
                    f"name; {_REWRITE}"
                )
            if name in methods:
                raise ArchiveManifestError(f"{where}: method {name!r} is listed twice; {_REWRITE}")
            if name not in compile_spec or compile_spec[name] != spec.compile_spec:
                raise ArchiveManifestError(
                    f"{where}: method_compile_spec[{name!r}] does not match the method's own compile spec; {_REWRITE}"
                )
            methods[name] = spec
        extra = sorted(set(compile_spec) - set(methods))
        if extra:
            raise ArchiveManifestError(
                f"{where}: method_compile_spec names {extra}, which methods does not list; {_REWRITE}"
            )
        return methods

    def _structures_1_0(self, record: dict, i: int, version: tuple[int, int]) -> dict:
        """A schema 1.0/1.1 method record with its treespec strings read as structures (nothing imported)."""
        record = dict(record)
        for old, new in (("in_spec", "in_structure"), ("out_spec", "out_structure")):
            if new in record:
                raise ArchiveManifestError(
                    f"{self.where(MANIFEST)}: methods[{i}] has {new}, which schema {version[0]}.{version[1]} "
                    f"does not have; {_REWRITE}"
                )
            try:
                record[new] = structure.from_treespec_1_0(record.pop(old, None))
            except structure.StructureError as exc:
                raise ArchiveManifestError(
                    f"{self.where(MANIFEST)}: method {_short(record.get('name'))} has an unreadable {old} "
                    f"({exc}); {_REWRITE}"
                ) from None
        return record
