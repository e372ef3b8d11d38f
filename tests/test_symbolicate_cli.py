"""The archive commands of ``backendconf``: inspect, symbolicate, run-target."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

import pytest_backendconf as bc
from pytest_backendconf.archive import _archive
from pytest_backendconf.cli import _inputs, _main as cli
from test_archive import ALL_INPUTS, ALL_METHODS, TINY_OFF, TinyBackend, lower
from test_archive import registry  # noqa: F401  (the module-scoped fixture: this module's backends)

TEST_ARCHIVE_FILE = sys.modules[TinyBackend.__module__].__file__


def backendconf(*args, stdin=None, model_code_importable=True):
    # Archives store source paths relative to the import root; with the model's code on the
    # path (as where it was lowered) tracebacks show the local file, as in this process.
    env = dict(os.environ)
    if model_code_importable:
        env["PYTHONPATH"] = os.pathsep.join(p for p in (os.path.dirname(TEST_ARCHIVE_FILE), env.get("PYTHONPATH")) if p)
    return subprocess.run(
        [sys.executable, "-m", "pytest_backendconf.cli", *map(str, args)],
        capture_output=True,
        text=True,
        input=stdin,
        timeout=120,
        env=env,
    )


@pytest.fixture(scope="module")
def archive(tmp_path_factory, registry):  # noqa: F811
    path = tmp_path_factory.mktemp("cli") / "n.bcpt"
    bc.save(lower(spec=ALL_METHODS, inputs=ALL_INPUTS), path)
    return path


@pytest.fixture(scope="module")
def handles(archive):
    return {(i.method, i.node): h for h, i in _archive.read_archive(archive).debug.items()}


def test_inspect_shows_versions_backend_methods_entries_and_handles(archive):
    done = backendconf("inspect", archive)
    assert done.returncode == 0, done.stderr
    out = done.stdout
    assert "format:        backendconf-archive, schema version 1.2 (this reader: 1.2)" in out
    assert "backend:       tiny (version -)" in out
    assert "torch 2." in out and "pytest-backendconf 0.1.0" in out
    assert "debug handles: 14 (" in out
    assert "  pair(x, y)\n    inputs:  x: a float32[2, 3] tensor, y: a float32[2, 3] tensor\n" in out
    assert 'compile spec: {"__backendconf_fault__": {"node": "mul"}}' in out
    lines = out[out.index("entries:") :].splitlines()[1:]
    assert [line.split()[0] for line in lines] == [
        "manifest.json",
        "attributes.json",
        "blobs/boom.bin",
        "blobs/forward.bin",
        "blobs/pair.bin",
        "debug.json",
    ]
    assert "deflated" in lines[-1] and "stored" in lines[0]


def test_symbolicate_handles(archive, handles):
    mul = handles[("forward", "mul")]
    done = backendconf("symbolicate", archive, mul, 123456)
    assert done.returncode == 0, done.stderr
    assert done.stdout == bc.symbolicate(archive, [mul, 123456]) + "\n"
    assert done.stdout.startswith(f"debug handle {mul} (method 'forward', node 'mul', aten::mul):\n")
    assert done.stdout.endswith("Debug info for handle(s): debug_handles:{123456}, was not found.\n")
    elsewhere = backendconf("symbolicate", archive, mul, model_code_importable=False)
    assert '  File "test_archive.py", line ' in elsewhere.stdout  # the stored path, never the build machine's


def test_symbolicate_rewrites_a_log(archive, handles, tmp_path):
    sub, boom = handles[("forward", "sub")], handles[("boom", "mul")]
    log = tmp_path / "device.log"
    log.write_text(f"boot ok\nfault at debug_handle={boom}: overflow\nsee debug_handle={sub} and debug_handle=99999\n")
    done = backendconf("symbolicate", archive, "--log", log)
    assert done.returncode == 0, done.stderr
    expected = (
        "boot ok\n"
        f"fault at debug_handle={boom}: overflow\n{bc.symbolicate(archive, [boom])}\n"
        f"see debug_handle={sub} and debug_handle=99999\n{bc.symbolicate(archive, [sub, 99999])}\n"
    )
    assert done.stdout == expected
    assert "return x * 2 + 1" in done.stdout
    piped = backendconf("symbolicate", archive, "--log", "-", stdin=log.read_text())
    assert piped.stdout == expected


@pytest.mark.parametrize(
    "args, message",
    [
        (["symbolicate", "{missing}", "1"], "backendconf: error: cannot read '{missing}': No such file or directory"),
        (["inspect", "{missing}"], "backendconf: error: cannot read '{missing}': No such file or directory"),
        (["inspect", "{text}"], "backendconf: error: archive '{text}' is not a zip file"),
        (["symbolicate", "{archive}", "seventeen"], "backendconf: error: handle 'seventeen' is not an integer"),
        (["symbolicate", "{archive}"], "backendconf: error: symbolicate needs debug handles"),
        (["symbolicate", "{archive}", "--log", "{missing}"], "backendconf: error: cannot read '{missing}'"),
        (["run-target", "{text}"], "backendconf: error: archive '{text}' is not a zip file"),
    ],
)
def test_bad_input_is_exit_code_1_naming_the_file(archive, tmp_path, args, message):
    names = {"missing": tmp_path / "nope.bcpt", "text": tmp_path / "notes.txt", "archive": archive}
    names["text"].write_text("not an archive\n")
    done = backendconf(*[a.format(**names) for a in args])
    assert done.returncode == 1
    assert done.stderr.startswith(message.format(**names)), done.stderr
    assert "Traceback" not in done.stderr


def test_symbolicate_imports_neither_torch_nor_the_backend(tmp_path):
    try:
        import backendconf_reference  # noqa: F401

        path = tmp_path / "reference.bcpt"
        bc.save(
            bc.to_backend(
                __import__("test_archive").N(), "reference", {"forward": {}}, example_inputs=ALL_INPUTS["forward"]
            ),
            path,
        )
    except ImportError:
        path = tmp_path / "tiny.bcpt"
        bc.save(lower(), path)
    handle = min(_archive.read_archive(path).debug) + 1
    script = (
        "import sys\n"
        "from pytest_backendconf import cli\n"
        f"assert cli.main(['symbolicate', {str(path)!r}, '{handle}']) == 0\n"
        "loaded = [m for m in ('torch', 'backendconf_reference', 'test_archive') if m in sys.modules]\n"
        "assert not loaded, loaded\n"
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert f"debug handle {handle} (method 'forward', node 'mul', aten::mul):" in done.stdout


def test_run_target_loads_with_a_plugin_given_by_path(tmp_path):
    path = tmp_path / "n.bcpt"
    bc.save(lower(spec=ALL_METHODS, inputs=ALL_INPUTS), path)
    done = backendconf("run-target", path, "-p", TEST_ARCHIVE_FILE)
    assert done.returncode == 0, done.stderr
    # The child learns the host-only modules from the plugin that only it imports.
    assert done.stdout == (
        f"target: loaded '{path}' (backend 'tiny'; methods forward, pair, boom) with these modules "
        "blocked: torch._dynamo, torch.export._trace, colorsys\ntarget: ok\n"
    )


@pytest.mark.slow
def test_run_target_reports_an_unavailable_backend(tmp_path):
    path = tmp_path / "off.bcpt"
    bc.save(lower(TINY_OFF), path)
    done = backendconf("run-target", path, "-p", TEST_ARCHIVE_FILE)
    assert done.returncode == 1
    error = next(line for line in done.stderr.splitlines() if line.startswith("backendconf: error:"))
    assert error.startswith(
        f"backendconf: error: the target could not load '{path}': BackendUnavailableError: Backend is not available."
    )


def test_inputs_file_becomes_tensors_of_the_lowered_dtype(archive, tmp_path):
    import torch

    calls = _inputs.calls_from_json(_archive.read_archive(archive), {"forward": [[[[1, 2, 3], [4, 5, 6]]]]}, "in.json")
    ((x,),) = calls["forward"]
    assert x.dtype == torch.float32 and x.tolist() == [[1, 2, 3], [4, 5, 6]]
    with pytest.raises(bc.BackendConfError, match="names method 'nope'; the archive's methods are forward, pair, boom"):
        _inputs.calls_from_json(_archive.read_archive(archive), {"nope": []}, "in.json")


def test_example_inputs_follow_the_input_specs(archive):
    calls = _inputs.example_calls(_archive.read_archive(archive))
    assert list(calls) == ["forward", "pair", "boom"]
    ((x, y),) = calls["pair"]
    assert x.shape == y.shape == (2, 3) and x.dtype == y.dtype == __import__("torch").float32
    assert _inputs.describe((x, {"k": [y]})) == "(float32[2, 3], {'k': [float32[2, 3]]})"


ECHOES = """
import sys
sys.path.insert(0, {tests!r})
from test_archive import TinyBackend


