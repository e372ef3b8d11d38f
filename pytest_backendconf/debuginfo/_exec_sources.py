"""Keep the frames of models defined in ``exec``'d strings in the stack traces ``torch.export`` records.

``torch.export`` leaves frames of code compiled from the file name
``"<string>"`` out of a node's ``stack_trace`` (it counts that name among its
"uninteresting files"), so a model defined with ``exec`` would get no source
location at all. For the export's duration, each module class whose
``forward`` comes from ``"<string>"`` is swapped for a subclass whose code
says `TRACEABLE` instead; reading the trace maps it back (`user_file`), so
the texts show the seed's ``File "<string>", line 3``. Notebook cells and REPL
input (``<ipython-input-…>``, ``/tmp/ipykernel_…/….py``) are kept by torch and
their source comes from ``linecache``, where IPython registers every cell.
"""

from __future__ import annotations

import contextlib
import types
import weakref
from typing import TYPE_CHECKING, Iterator

if TYPE_CHECKING:
    import torch

STRING_FILE = "<string>"
TRACEABLE = "<string:backendconf>"

_RENAMED: "weakref.WeakKeyDictionary[type, type]" = weakref.WeakKeyDictionary()


def user_file(file: str) -> str:
    """The file name the user knows for a file name found in a recorded stack trace."""
    return STRING_FILE if file == TRACEABLE else file


@contextlib.contextmanager
def traceable(module: torch.nn.Module) -> Iterator[None]:
    """While exporting ``module``: frames of ``forward`` methods ``exec``'d from strings are recorded."""
    swapped = []
    for sub in module.modules():
        cls = type(sub)
        code = getattr(getattr(cls, "forward", None), "__code__", None)
        if code is not None and code.co_filename == STRING_FILE:
            sub.__class__ = _renamed(cls)
            swapped.append((sub, cls))
    try:
        yield
    finally:
        for sub, cls in swapped:
            sub.__class__ = cls


def _renamed(cls: type) -> type:
    found = _RENAMED.get(cls)
    if found is None:
        function = cls.forward  # type: ignore[attr-defined]
        code = function.__code__.replace(co_filename=TRACEABLE)
        forward = types.FunctionType(code, function.__globals__, "forward", function.__defaults__, function.__closure__)
        forward.__kwdefaults__ = function.__kwdefaults__
        # Same module and qualified name: nn_module_stack records the user's class.
        found = type(
            cls.__name__, (cls,), {"forward": forward, "__module__": cls.__module__, "__qualname__": cls.__qualname__}
        )
        _RENAMED[cls] = found
    return found
