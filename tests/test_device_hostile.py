"""A device is untrusted (docs/security.md): forged verdicts, missing and extra answers, endless and malformed
frames, a malformed hello. Each device here is tests/hostile_device.py, a real process behind the target command.

The seeded fuzz of the frames is tests/test_fuzz_device_frames.py.
"""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys

import pytest
import torch

import pytest_backendconf as bc
from pytest_backendconf.cli import main
from pytest_backendconf.errors import TargetUnreachable
from pytest_backendconf.target import Ended, TargetLink, probe, use_target_command

TESTS = os.path.dirname(os.path.abspath(__file__))
ECHO = "pytest_backendconf.target._child:Echo"
X1, X2 = torch.linspace(-2, 2, 12).reshape(3, 4), torch.linspace(0, 1, 12).reshape(3, 4)


def hostile(*mode: str) -> str:
    """The target command of a hostile device in ``mode`` (tests/hostile_device.py)."""
    return shlex.join([sys.executable, os.path.join(TESTS, "hostile_device.py"), *mode])


class SinScale(torch.nn.Module):
    def forward(self, x):
        return torch.sin(x) * 2


class CosScale(torch.nn.Module):
    def forward(self, x):
        return torch.cos(x) * 2


@pytest.fixture(scope="module")
def archives(tmp_path_factory):
    """``good.bcpt`` (its bundles match) and ``wrong.bcpt`` (its expected outputs are another model's)."""
    folder = tmp_path_factory.mktemp("hostile")
    lowered = bc.to_backend(SinScale(), "reference", {"forward": {}}, example_inputs=(X1,))
    bc.save(lowered, folder / "good.bcpt", bundled_inputs={"forward": [(X1,), (X2,)]}, eager=SinScale())
    bc.save(lowered, folder / "wrong.bcpt", bundled_inputs={"forward": [(X1,), (X2,)]}, eager=CosScale())
    return folder


@pytest.fixture
def local_again():
    """The commands below set this process's target command; the next test runs locally again."""
    yield
    use_target_command(None)


# --- the host decides the verdicts ----------------------------------------------------------------


def test_an_archive_that_fails_here_fails_on_a_device_that_forges_its_verdict(archives, capsys, local_again):
    assert main(["replay", str(archives / "wrong.bcpt")]) == 1
    assert "replay: 0/2 bundles match their expected outputs (1 archives)" in capsys.readouterr().out
    # The device answers "forward[0] passed" without running anything: the host counts the archive's bundles
    # itself and judges outputs, of which the device returned none.
    assert main(["replay", str(archives / "wrong.bcpt"), "--target-command", hostile("verdict")]) == 1
    out = capsys.readouterr().out
    assert "replay: 0/2 bundles match their expected outputs (1 archives)" in out
    assert "ERROR  backendconf::replay::wrong.forward[1]" in out
    assert "the target returned no outputs for bundle forward[1]" in out


def test_the_host_judges_the_outputs_a_device_returns(archives, capsys, local_again):
    # This device returns the archive's own expected outputs: the host holds them to the bundles it read itself.
    assert main(["replay", str(archives / "good.bcpt"), "--target-command", hostile("expected")]) == 0
    assert "replay: 2/2 bundles match their expected outputs (1 archives)" in capsys.readouterr().out


@pytest.mark.parametrize(
    ("how", "line", "text"),
    [
        (
            "drop=1",
            "ERROR  backendconf::replay::good.forward[1]",
            "the target returned no outputs for bundle forward[1]",
        ),
        ("twice=0", "ERROR  backendconf::replay::good.forward[0]", "the target answered for bundle forward[0] twice"),
        (
            "extra=5",
            "ERROR  backendconf::replay::good.-[0]",
            "the target answered for bundle forward[5], which the archive does not hold",
        ),
    ],
)
def test_a_missing_duplicate_or_extra_answer_is_an_error_naming_the_bundle(
    archives, capsys, local_again, how, line, text
):
    command = hostile("expected", how)
    assert main(["replay", str(archives / "good.bcpt"), "--target-command", command]) == 1
    out = capsys.readouterr().out
    assert line in out and text in out, out
    assert "replay: 2/2" not in out and "replay: 3/3" not in out


def test_the_suites_replay_on_a_device_is_judged_on_the_host(pytester):
    result = pytester.runpytest(
        "--backend=reference",
        "--backendconf-select=parity::mlp[[]float32]",
        "--backendconf-golden=gold",
        f"--backendconf-target-command={hostile('verdict')}",
        "--backendconf-replay-on-target",
        "-p",
        "no:cacheprovider",
    )
    assert result.ret == 1, result.stdout.str()[-3000:]
    result.stdout.fnmatch_lines(["*replay on the target device hostile: 0/3 bundles of 1 golden archive match*"])


# --- frames: bounded and checked ------------------------------------------------------------------

#: A host that connects to the device and waits up to 60 s for the link to drop, its address space limited
#: to 1 GiB (a host that reads an endless line unbounded stops there instead of taking the machine's memory);
#: it prints the reason and its peak resident memory.
HOST = """
import resource, sys, time
resource.setrlimit(resource.RLIMIT_AS, (2**30, 2**30))
from pytest_backendconf.target import TargetLink
link = TargetLink(sys.argv[1])
link.connect()
deadline = time.monotonic() + 60
while link.lost is None and time.monotonic() < deadline:
    time.sleep(0.1)
print("lost:", str(link.lost)[:400])
# VmHWM, not getrusage's ru_maxrss: that one keeps the peak of the process that started this one (pytest's).
peak = [line for line in open("/proc/self/status") if line.startswith("VmHWM:")][0].split()[1]
print("peak MiB", int(peak) // 1024)
"""


