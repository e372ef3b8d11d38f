"""Where a suite setting comes from: its command-line option, else its ini option, else its environment variable.

Each setting's reader asks here, so that every usage error can name the place
the value came from (``--backendconf-shard=3/2``, ``backendconf_shard = '3/2'
in the ini file``, ``$BACKENDCONF_SHARD=3/2``) in the same words.
"""

from __future__ import annotations

import os
from typing import Any

import pytest


def setting(config: pytest.Config, name: str, env: str | None = None) -> tuple[Any, str, str]:
    """``(value, where, source)`` of the setting ``name`` (``backendconf_shard``): the option
    ``--backendconf-shard``, else the ini option of that name, else ``$env``; ``value`` is None
    when none is given, ``source`` is ``"option"``, ``"ini"`` or ``"env"``."""
    value = config.getoption(name, None)
    where, source = f"--{name.replace('_', '-')}={value}", "option"
    if value is None and config.getini(name):
        value, source = config.getini(name), "ini"
        where = f"{name} = {value!r} in the ini file"
    if value is None and env is not None and os.environ.get(env):
        value, source = os.environ[env], "env"
        where = f"${env}={value}"
    return value, where, source
