"""The device runner and the link to it, through a real local command (this interpreter as the "device").

The ssh and emulated devices are in tests/test_device_ssh.py; here the protocol's own endings are
checked where nothing but a Python is needed: a worker that answers, crashes or hangs (the backend's
failure), a runner that dies (TargetUnreachable), blobs sent once per connection, versions, masking.
"""

from __future__ import annotations

import os
import shlex
import signal
import sys

import pytest

from pytest_backendconf.errors import TargetUnreachable, TargetVersionError
from pytest_backendconf.target import Ended, TargetLink, mask_command, probe

ECHO = "pytest_backendconf.target._child:Echo"
HERE = shlex.quote(sys.executable)


@pytest.fixture
def link():
    made = TargetLink(HERE)
    made.connect()
    yield made
    made.close()


def test_hello_names_the_machine_and_versions():
    import platform

    import torch

    info = probe(HERE)
    assert info["machine"] == platform.machine()
    assert info["torch"] == torch.__version__.split("+")[0] or info["torch"].startswith(torch.__version__[:4])
    assert info["backends"]["reference"]["distribution"] == "backendconf-reference"
    assert info["round_trip_ms"] is not None and info["round_trip_ms"] > 0


def test_a_worker_answers_then_crashes_then_hangs_and_the_runner_goes_on(link):
    child = link.child(ECHO, plugins=[])
    assert child.request({"say": "hi"}, timeout=120)["said"] == "hi"
    crashed = child.request({"exit": 3}, timeout=60)
    assert isinstance(crashed, Ended) and crashed.returncode == 3 and crashed.crashed and not crashed.unreachable
    hung = link.child(ECHO, plugins=[]).request({"sleep": 60}, timeout=1)
    assert isinstance(hung, Ended) and hung.timed_out == 1 and not hung.unreachable
    assert "in __call__" in hung.stderr  # the device's stacks came back through the stream
    again = link.child(ECHO, plugins=[])
    assert again.request({"say": "after"}, timeout=60)["said"] == "after"
    again.close()


def test_a_killed_runner_is_unreachable_not_the_backends_failure(link):
    child = link.child(ECHO, plugins=[])
    assert child.request({"say": "hi"}, timeout=120)["said"] == "hi"
    os.kill(link.hello["pid"], signal.SIGKILL)
    ended = child.request({"say": "lost"}, timeout=60)
    assert isinstance(ended, Ended) and ended.unreachable and not ended.crashed
    assert "without the runner reporting" in ended.describe()


def test_archives_travel_as_bytes_once_per_connection(link, tmp_path):
    path = tmp_path / "data.bin"
    path.write_bytes(b"x" * 1000)
    first = link.child(ECHO, plugins=[])
    ref = first.file(path)
    assert ref == {"$blob": __import__("hashlib").sha256(b"x" * 1000).hexdigest()}
    first.request({"say": "a", "file": ref}, timeout=120)
    second = link.child(ECHO, plugins=[])
    second.file(path)
    second.request({"say": "b"}, timeout=60)
    assert link.blob_bytes == 1000


def test_a_file_plugin_cannot_travel(link, tmp_path):
    plugin = tmp_path / "conftest.py"
    plugin.write_text("")
    ended = link.child(ECHO, plugins=[str(plugin)]).request({"say": "x"}, timeout=10)
    assert isinstance(ended, Ended) and "entry point" in ended.setup_error["message"]


def test_nothing_answering_is_one_unreachable_error():
    with pytest.raises(TargetUnreachable, match="cannot be reached.*exit code 1"):
        probe("false")
    with pytest.raises(TargetUnreachable, match="cannot start"):
        probe("/nonexistent/python")


def test_another_project_version_on_the_device_is_refused_naming_both(tmp_path):
    dist = tmp_path / "pytest_backendconf-9.9.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: pytest-backendconf\nVersion: 9.9\n")
    with pytest.raises(TargetVersionError, match=r"pytest-backendconf 0\.1\.0 here, 9\.9 on the device"):
        # From / : a checkout as the current folder would shadow the path's metadata.
        import pytest_backendconf

        package_root = os.path.dirname(os.path.dirname(pytest_backendconf.__file__))
        probe(f"sh -c 'cd / && exec env PYTHONPATH={tmp_path}:{package_root} {HERE} \"$@\"' device")


def test_secrets_are_masked():
    assert mask_command("sshpass -p hunter2 ssh ci@board python") == "sshpass -p '***' ssh ci@board python"
    assert "s3cret" not in mask_command("env API_TOKEN=s3cret adb shell python")
    assert mask_command("curl https://u:pw@host/x") == "curl 'https://u:***@host/x'"


def test_an_unreachable_device_at_start_is_one_usage_error(pytester):
    result = pytester.runpytest_subprocess(
        "--backend=reference", "-m", "availability", "--backendconf-target-command=false"
    )
    assert result.ret == 4
    errors = [line for line in result.stderr.lines if "cannot be reached" in line]
    assert len(errors) == 1, result.stderr.str()


def test_replay_with_an_unreachable_device_is_exit_4(tmp_path, capsys):
    from pytest_backendconf.cli import main

    archive = tmp_path / "a.bcpt"
    archive.write_bytes(b"")
    assert main(["replay", str(archive), "--target-command", "false"]) == 4
    assert capsys.readouterr().err.count("cannot be reached") == 1
