"""Archives saved under one torch version load and run under another.

A vendor lowers on a build machine and runs the archive on a device image
whose torch may lag or lead; the archive records the torch that wrote it
(docs/archive-format.md) but must not depend on it. These tests lower every model of
the zoo with the reference backend, save it, and check in a second Python
with another torch that the archive loads, runs, and matches eager PyTorch
there; then the same the other way round.

The other interpreter comes from ``BACKENDCONF_OTHER_PYTHON`` (tox sets it
to the other torch environment's python, see tox.ini); without it, or when it
has the same torch, the tests are skipped. By hand::

    BACKENDCONF_OTHER_PYTHON=/path/to/venv214/bin/python pytest tests/test_cross_version.py

This file is also the script the other interpreter runs:
``python tests/test_cross_version.py write DIR`` and ``... check DIR``.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

OTHER_PYTHON_VAR = "BACKENDCONF_OTHER_PYTHON"
INDEX = "index.json"
#: Attributes stored on each archive's wrapper: what the reader needs to
#: rebuild the eager model and rerun the writer's calls.
INPUTS, EXPECTED, STATE = "cross_inputs", "cross_expected", "cross_state"
TIMEOUT = 900


# --- the two sides (also run as a script in the other interpreter) --------------------------


def write_archives(directory: Path, only: set[str] | None = None) -> dict[str, Any]:
    """Lower every zoo case (or those named in ``only``) in each of its dtypes, with inputs and eager outputs, into ``directory``."""
    import torch
    from torch.utils import _pytree as pytree

    import pytest_backendconf as bc
    from pytest_backendconf.suite._context import FIXED, make_input
    from pytest_backendconf.conformance._zoo_loader import load_zoo

    directory.mkdir(parents=True, exist_ok=True)
    archives = []
    for case in load_zoo():
        if only is not None and case.name not in only:
            continue
        for dtype in case.float_dtypes if case.uses_float else (FIXED,):
            module = case.build()
            if dtype != FIXED:
                module = module.to(getattr(torch, dtype))
            generator = torch.Generator().manual_seed(0)
            inputs = {
                m: tuple(make_input(s, dtype, generator, sizes=case.example_sizes()) for s in specs)
                for m, specs in case.inputs.items()
            }
            lowered = bc.to_backend(
                module,
                "reference",
                {m: {} for m in case.methods},
                example_inputs=inputs,
                example_kwargs=case.kwargs,
            )
            lowered.cross_inputs = {m: list(args) for m, args in inputs.items()}
            lowered.cross_expected = {
                m: pytree.tree_leaves(getattr(module, m)(*args, **case.kwargs.get(m, {}))) for m, args in inputs.items()
            }
            lowered.cross_state = dict(module.state_dict())
            name = f"{case.name}[{dtype}].bcpt"
            bc.save(lowered, directory / name)
            archives.append({"file": name, "case": case.name, "dtype": dtype})
    index = {"torch": torch.__version__, "archives": archives}
    (directory / INDEX).write_text(json.dumps(index, indent=1))
    return index


def check_archives(directory: Path) -> dict[str, Any]:
    """Load and run every archive of ``directory``; compare with eager PyTorch here and with the writer's outputs."""
    import io

    import torch
    from torch.utils import _pytree as pytree

    import pytest_backendconf as bc
    from pytest_backendconf.archive._archive import read_archive
    from pytest_backendconf.suite._context import FIXED
    from pytest_backendconf.conformance._spec import section
    from pytest_backendconf.conformance._zoo_loader import load_zoo

    index = json.loads((directory / INDEX).read_text())
    cases = {case.name: case for case in load_zoo()}
    tolerances = section("parity")["tolerances"]
    problems: list[str] = []
    checked = 0
    for entry in index["archives"]:
        path, dtype = directory / entry["file"], entry["dtype"]
        where = f"{entry['file']} (written by torch {index['torch']}, read by torch {torch.__version__})"
        try:
            raw = path.read_bytes()
            archive = read_archive(raw)
            if archive.torch_version != index["torch"]:
                problems.append(f"{where}: the manifest says torch {archive.torch_version}")
            loaded = bc.load(raw)
            # Saving again changes the manifest's torch version and nothing else.
            again = io.BytesIO()
            bc.save(loaded, again)
            resaved = {e.name: e.sha256 for e in read_archive(again.getvalue()).entries}
            for e in archive.entries:
                if e.name != "manifest.json" and resaved.get(e.name) != e.sha256:
                    problems.append(f"{where}: saving it again under this torch changed entry {e.name}")
            case = cases[entry["case"]]
            module = case.build()
            if dtype != FIXED:
                module = module.to(getattr(torch, dtype))
            module.load_state_dict(loaded.cross_state)
            rtol, atol = tolerances.get("float32" if dtype == FIXED else dtype, (0.0, 0.0))
            for method, args in loaded.cross_inputs.items():
                kwargs = case.kwargs.get(method, {})
                actual = pytree.tree_leaves(getattr(loaded, method)(*args, **kwargs))
                eager = pytree.tree_leaves(getattr(module, method)(*args, **kwargs))
                for label, expected in (
                    ("eager PyTorch here", eager),
                    ("the writer's eager outputs", loaded.cross_expected[method]),
                ):
                    try:
                        torch.testing.assert_close(actual, list(expected), rtol=rtol, atol=atol, equal_nan=True)
                    except AssertionError as exc:
                        problems.append(f"{where}: {method} differs from {label}: {str(exc).splitlines()[0]}")
            checked += 1
        except Exception as exc:  # report every archive, not just the first failure
            problems.append(f"{where}: {type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}")
    return {
        "torch": torch.__version__,
        "writer": index["torch"],
        "checked": checked,
        "archives": len(index["archives"]),
        "problems": problems,
    }


