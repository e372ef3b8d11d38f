"""The serialization category: save/load round trips in this process and on the target, byte-identical
resaves, dynamic-shape archives and archives from a newer backend version (``backend_versions``)."""

from ._category import checks

__all__ = ["checks"]
