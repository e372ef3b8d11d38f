"""What a device's installed copy of this checkout must match: a hash of the sources it runs.

`make target-venv` writes it beside the target venv; tests/test_device_ssh.py compares, and skips
(naming the make target) when the device runs other sources than the checkout.
"""

from __future__ import annotations

import hashlib
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SOURCES = ("pytest_backendconf", "conformance", "backends/reference/backendconf_reference")


def source_hash() -> str:
    digest = hashlib.sha256()
    for folder in SOURCES:
        for path in sorted((ROOT / folder).rglob("*")):
            if path.is_file() and "__pycache__" not in path.parts:
                digest.update(str(path.relative_to(ROOT)).encode() + b"\0" + path.read_bytes())
    return digest.hexdigest()
