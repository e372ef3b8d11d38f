"""Every difference between the torch versions we support, isolated here.

Each shim says which versions need it. The rest of the package imports
torch APIs through this module when they differ across versions.
"""

from __future__ import annotations

import torch

#: The oldest torch the package is tested with (see docs/installing.md).
MINIMUM_TORCH = (2, 5)


def torch_version() -> tuple[int, int]:
    major, minor = torch.__version__.split("+")[0].split(".")[:2]
    return int(major), int(minor)


def check_torch_version() -> None:
    """Fail early, with the fix, on a torch older than we support."""
    if torch_version() < MINIMUM_TORCH:
        raise RuntimeError(
            f"pytest-backendconf needs torch >= {MINIMUM_TORCH[0]}.{MINIMUM_TORCH[1]}, found "
            f"{torch.__version__}; install a newer build, e.g. `pip install torch==2.13.0`"
        )