def _main(argv: list[str]) -> int:
    action, directory = argv
    result = {"write": write_archives, "check": check_archives}[action](Path(directory))
    print(json.dumps(result))
    return 0


# --- the tests -------------------------------------------------------------------------------


def _other_python() -> str | None:
    return os.environ.get(OTHER_PYTHON_VAR) or None


def _run_other(*args: str) -> dict[str, Any]:
    python = _other_python()
    assert python is not None
    env = {k: v for k, v in os.environ.items() if k != OTHER_PYTHON_VAR}
    proc = subprocess.run([python, __file__, *args], capture_output=True, text=True, timeout=TIMEOUT, env=env)
    if proc.returncode != 0:
        pytest.fail(
            f"{python} {Path(__file__).name} {' '.join(args)} failed ({proc.returncode}):\n{proc.stderr[-4000:]}"
        )
    return json.loads(proc.stdout.strip().splitlines()[-1])


@pytest.fixture(scope="module")
def other_torch() -> str:
    python = _other_python()
    if python is None:
        pytest.skip(
            f"{OTHER_PYTHON_VAR} is not set: it names the python of another torch version (tox sets it; see tox.ini)"
        )
    if not os.access(python, os.X_OK):
        pytest.skip(
            f"{OTHER_PYTHON_VAR}={python} does not exist yet (tox creates it when it runs that "
            "environment; run both, e.g. `tox -e torch213,torch214`)"
        )
    code = "import torch, pytest_backendconf, backendconf_reference; print(torch.__version__)"
    proc = subprocess.run([python, "-c", code], capture_output=True, text=True, timeout=300)
    if proc.returncode != 0:
        pytest.skip(
            f"{OTHER_PYTHON_VAR}={python} cannot import torch, pytest_backendconf and the reference "
            f"backend: {proc.stderr.strip().splitlines()[-1] if proc.stderr.strip() else proc.returncode}"
        )
    version = proc.stdout.strip()
    import torch

    if version == torch.__version__:
        pytest.skip(f"{OTHER_PYTHON_VAR}={python} has the same torch ({version}) as this python")
    return version


def _assert_all_good(result: dict[str, Any]) -> None:
    problems = "\n".join(result["problems"])
    assert not result["problems"], f"{len(result['problems'])} problem(s):\n{problems}"
    assert result["checked"] == result["archives"] > 0


def test_archives_saved_here_load_and_match_eager_under_the_other_torch(other_torch, tmp_path):
    import torch

    written = write_archives(tmp_path)
    result = _run_other("check", str(tmp_path))
    assert (result["writer"], result["torch"]) == (torch.__version__, other_torch)
    assert result["archives"] == len(written["archives"])
    _assert_all_good(result)


def test_archives_saved_under_the_other_torch_load_and_match_eager_here(other_torch, tmp_path):
    import torch

    written = _run_other("write", str(tmp_path))
    assert written["torch"] == other_torch
    result = check_archives(tmp_path)
    assert (result["writer"], result["torch"]) == (other_torch, torch.__version__)
    _assert_all_good(result)


def test_the_check_passes_on_intact_archives_and_names_a_wrong_output(tmp_path):
    """The reader side, under one torch: it must be able to fail (no other python needed)."""
    import torch

    import pytest_backendconf as bc

    pytest.importorskip("backendconf_reference")
    index = write_archives(tmp_path, only={"linear", "encoder_decoder"})
    result = check_archives(tmp_path)
    assert (result["writer"], result["torch"]) == (torch.__version__, torch.__version__)
    _assert_all_good(result)

    name = "linear[float32].bcpt"
    loaded = bc.load(tmp_path / name)
    loaded.cross_expected = {m: [t + 1 for t in outs] for m, outs in loaded.cross_expected.items()}
    bc.save(loaded, tmp_path / name)
    problems = check_archives(tmp_path)["problems"]
    assert len(problems) == 1, problems
    assert problems[0].startswith(
        f"{name} (written by torch {index['torch']}, read by torch {torch.__version__}): "
        "forward differs from the writer's eager outputs: "
    )


if __name__ == "__main__":
    sys.exit(_main(sys.argv[1:]))
