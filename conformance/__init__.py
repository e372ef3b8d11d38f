"""The conformance suite: spec data (TOML), the model zoo, and the checks built from them.

Other rooms (the suite's context and items) use the names below; everything
else here is the categories' own. Both are cheap to import (no torch).
"""

from ._spec import section
from ._zoo_loader import load_torchscript_zoo, load_zoo

__all__ = ["load_torchscript_zoo", "load_zoo", "section"]
