"""Read ``suite.toml``, the suite's own settings as data."""

from __future__ import annotations

import functools
import sys
from importlib import resources
from typing import Any

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib


@functools.cache
def suite_spec() -> dict[str, Any]:
    return tomllib.loads(resources.files(__package__).joinpath("suite.toml").read_text())


def section(name: str) -> dict[str, Any]:
    return suite_spec().get(name, {})
