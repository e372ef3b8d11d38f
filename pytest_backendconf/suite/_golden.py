"""``--backendconf-golden=DIR``: every passing parity check leaves its archive, bundled with what it checked.

The check (in the backend host or in this process) writes
``DIR/<category>.<model>[.<method>].<dtype>.bcpt`` (`golden_name`: a stable
name from the check id) once it has passed: the lowered module it checked,
bundled with the first `GOLDEN_EXAMPLES` inputs it was checked on, eager
PyTorch's outputs for them, and the check's tolerance. At the end of the run
the pytest process (`write_index`, from the gating plugin) writes
``DIR/index.json``, the list that ``backendconf replay DIR`` replays, from the
outcomes: a check that did not pass (a failure, a known failure, a listed
known failure that passed) is left out and its file removed, so that a
golden folder holds only verdicts the host stands behind.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import TYPE_CHECKING, Any, Iterable

import pytest

if TYPE_CHECKING:
    from ._context import SuiteContext

#: ``--backendconf-golden``'s folder (a `Path`) in the pytest config's stash, or None.
GOLDEN_KEY = pytest.StashKey[Any]()
#: How many of a check's examples are bundled (the first ones Hypothesis ran: the explicit ones first).
GOLDEN_EXAMPLES = 3
INDEX = "index.json"
INDEX_FORMAT = "backendconf-golden"
#: The categories whose passing checks write golden archives.
GOLDEN_CATEGORIES = ("parity",)
_UNSAFE = re.compile(r"[^A-Za-z0-9_.-]")


def golden_name(category: str, name: str) -> str:
    """``parity``, ``small_cnn.decode[float16-dynamic]`` → ``parity.small_cnn.decode.float16-dynamic.bcpt``."""
    stem = name.replace("[", ".").replace("]", "")
    return f"{category}.{_UNSAFE.sub('_', stem)}.bcpt"


def golden_dir(config: Any, value: str | None) -> Path | None:
    """The folder of ``--backendconf-golden``, created if its parent exists (a `pytest.UsageError` otherwise)."""
    if not value:
        return None
    path = Path(config.invocation_params.dir, value)
    if path.exists() and not path.is_dir():
        raise pytest.UsageError(f"--backendconf-golden={value}: that is a file; give a folder for the golden archives.")
    if not path.parent.is_dir():
        raise pytest.UsageError(
            f"--backendconf-golden={value}: the folder {path.parent} does not exist; create it first."
        )
    path.mkdir(exist_ok=True)
    return path


class GoldenRecorder:
    """Collects a check's first examples; `write` saves the lowered module bundled with them."""

    def __init__(self, ctx: SuiteContext, category: str, name: str, tolerance: Any) -> None:
        self.ctx = ctx
        self.category = category
        self.name = name
        self.tolerance = tolerance
        self.bundles: list[Any] = []
        self.folder = ctx.golden_dir
        self.enabled = self.folder is not None

    def add(self, args: tuple, kwargs: dict, expected: Any) -> None:
        """Keep one example (positional inputs only: a bundle has no keyword arguments)."""
        if not self.enabled or len(self.bundles) >= GOLDEN_EXAMPLES or kwargs:
            return
        import torch

        from .. import _compat
        from ..archive import Bundle

        def copy(value: Any) -> Any:
            return _compat.tree_map(lambda v: v.detach().clone() if isinstance(v, torch.Tensor) else v, value)

        self.bundles.append(
            Bundle(
                inputs=copy(tuple(args)),
                expected=copy(expected),
                rtol=self.tolerance.rtol,
                atol=self.tolerance.atol,
                tolerance=str(self.tolerance.source),
                check=f"{self.category}::{self.name}",
            )
        )

    def write(self, lowered: Any, method: str) -> None:
        """Save ``lowered`` with the kept examples into the golden folder (after the check passed)."""
        if self.folder is None or not self.bundles:
            return
        import io

        from ..archive import write_atomic
        from ..lowering import save

        buffer = io.BytesIO()
        save(lowered, buffer, bundled_inputs={method: self.bundles})
        # Atomic, but not synced one by one (two fsyncs per file tripled the cost of the folder):
        # `write_index` syncs the files it lists before it writes the index.
        write_atomic(Path(self.folder) / golden_name(self.category, self.name), buffer.getvalue(), sync=False)


def write_index(folder: Path, results: Iterable[Any], backend: str) -> tuple[int, int]:
    """Write ``folder/index.json`` from the run's results; remove the files of golden checks that did not pass.

    Returns ``(archives listed, files removed)``.
    """
    from ..archive import remove_file, sync_files, write_atomic
    from ..checks import ROOT_ID

    listed, removed = [], 0
    for result in results:
        category, _, name = result.id.removeprefix(f"{ROOT_ID}::").partition("::")
        if category not in GOLDEN_CATEGORIES or not name:
            continue
        file = folder / golden_name(category, name)
        if result.outcome == "passed":
            if file.is_file():
                listed.append({"archive": file.name, "check": result.id, "case": result.case})
        elif remove_file(file):  # the entry itself (a link goes, never its target); False when none is there
            removed += 1
    sync_files([folder / entry["archive"] for entry in listed], folder)
    document = {"format": INDEX_FORMAT, "backend": backend, "archives": listed}
    write_atomic(folder / INDEX, json.dumps(document, indent=1) + "\n")
    return len(listed), removed
