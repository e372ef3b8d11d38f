"""Debug info: handles for graph nodes, what each handle points at in the source, and its texts.

Owns the debug-handle recorder, the debug info of a node (frames, hierarchy, source spans), the
symbolicated texts of the contract and the table that looks them up by handle.

May import: the public surface only.
"""

from ._exec_sources import traceable
from ._handles import DebugHandleRecorder, DebugHandles, walk_nodes
from ._info import (
    MAX_FRAMES,
    MAX_HIERARCHY,
    MAX_NAME_CHARS,
    MAX_SOURCE_CHARS,
    MAX_TEXT_CHARS,
    MAX_RANGE_NODES,
    DebugInfo,
    Frame,
    build_debug_infos,
    clip,
    one_line,
    debug_info_for_node,
    format_missing,
    format_range,
    format_runtime,
    format_unsupported,
    hierarchy_prefix,
    op_name,
)
from ._symbolication import MAX_SYMBOLICATE_CHARS, SymbolTable, cached_table, check_handles, join_texts

__all__ = [
    "MAX_FRAMES",
    "MAX_HIERARCHY",
    "MAX_NAME_CHARS",
    "MAX_SOURCE_CHARS",
    "MAX_SYMBOLICATE_CHARS",
    "MAX_TEXT_CHARS",
    "MAX_RANGE_NODES",
    "DebugHandleRecorder",
    "DebugHandles",
    "DebugInfo",
    "Frame",
    "SymbolTable",
    "build_debug_infos",
    "cached_table",
    "check_handles",
    "clip",
    "one_line",
    "debug_info_for_node",
    "format_missing",
    "format_range",
    "format_runtime",
    "format_unsupported",
    "hierarchy_prefix",
    "join_texts",
    "traceable",
    "op_name",
    "walk_nodes",
]
