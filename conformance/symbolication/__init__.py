"""The symbolication category: rejection and fault texts against the model's source, debug-info coverage,
and debug info kept apart from the archive (``debug_apart``)."""

from ._category import checks, expected_frames

__all__ = ["checks", "expected_frames"]
