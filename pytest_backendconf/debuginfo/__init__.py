"""Debug info: handles for graph nodes, what each handle points at in the source, and its texts.

Owns the debug-handle recorder, the debug info of a node (frames, hierarchy, source spans), the
symbolicated texts of the contract and the table that looks them up by handle.

May import: the public surface only.
"""

from ._handles import DebugHandleRecorder, DebugHandles, walk_nodes
from ._info import (
    MAX_RANGE_NODES,
    DebugInfo,
    Frame,
    build_debug_infos,
    debug_info_for_node,
    format_missing,
    format_range,
    format_runtime,
    format_unsupported,
    hierarchy_prefix,
    op_name,
)
from ._symbolication import SymbolTable, cached_table, check_handles

__all__ = [
    "MAX_RANGE_NODES",
    "DebugHandleRecorder",
    "DebugHandles",
    "DebugInfo",
    "Frame",
    "SymbolTable",
    "build_debug_infos",
    "cached_table",
    "check_handles",
    "debug_info_for_node",
    "format_missing",
    "format_range",
    "format_runtime",
    "format_unsupported",
    "hierarchy_prefix",
    "op_name",
    "walk_nodes",
]
