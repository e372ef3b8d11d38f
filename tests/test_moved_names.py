"""The names the previous release's docs and examples showed still import, each with a DeprecationWarning
naming its new home, and each is the object of that home (CHANGELOG.md lists them and when they go).

Each import runs in a fresh interpreter: a module imported once is not imported (nor warned about) again.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import pytest

#: (the old import, the new home of what it names): what the docs, examples and backends showed.
OLD_IMPORTS = [
    ("from pytest_backendconf._versions import same_major_not_newer", "pytest_backendconf.backend"),
    ("from pytest_backendconf.archive._versions import same_major_not_newer", "pytest_backendconf.backend"),
    ("from pytest_backendconf._reference import bytecode, ops", "pytest_backendconf.reference"),
    (
        "from pytest_backendconf._reference.interpreter import LoadedProgram, load",
        "pytest_backendconf.reference.interpreter",
    ),
    (
        "from pytest_backendconf._reference.compiler import FAULT_KEY, KNOWN_KEYS, compile_program, overload_name",
        "pytest_backendconf.reference.compiler",
    ),
    ("from pytest_backendconf._lowering import user_inputs, user_outputs", "pytest_backendconf.lowering"),
    ("from pytest_backendconf._target import run_on_target", "pytest_backendconf"),
    ("from pytest_backendconf.conformance._ops_discovery import main", "pytest_backendconf.conformance.ops.discovery"),
    (
        "from pytest_backendconf.conformance.backend_versions import *",
        "pytest_backendconf.conformance.serialization.backend_versions",
    ),
    (
        "from pytest_backendconf.conformance.debug_apart import *",
        "pytest_backendconf.conformance.symbolication.debug_apart",
    ),
    ("from pytest_backendconf.report import Check, ROOT_ID, id_matches", "pytest_backendconf.checks"),
]

PROBE = textwrap.dedent(
    """
    import importlib, json, sys, warnings

    statement, home = sys.argv[1], sys.argv[2]
    names = {}
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        exec(statement, names)
    new = importlib.import_module(home)
    imported = [n for n in names if n != "__builtins__"]
    print(json.dumps({
        "warnings": [[w.category.__name__, str(w.message), w.filename] for w in caught],
        "same": {n: names[n] is getattr(new, n) for n in imported if hasattr(new, n)},
        "imported": imported,
    }))
    """
)


@pytest.mark.parametrize("statement, home", OLD_IMPORTS, ids=[s for s, _ in OLD_IMPORTS])
def test_an_old_import_works_and_warns_naming_the_new_home(statement, home, tmp_path):
    done = subprocess.run(
        [sys.executable, "-c", PROBE, statement, home], capture_output=True, text=True, timeout=300, cwd=tmp_path
    )
    assert done.returncode == 0, done.stderr
    found = json.loads(done.stdout.splitlines()[-1])
    deprecations = [w for w in found["warnings"] if w[0] == "DeprecationWarning"]
    assert deprecations, (statement, found["warnings"])
    # Each old module on the way warns (a package, then its submodule); one names the home of what was imported.
    assert all(" moved to pytest_backendconf." in message for _, message, _ in deprecations), deprecations
    assert any(f"moved to {home}" in message for _, message, _ in deprecations), deprecations
    # The warning points at the line that imported, not at the import machinery.
    assert all(filename == "<string>" for _, _, filename in deprecations), deprecations
    assert found["imported"] and found["same"] and all(found["same"].values()), found


def test_an_old_command_runs_and_warns():
    done = subprocess.run(
        [
            sys.executable,
            "-W",
            "always::DeprecationWarning",
            "-m",
            "pytest_backendconf.conformance._ops_discovery",
            "-h",
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr
    assert "--tolerances-only" in done.stdout
    assert "moved to pytest_backendconf.conformance.ops.discovery" in done.stderr


def test_a_name_the_old_module_never_had_is_an_import_error():
    done = subprocess.run(
        [sys.executable, "-c", "from pytest_backendconf._versions import no_such_name"],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 1
    assert "cannot import name 'no_such_name' from 'pytest_backendconf._versions'" in done.stderr
