"""What the report commands and reproduce lines say."""

from __future__ import annotations

import json
from report_records import document_of


# `report ops | head` ending quietly is tests/test_report_merge.py::test_report_output_into_a_closed_pipe_ends_quietly.


def test_only_checks_that_draw_inputs_name_the_seed_in_their_reproduce_line(pytester):
    pytester.makeini("[pytest]\n")
    pytester.runpytest(
        "--backend=reference",
        "-p",
        "no:cacheprovider",
        "--backendconf-hypothesis=dev",
        "--hypothesis-seed=12345",
        "--backendconf-select=backendconf::contract::*mlp*",
        "--backendconf-select=backendconf::parity::mlp[[]float32]",
        "--backendconf-report=report.json",
    )
    tests = json.loads((pytester.path / "report.json").read_text())["tests"]
    contract = [t for t in tests if t["category"] == "contract"]
    (parity,) = [t for t in tests if t["category"] == "parity"]
    assert contract and not any("--hypothesis-seed" in t["reproduce"] for t in contract)
    assert parity["reproduce"].endswith("--backendconf-hypothesis=dev --hypothesis-seed=12345")


def _failing_report(path):
    test = {
        "id": "backendconf::parity::linear[float32]",
        "category": "parity",
        "stage": "execute",
        "outcome": "failed",
        "reproduce": "pytest --backend=b",
        "error": {"type": "OutputSpecError", "module": "pytest_backendconf.errors", "message": "float64 outputs"},
    }
    path.write_text(json.dumps(document_of([test], "b")))
    return path


def test_known_failures_written_to_stdout_through_a_pipe_do_not_hang(tmp_path):
    import subprocess
    import sys

    if sys.version_info >= (3, 11):
        import tomllib
    else:  # pragma: no cover
        import tomli as tomllib

    report = _failing_report(tmp_path / "report.json")
    done = subprocess.run(
        [sys.executable, "-m", "pytest_backendconf.cli", "report", "known-failures", str(report), "-o", "/dev/stdout"],
        capture_output=True,
        text=True,
        timeout=120,  # it read the output path for old entries, and blocked on the pipe
    )
    assert done.returncode == 0, done.stderr
    entries = tomllib.loads(done.stdout)  # the file alone: the count went to stderr
    assert entries == {
        "backendconf::parity::linear[float32]": {"reason": "OutputSpecError: float64 outputs", "link": ""}
    }
    assert "backendconf: wrote 1 known failure to /dev/stdout (1 added, 0 removed)" in done.stderr


def test_known_failures_written_into_a_named_pipe(tmp_path):
    import os
    import subprocess
    import sys
    import threading

    report = _failing_report(tmp_path / "report.json")
    fifo = tmp_path / "known.fifo"
    os.mkfifo(fifo)
    writer = subprocess.Popen(
        [sys.executable, "-m", "pytest_backendconf.cli", "report", "known-failures", str(report), "-o", str(fifo)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    read: list[str] = []

    def reader() -> None:  # blocks until a writer opens the pipe
        with open(fifo, encoding="utf-8") as pipe:
            read.append(pipe.read())

    thread = threading.Thread(target=reader, daemon=True)
    thread.start()
    try:
        out, err = writer.communicate(timeout=120)
    except subprocess.TimeoutExpired:
        writer.kill()
        os.close(os.open(fifo, os.O_WRONLY | os.O_NONBLOCK))  # let the reader go
        raise
    finally:
        thread.join(timeout=10)
    assert writer.returncode == 0, err
    assert '"backendconf::parity::linear[float32]" = { reason = "OutputSpecError: float64 outputs"' in read[0]
    assert fifo.exists() and not fifo.is_file()  # written through, not replaced by a regular file
