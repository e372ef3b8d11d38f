"""The target half on a device reached by a real OpenSSH server on 127.0.0.1 (devices/ssh-device.sh).

The device is the target venv `make target-venv` builds (torch, the reference backend and this
checkout with --no-deps: no pytest, no Hypothesis), run by its ``device-python`` wrapper, which logs
each start to ``started.log`` and hides /tmp and the checkout from the device, so a path that leaked
into a message fails instead of working by accident. Slow (each connection imports torch on the
device): `make test-slow` builds the venv first; elsewhere these tests skip, saying what is missing.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from device_source import ROOT, source_hash

pytestmark = pytest.mark.slow

TARGET_VENV = Path(os.environ.get("TARGET_VENV", Path.home() / ".cache/backendconf/target-venv"))
SCRIPT = ROOT / "devices" / "ssh-device.sh"


def _missing() -> str | None:
    if not os.path.exists("/usr/sbin/sshd") or shutil.which("ssh") is None:
        return "openssh-server is not installed (.ci/run installs it: apt-get install -y openssh-server)"
    if not shutil.which("unshare"):
        return "unshare (util-linux) is missing: the device wrapper needs it"
    stamp = TARGET_VENV / "source-hash"
    if not (TARGET_VENV / "bin" / "device-python").exists() or not stamp.exists():
        return f"no target venv at {TARGET_VENV}: run `make target-venv`"
    if stamp.read_text().strip() != source_hash():
        return f"the target venv at {TARGET_VENV} runs older sources than this checkout: run `make target-venv`"
    return None


@pytest.fixture(scope="session")
def device(tmp_path_factory):
    why = _missing()
    if why:
        pytest.skip(why)
    folder = tmp_path_factory.mktemp("sshd")
    started = subprocess.run([str(SCRIPT), "start", str(folder)], capture_output=True, text=True, timeout=120)
    assert started.returncode == 0, started.stderr
    ssh = (folder / "ssh-command").read_text().strip()
    yield {"folder": folder, "command": f"{ssh} -o ConnectTimeout=5 {TARGET_VENV}/bin/device-python", "ssh": ssh}
    subprocess.run([str(SCRIPT), "stop", str(folder)], timeout=60)


def _starts() -> list[str]:
    log = TARGET_VENV / "started.log"
    return log.read_text().splitlines() if log.exists() else []


def test_serialization_and_availability_pass_on_the_device(device, pytester):
    before = len(_starts())
    result = pytester.runpytest_subprocess(
        "--backend=reference",
        "-m",
        "serialization or availability",
        f"--backendconf-target-command={device['command']}",
        timeout=900,
    )
    assert result.ret == 0, result.stdout.str()[-3000:]
    result.stdout.fnmatch_lines(["*backendconf: target device x86_64 (Python *, torch 2.13.0*", "*target link: *"])
    runners = [line for line in _starts()[before:] if "-m pytest_backendconf.target" in line]
    assert runners, "the device's wrapper did not log a runner start"


def test_replay_of_a_golden_folder_on_the_device(device, pytester, tmp_path):
    golden = tmp_path / "golden"
    made = pytester.runpytest_subprocess(
        "--backend=reference", "--backendconf-select=parity::mlp[[]float32]", f"--backendconf-golden={golden}"
    )
    assert made.ret == 0 and list(golden.glob("*.bcpt")), made.stdout.str()[-2000:]
    replay = subprocess.run(
        [sys.executable, "-m", "pytest_backendconf.cli", "replay", str(golden), "--target-command", device["command"]],
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert replay.returncode == 0, replay.stdout + replay.stderr
    assert "target: device x86_64" in replay.stdout and "bundles match" in replay.stdout


def test_the_runs_golden_archives_replay_on_the_device_in_the_same_run(device, pytester):
    import json

    result = pytester.runpytest_subprocess(
        "--backend=reference",
        "--backendconf-select=parity::mlp[[]float32]",
        "--backendconf-golden=gold",
        f"--backendconf-target-command={device['command']}",
        "--backendconf-replay-on-target",
        "--backendconf-report=r.json",
        timeout=900,
    )
    assert result.ret == 0, result.stdout.str()[-3000:]
    # The device sees neither /tmp nor the checkout (device-python): the archives went there as bytes.
    result.stdout.fnmatch_lines(["*replay on the target device x86_64: 3/3 bundles of 1 golden archive match*"])
    report = json.loads((pytester.path / "r.json").read_text())
    assert report["summary"]["replay"]["passed"] == 3 and report["run"]["target"]["machine"] == "x86_64"


def test_a_dropped_connection_is_target_unreachable_and_the_next_request_reconnects(device):
    from pytest_backendconf.target import Ended, current_link, use_target_command

    use_target_command(device["command"])
    try:
        link = current_link()
        child = link.child("pytest_backendconf.target._child:Echo", plugins=[])
        assert child.request({"say": "hi"}, timeout=300)["said"] == "hi"
        answer: list = []
        waiting = threading.Thread(target=lambda: answer.append(child.request({"sleep": 60}, timeout=120)))
        waiting.start()
        time.sleep(1)
        subprocess.run([str(SCRIPT), "drop", str(device["folder"])], check=True, timeout=30)
        waiting.join(60)
        ended = answer[0]
        assert isinstance(ended, Ended) and ended.unreachable and not ended.crashed, ended
        fresh = current_link()
        assert fresh is not link
        again = fresh.child("pytest_backendconf.target._child:Echo", plugins=[])
        assert again.request({"say": "back"}, timeout=300)["said"] == "back"
        again.close()
    finally:
        use_target_command(None)


def test_an_unreachable_ssh_device_at_start_is_one_usage_error(device, pytester):
    closed = device["ssh"].replace(f"-p {(device['folder'] / 'port').read_text().strip()}", "-p 1")
    result = pytester.runpytest_subprocess(
        "--backend=reference", "-m", "availability", f"--backendconf-target-command={closed} python3"
    )
    assert result.ret == 4
    assert len([line for line in result.stderr.lines if "cannot be reached" in line]) == 1, result.stderr.str()


#: A plugin (-p: a conftest's runtest hooks would not see the suite's checks, which live in the package)
#: for the run below. From the first target-stage check on, it watches the device's processes; once a
#: worker (a fork of the runner) has been busy for BUSY seconds of CPU, i.e. in the middle of its
#: requests, every ssh connection is dropped (devices/ssh-device.sh drop), once. The check that was
#: running there gets the link's failure; the worker's other work is retried on a fresh connection.
#: drops.txt gets the id of the check during which the drop happened.
DROP_PLUGIN = """
import os, subprocess, threading, time