@pytest.mark.skipif(sys.platform != "linux", reason="the peak is read from Linux's /proc")
def test_an_endless_frame_drops_the_link_with_the_host_memory_bounded():
    import pytest_backendconf.target as target

    done = subprocess.run([sys.executable, "-c", HOST, hostile("endless")], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    lost, peak = done.stdout.splitlines()
    cap = target.MAX_FRAME_BYTES
    assert "broke the runner protocol" in lost and f"longer than {cap:,} bytes" in lost, lost
    # Reading up to the cap holds about the cap; an interpreter without torch needs under 100 MiB.
    assert int(peak.split()[-1]) < 1.5 * cap // 2**20 + 100, peak


MALFORMED = {
    "not JSON": ('{"w": 1, "r": {"kind": "ready", "pid": 1}', "a line that is not JSON"),
    "not an object": ("[1, 2]", "the frame must be an object, got a list"),
    "no kind": ('{"w": 1}', "kind is null or nothing, not one of"),
    "an unknown kind": ('{"kind": "result"}', 'kind is "result", not one of'),
    "a worker named by a string": ('{"kind": "stderr", "w": "1", "data": "x"}', "w must be a count"),
    "stderr that is a number": ('{"kind": "stderr", "w": 1, "data": 5}', "data must be a string, got 5"),
    "an exit status that is text": ('{"kind": "ended", "w": 1, "returncode": "x"}', "returncode must be an integer"),
    "a record that is a number": ('{"w": 1, "r": 5}', "r must be an object, got 5"),
    "a record without a kind": ('{"w": 1, "r": {"pid": 1}}', "r.kind must be a string"),
    "a ready record without a pid": ('{"w": 1, "r": {"kind": "ready"}}', "r.pid must be an integer"),
    "a setup error that is text": (
        '{"w": 1, "r": {"kind": "setup_error", "error": "x"}}',
        'r.error must be an object, got "x"',
    ),
    "control characters": ('{"kind": "\\u001b[2J\\u0000"}', 'kind is "\\u001b[2J\\u0000", not one of'),
}


@pytest.mark.parametrize("name", list(MALFORMED))
def test_a_malformed_frame_drops_the_link_at_once_naming_what_is_wrong(name):
    line, text = MALFORMED[name]
    link = TargetLink(hostile(f"frame={line}"))
    link.connect()
    try:
        ended = link.child(ECHO, plugins=[], startup_timeout=30).request({"say": "x"}, timeout=30)
    finally:
        link.close()
    # Not a timeout after 30 s: the device went away after its frame, and the host noticed.
    assert isinstance(ended, Ended) and ended.unreachable and ended.timed_out is None, ended
    assert "broke the runner protocol" in ended.unreachable and text in ended.unreachable, ended.unreachable
    assert ended.unreachable.isprintable() and len(ended.unreachable) <= 600


@pytest.mark.parametrize(
    ("fields", "text"),
    [
        ({"backends": ["reference"]}, "backends must be an object, got a list"),
        ({"backends": {"reference": "1.0"}}, 'backends["reference"] must be an object, got "1.0"'),
        ({"pytest_backendconf": ["0.1.0"]}, "pytest_backendconf must be a string or null, got a list"),
        ({"pid": "1"}, "pid must be a count"),
        ({"protocol": "1"}, 'protocol must be an integer, got "1"'),
        ({"machine": {"x": 1}}, "machine must be a string, got an object"),
    ],
)
def test_a_malformed_hello_is_unreachable_naming_the_field(fields, text):
    with pytest.raises(TargetUnreachable) as raised:
        probe(hostile(f"hello={json.dumps(fields)}"))
    assert f"sent a malformed hello: {text}" in str(raised.value), str(raised.value)
    assert "install the same pytest-backendconf" in str(raised.value)


def test_a_malformed_hello_ends_pytest_with_the_usage_error(pytester):
    command = hostile('hello={"backends": ["reference"]}')
    result = pytester.runpytest_subprocess(
        "--backend=reference", "-m", "availability", f"--backendconf-target-command={command}"
    )
    assert result.ret == 4, result.stdout.str() + result.stderr.str()
    result.stderr.fnmatch_lines(
        ["*--backendconf-target-command:*a malformed hello: backends must be an object, got a list*"]
    )
    assert "INTERNALERROR" not in result.stdout.str() + result.stderr.str()


def test_a_malformed_hello_ends_a_command_with_exit_4(archives, capsys, local_again):
    command = hostile('hello={"backends": ["reference"]}')
    assert main(["replay", str(archives / "good.bcpt"), "--target-command", command]) == 4
    assert "a malformed hello: backends must be an object, got a list" in capsys.readouterr().err


def test_a_banner_before_hello_is_skipped():
    banner = f"""sh -c 'echo "Welcome to board-a"; echo "{{not json"; exec "$@"' device {hostile("expected")}"""
    assert probe(banner)["machine"] == "hostile"
