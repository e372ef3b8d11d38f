"""Every reader of a file that may come from elsewhere refuses a FIFO, a device, and a link it did not name.

Real FIFOs (`os.mkfifo`), real devices (``/dev/zero``) and real links. A FIFO opened for reading
waits for a writer forever, so the readers run in a child process with a timeout: a regression
fails the test instead of hanging the suite (and a memory cap keeps ``/dev/zero`` from eating the
machine). Before the fix each of these blocked, read without end, or read through the link.
"""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from pytest_backendconf.errors import ReportError
from pytest_backendconf.report import read_report, read_reports

from test_report_merge import make_report

ROOT = Path(__file__).resolve().parent.parent

READERS = r"""
import sys
from pathlib import Path
path = sys.argv[1]

def attempt(what, call):
    try:
        call()
    except BaseException as exc:
        print(f"{what}: {type(exc).__name__}: {exc}")
    else:
        print(f"{what}: read")

from pytest_backendconf.report import read_report
from pytest_backendconf.report._known_failures import load_known_failures_file
from pytest_backendconf.archive import read_tensors
from pytest_backendconf.cli._inputs import calls_from_file
import pytest_backendconf as bc

attempt("report", lambda: read_report(path))
attempt("known failures", lambda: load_known_failures_file(Path(path), "--known-failures"))
attempt("tensor file", lambda: read_tensors(path))
attempt("archive", lambda: bc.read_archive(path))
attempt("sidecar", lambda: bc.symbolicate(path, [0]))
attempt("inputs", lambda: calls_from_file(None, path))
"""
EXPECTED_ERRORS = {
    "report": "ReportError",
    "known failures": "ReportError",
    "tensor file": "TensorFileError",
    "archive": "ArchiveError",
    "sidecar": "ArchiveError",
    "inputs": "SpecialFileError",  # an OSError: the commands say `backendconf: error: cannot read ...`
}


def run_bounded(script: str, *args: str) -> str:
    """The output of ``python -c script args`` in a child that must end within 2 minutes (a FIFO read
    blocks forever) in at most 6 GiB of address space (``/dev/zero`` read whole would take the machine)."""
    import resource

    def cap_memory() -> None:
        resource.setrlimit(resource.RLIMIT_AS, (6 * 2**30, 6 * 2**30))

    done = subprocess.run(
        [sys.executable, "-c", script, *args],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=ROOT,
        preexec_fn=cap_memory,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    return done.stdout


def _run_readers(path: Path) -> dict[str, str]:
    return dict(line.split(": ", 1) for line in run_bounded(READERS, str(path)).splitlines())


@pytest.mark.parametrize("kind", ["fifo", "device", "link to a fifo"])
def test_every_reader_refuses_a_fifo_or_a_device_promptly_naming_it(tmp_path, kind):
    if kind == "device":
        path, what = Path("/dev/zero"), "a character device"
    else:
        fifo = tmp_path / "planted.json"
        os.mkfifo(fifo)
        path, what = fifo, "a FIFO (named pipe)"
        if kind == "link to a fifo":  # a link the user named is followed, to what it is
            path = tmp_path / "named.json"
            path.symlink_to(fifo)
    found = _run_readers(path)
    assert set(found) == set(EXPECTED_ERRORS)
    for reader, error in EXPECTED_ERRORS.items():
        name, _, text = found[reader].partition(": ")
        assert name == error, f"{reader}: {found[reader]}"
        assert f"is {what}, not a regular file" in text, f"{reader}: {found[reader]}"


def test_a_report_folders_link_is_refused_and_a_named_link_is_followed(tmp_path):
    elsewhere = tmp_path / "elsewhere.json"
    elsewhere.write_text(json.dumps(make_report()))
    folder = tmp_path / "reports"
    folder.mkdir()
    (folder / "a.json").symlink_to(elsewhere)
    with pytest.raises(ReportError, match=r"cannot read report '.*a\.json': is a symbolic link, not a regular file"):
        read_reports([str(folder)])
    assert read_report(folder / "a.json").tests  # named by the user: followed
    assert read_reports([str(folder / "a.json")])


def test_the_samples_cache_never_writes_through_a_planted_link(tmp_path):
    """Discovery wrote its index through ``<index>.tmp``: a link planted under that name was written through."""
    from pytest_backendconf.conformance.ops import discovery

    data = discovery.load(discovery.DATA_DIR, discovery.release())
    if data is None:
        pytest.skip("no shipped ops samples for this torch")
    victim = tmp_path / "precious.txt"
    victim.write_text("the user's work\n")
    cache = tmp_path / "cache"
    cache.mkdir()
    index, _ = discovery.data_paths(cache, data.torch_version, "all")
    Path(str(index.with_suffix(".json.tmp"))).symlink_to(victim)
    discovery.save(dataclasses.replace(data, samples=data.samples[:3]), cache, "all")
    assert victim.read_text() == "the user's work\n"
    assert discovery.load(cache, data.torch_version, "all") is not None

    index.unlink()
    index.symlink_to(victim)  # a link in the cache's own place: refused, named, discovered again
    with pytest.raises(discovery.OpsDataError, match="is a symbolic link, not a regular file; remove it"):
        discovery.load(cache, data.torch_version, "all")
    index.unlink()
    os.mkfifo(index)
    with pytest.raises(discovery.OpsDataError, match=r"is a FIFO \(named pipe\), not a regular file"):
        discovery.load(cache, data.torch_version, "all")


def test_replay_refuses_a_golden_folders_fifo_or_link_by_name(tmp_path):
    golden = tmp_path / "golden"
    golden.mkdir()
    os.mkfifo(golden / "parity-a.bcpt")
    (golden / "parity-b.bcpt").symlink_to("/etc/hostname")
    for listed, what in (("parity-a.bcpt", "a FIFO (named pipe)"), ("parity-b.bcpt", "a symbolic link")):
        (golden / "index.json").write_text(json.dumps({"archives": [{"archive": listed}]}))
        done = subprocess.run(
            [sys.executable, "-m", "pytest_backendconf.cli", "replay", str(golden)],
            capture_output=True,
            text=True,
            timeout=120,
            cwd=ROOT,
        )
        assert done.returncode == 1, done.stderr
        assert f"'{golden / listed}' is {what}, not a regular file" in done.stderr
