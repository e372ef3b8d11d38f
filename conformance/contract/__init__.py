"""The contract category: the four hooks one at a time (declaration, preprocess, compile, execute, profiling)."""

from ._category import checks

__all__ = ["checks"]
