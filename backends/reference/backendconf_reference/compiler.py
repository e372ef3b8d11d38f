"""The reference backend's compiler (host only): ``preprocess`` imports it.

The compiler itself is the core package's (``pytest_backendconf.reference``,
shared with partial delegation's CPU fallback); this module is the name the
backend declares in ``Capabilities.host_only_modules``, so that the target
simulation blocks it and proves ``compile`` and ``execute`` never need it.
"""

from pytest_backendconf.reference.compiler import FAULT_KEY, KNOWN_KEYS, compile_program, overload_name

__all__ = ["FAULT_KEY", "KNOWN_KEYS", "compile_program", "overload_name"]