class Echoes(TinyBackend):
    \"\"\"Fails a call with a message from its blob, as a runtime that reports the blob's own text.\"\"\"

    def execute(self, handle, inputs):
        if "note" in handle:
            raise RuntimeError(handle["note"])
        return super().execute(handle, inputs)


def backendconf_register_backends(register):
    register(Echoes("tiny"))
"""


@pytest.mark.slow
def test_run_target_output_cannot_forge_a_line_or_drive_the_terminal(archive, tmp_path):
    import json

    from test_archive_hostile import with_json

    def edit(blob):
        blob["note"] = "boom\x1b[2J\ntarget: ok"

    forged = tmp_path / "forged.bcpt"
    forged.write_bytes(with_json(archive.read_bytes(), "blobs/boom.bin", edit))
    plugin = tmp_path / "echoes.py"
    plugin.write_text(ECHOES.format(tests=os.path.dirname(TEST_ARCHIVE_FILE)))
    inputs = tmp_path / "inputs.json"
    inputs.write_text(json.dumps({"boom": [[[[1.0, 2.0, 3.0], [4.0, 5.0, 6.0]]]]}))
    done = backendconf("run-target", forged, "-p", plugin, "--inputs", inputs)
    assert done.returncode == 1, done.stderr
    assert "RuntimeError: boom" in done.stdout
    assert "\x1b" not in done.stdout and "\\x1b[2J" in done.stdout
    lines = done.stdout.splitlines()
    assert lines[-1] == "target: FAILED (see above)"
    assert not any(line.startswith("target: ok") for line in lines), done.stdout


def test_deeply_nested_inputs_are_refused_before_they_are_parsed(archive, tmp_path, capsys):
    inputs = tmp_path / "deep.json"
    inputs.write_text('{"forward": ' + "[" * 50_000 + "]" * 50_000 + "}")
    assert cli.main(["run-target", str(archive), "--inputs", str(inputs)]) == 1
    assert f"--inputs {str(inputs)!r} nests 50001 levels deep; at most 64 are read" in capsys.readouterr().err