SCRIPT, FOLDER, PYTHON = {script!r}, {folder!r}, {python!r}
BUSY = 0.5
state = {{"watching": False, "check": None}}
TICK = os.sysconf("SC_CLK_TCK")


def _processes():
    found = {{}}
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{{pid}}/cmdline", "rb") as f:
                argv = f.read().split(b"\\0")
            with open(f"/proc/{{pid}}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue
        if argv[0] == PYTHON.encode() and b"pytest_backendconf.target" in argv:
            found[int(pid)] = (int(fields[1]), (int(fields[11]) + int(fields[12])) / TICK)
    return found


def _watch():
    while True:
        time.sleep(0.01)
        found = _processes()
        busy = [cpu for ppid, cpu in found.values() if ppid in found and cpu >= BUSY]  # workers only
        if busy:
            subprocess.run([SCRIPT, "drop", FOLDER], check=True, timeout=30)
            with open("drops.txt", "a") as f:
                f.write(state["check"] + "\\n")
            return


def pytest_runtest_call(item):
    if "target" in item.nodeid:
        state["check"] = item.nodeid
        if not state["watching"]:
            state["watching"] = True
            threading.Thread(target=_watch, daemon=True).start()
"""


def test_sshd_dropping_its_connections_mid_run_is_target_unreachable_and_the_run_goes_on(device, pytester):
    import json

    pytester.makepyfile(
        backendconf_dropper=DROP_PLUGIN.format(
            script=str(SCRIPT), folder=str(device["folder"]), python=f"{TARGET_VENV}/bin/python"
        )
    )
    # The drop is triggered from outside while a device worker is busy; on a loaded machine it can
    # land between two requests, which costs no check (the next request reconnects): then the run
    # must be green, and the scenario is tried again, up to three times, until a drop costs one.
    for attempt in range(3):
        (pytester.path / "drops.txt").unlink(missing_ok=True)
        started = time.monotonic()
        result = pytester.runpytest_subprocess(
            "--backend=reference",
            "-m",
            "serialization or availability",
            f"--backendconf-target-command={device['command']}",
            "--backendconf-report=r.json",
            "-p",
            "backendconf_dropper",
            "-p",
            "no:cacheprovider",
            timeout=1800,
        )
        print(f"attempt {attempt + 1}: the run took {time.monotonic() - started:.0f} s")
        dropped = (pytester.path / "drops.txt").read_text().split()
        assert len(dropped) == 1, result.stdout.str()[-3000:]
        tests = json.loads((pytester.path / "r.json").read_text())["tests"]
        failed = [t for t in tests if t["outcome"] != "passed"]
        if failed:
            break
        assert result.ret == 0, result.stdout.str()[-2000:]  # a drop between requests: nothing lost
    assert failed, "in three runs the drop never cost a check: " + result.stdout.str()[-2000:]
    for test in failed:  # the link's failure, never the backend's
        assert (
            test["error"]["type"] == "TargetUnreachable" and "without the runner reporting" in test["error"]["message"]
        )
    assert result.ret == 1  # the run finished: failures, not an internal error or an interrupt
    at = next(i for i, t in enumerate(tests) if t["id"] == dropped[0])
    later = [t for t in tests[at + 1 :] if "target" in t["id"] and t not in failed]
    assert later and all(t["outcome"] == "passed" for t in later)  # the rest ran on a fresh connection
