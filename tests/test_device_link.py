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


@pytest.mark.parametrize(
    ("command", "masked"),
    [
        ("sshpass -p hunter2 ssh ci@board python", "sshpass -p *** ssh ci@board python"),
        ("sshpass -phunter2 ssh ci@board python", "sshpass -p*** ssh ci@board python"),
        ("timeout 30 sshpass -p hunter2 ssh ci@board python", "timeout 30 sshpass -p *** ssh ci@board python"),
        ("env LANG=C sshpass -p hunter2 ssh ci@board python", "env LANG=C sshpass -p *** ssh ci@board python"),
        ("sh -c 'sshpass -p hunter2 ssh ci@board python'", "sh -c 'sshpass -p *** ssh ci@board python'"),
        ("board-shell --password=hunter2 python", "board-shell --password=*** python"),
        ("board-shell --token hunter2 python", "board-shell --token *** python"),
        (
            "ssh -o 'ProxyCommand=curl -s -u ci:hunter2 https://gw/%h' ci@board python",
            "ssh -o 'ProxyCommand=curl -s -u ci:*** https://gw/%h' ci@board python",
        ),
        ("env API_TOKEN=hunter2 adb shell python", "env API_TOKEN=*** adb shell python"),
        (
            "ssh -o ProxyCommand='curl https://u:hunter2@gw/x' board",
            "ssh -o 'ProxyCommand=curl https://u:***@gw/x' board",
        ),
        ("curl -H 'Authorization: Bearer hunter2' -uci:hunter2 x", "curl -H 'Authorization: ***' -uci:*** x"),
        ("python -c 'print(1' 'hunter2", "***"),  # does not parse: masked whole
        # Not secrets: ssh's port, sudo's user, an ssh key file's path stay as they are.
        (
            "ssh -p 2222 -i ~/.ssh/ci ci@board sudo -u ci python",
            "ssh -p 2222 -i '~/.ssh/ci' ci@board sudo -u ci python",
        ),
    ],
)
def test_secrets_are_masked_in_every_common_form(command, masked):
    assert mask_command(command) == masked
    assert "hunter2" not in mask_command(command)


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


@pytest.mark.slow
def test_profile_runs_its_calls_on_the_device_and_names_it(tmp_path):
    import json
    import platform
    import subprocess

    import torch

    import pytest_backendconf as bc

    from lowering_models import SmallCNN

    x = torch.randn(2, 3, 8, 8)
    path = tmp_path / "cnn.bcpt"
    # Handles-only: the device gets the archive's bytes alone; the rows' source lines come from the host's .debug.
    bc.save(
        bc.to_backend(SmallCNN().eval(), "reference", {"forward": {}}, example_inputs=(x,)), path, debug_info="separate"
    )
    inputs = tmp_path / "inputs.json"
    inputs.write_text(json.dumps({"forward": [[x.tolist()]]}))
    trace = tmp_path / "trace.json"
    cli = [sys.executable, "-m", "pytest_backendconf.cli", "profile", str(path), "--inputs", str(inputs)]
    done = subprocess.run(
        [*cli, "--repeat", "3", "--chrome-trace", str(trace), "--target-command", f"{HERE} -X dev"],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr
    assert f"target: device {platform.machine()} (Python " in done.stdout and "-X dev" in done.stdout
    assert f"== forward on the device {platform.machine()}" in done.stdout
    assert "profile of 'forward' on backend 'reference': 3 call(s)" in done.stdout
    assert "aten::conv2d" in done.stdout and "conv(Conv2d)" in done.stdout
    assert len([e for e in json.loads(trace.read_text())["traceEvents"] if e.get("cat") == "node"]) == 3 * 6
    unreachable = subprocess.run([*cli, "--target-command", "false"], capture_output=True, text=True, timeout=120)
    assert unreachable.returncode == 4 and unreachable.stderr.count("cannot be reached") == 1, unreachable.stderr


@pytest.mark.slow
def test_the_runs_report_and_page_name_the_device(pytester):
    import json

    result = pytester.runpytest_subprocess(
        "--backend=reference",
        "--backendconf-select=availability::target-compile_yes-execute_yes",
        f"--backendconf-target-command={HERE} -X dev",
        "--backendconf-report=r.json",
        "--backendconf-html=r.html",
        timeout=600,
    )
    assert result.ret == 0, result.stdout.str()[-3000:]
    target = json.loads((pytester.path / "r.json").read_text())["run"]["target"]
    assert target["command"].endswith("-X dev") and target["machine"] == __import__("platform").machine()
    assert target["backends"]["reference"]["distribution"] == "backendconf-reference"
    assert target["connect_seconds"] > 0 and target["round_trip_ms"] > 0
    page = (pytester.path / "r.html").read_text()
    assert "<dt>Target device</dt>" in page and "-X dev</dd>" in page


@pytest.mark.slow
def test_the_golden_archives_replay_on_the_device_in_the_same_run(pytester):
    import json

    args = [
        "--backend=reference",
        "--backendconf-select=parity::mlp[[]float32]",
        "--backendconf-golden=gold",
        f"--backendconf-target-command={HERE} -X dev",
        "--backendconf-replay-on-target",
        "--backendconf-report=r.json",
        "-p",
        "no:cacheprovider",
    ]
    result = pytester.runpytest_subprocess(*args, timeout=600)
    assert result.ret == 0, result.stdout.str()[-3000:]
    result.stdout.fnmatch_lines(
        ["*replay on the target device *: 3/3 bundles of 1 golden archive match their expected outputs*"]
    )
    report = json.loads((pytester.path / "r.json").read_text())
    replayed = [t for t in report["tests"] if t["category"] == "replay"]
    assert [t["id"] for t in replayed] == [f"backendconf::replay::parity.mlp.float32.forward[{i}]" for i in range(3)]
    assert all(t["outcome"] == "passed" for t in replayed) and report["summary"]["replay"]["passed"] == 3
    assert report["tests"][0]["category"] == "parity" and report["tests"][0]["outcome"] == "passed"

    # An archive spoiled after the run wrote it (a conftest, before the replay): the run fails on the replay.
    pytester.makeconftest(
        """
import pytest

@pytest.hookimpl(tryfirst=True)
def pytest_sessionfinish(session):
    path = session.config.rootpath / "gold" / "parity.mlp.float32.bcpt"
    path.write_bytes(path.read_bytes()[:100])
"""
    )
    spoiled = pytester.runpytest_subprocess(*args, timeout=600)
    assert spoiled.ret == 1, spoiled.stdout.str()[-3000:]
    spoiled.stdout.fnmatch_lines(["*replay on the target device *: 0/1 bundles of 1 golden archive match*"])
    tests = json.loads((pytester.path / "r.json").read_text())["tests"]
    assert [t["outcome"] for t in tests] == ["passed", "error"] and tests[1]["category"] == "replay"


@pytest.mark.slow
def test_replay_on_target_needs_a_golden_folder_and_a_device(pytester):
    alone = pytester.runpytest_subprocess("--backend=reference", "--backendconf-replay-on-target")
    assert alone.ret == 4
    alone.stderr.fnmatch_lines(
        [
            "*--backendconf-replay-on-target needs --backendconf-golden=DIR (the archives to replay) and "
            "--backendconf-target-command=CMD (the device): add it*"
        ]
    )
