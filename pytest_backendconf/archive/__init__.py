"""The archive: the records a lowered module is saved as, and the files that hold them.

Owns the zip container, the manifest and the verified `Archive`, method specs and the structure of
their values, dynamic-shape ranges, partition plans, tensors and attributes, the debug tables and the
``.debug`` sidecar, the preprocess cache's entry files and their secret, reading limits, backend
versions, tensor files, atomic writes, the one checked read of a file that may have been planted
(`read_regular_file`: no FIFO, device or unfollowed link), and where a command's output document goes (`output_file`). It reads and writes
records only: turning records into a module that runs is the lowering layer's job.

May import: `debuginfo`, `registry`, `reference` and the public surface; never `lowering` or above.
"""

# Two namespaces the lowering layer builds records with: the structure of a method's inputs and
# outputs (`structure.flatten`, `rebuilder`, `describe`, `from_treespec`, `StructureError`) and its
# dynamic-shape ranges (`shapes.DynamicShapes`, `per_method`, `fit_positional`).
from . import _shapes as shapes
from . import _structure as structure
from ._archive import debug_source, encode, read_archive, symbolicate, with_sidecar
from ._attributes import encode_attributes
from ._cache_entry import encode_cache_entry, entry_mac, read_cache_entry
from ._cache_secret import SECRET_ENV, CacheSecretError, cache_secret, secret_path
from ._bundles import BUNDLE_SCHEMA, Bundle, Bundles, encode_bundles
from ._debug_table import PortablePaths
from ._files import (
    FileTooLargeError,
    SpecialFileError,
    check_regular_file,
    open_regular_file,
    probe_writable,
    read_regular_file,
    remove_file,
    sync_files,
    write_atomic,
)
from ._limits import DEFAULT_LIMITS, Limits, add_limit_options, check_limits, limits_from_options
from ._manifest import Archive, SCHEMA_VERSION
from ._state_entries import STATE_SCHEMA
from ._output import OutputFile, OutputPathError, output_file
from ._method_spec import Constant, MethodSpec, ParamSpec, StateSpec, check_state_specs, params_of, value_spec
from ._partitions import delegation
from ._plan import Delegation, Plan, Step, format_delegation
from ._sidecar import check_pair, check_sidecar_size, debug_info_mode, default_sidecar_path, read_sidecar
from ._tensor_codec import ITEMSIZE, from_message, to_message
from ._tensorfile import TensorFileError, read_tensors, write_tensors
from ._versions import declared_version
from ._zip import MANIFEST, ArchiveInput, pack

__all__ = [
    "Archive",
    "ArchiveInput",
    "BUNDLE_SCHEMA",
    "Bundle",
    "Bundles",
    "CacheSecretError",
    "Constant",
    "DEFAULT_LIMITS",
    "Delegation",
    "FileTooLargeError",
    "ITEMSIZE",
    "Limits",
    "MANIFEST",
    "MethodSpec",
    "ParamSpec",
    "StateSpec",
    "check_state_specs",
    "OutputFile",
    "OutputPathError",
    "Plan",
    "PortablePaths",
    "SCHEMA_VERSION",
    "STATE_SCHEMA",
    "SECRET_ENV",
    "SpecialFileError",
    "Step",
    "TensorFileError",
    "add_limit_options",
    "cache_secret",
    "check_limits",
    "check_pair",
    "check_regular_file",
    "check_sidecar_size",
    "debug_info_mode",
    "debug_source",
    "declared_version",
    "default_sidecar_path",
    "delegation",
    "encode",
    "encode_attributes",
    "encode_bundles",
    "encode_cache_entry",
    "entry_mac",
    "format_delegation",
    "from_message",
    "limits_from_options",
    "open_regular_file",
    "output_file",
    "pack",
    "params_of",
    "probe_writable",
    "read_archive",
    "read_cache_entry",
    "read_regular_file",
    "read_sidecar",
    "read_tensors",
    "remove_file",
    "secret_path",
    "shapes",
    "structure",
    "symbolicate",
    "sync_files",
    "to_message",
    "value_spec",
    "with_sidecar",
    "write_atomic",
    "write_tensors",
]
