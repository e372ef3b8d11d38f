"""Where a command's output document goes (`archive.output_file`): ``-``, symlinks, pipes, and the check's errors.

The commands run in real ``backendconf`` processes where standard output matters: what reaches
the file descriptor is the point. The suite's options are in tests/test_gating.py.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from pytest_backendconf.archive import OutputPathError, output_file
from pytest_backendconf.cli import main

from test_report_cli import _failing_report
from test_report_merge import LINEAR, make_report
from test_shards import shard_reports

pytestmark = pytest.mark.skipif(sys.platform == "win32", reason="symlinks, FIFOs and /proc are POSIX")


def backendconf(*args: str, cwd: Path, stdout: int | object = subprocess.PIPE) -> subprocess.CompletedProcess:
    """``backendconf ARGS`` in a fresh process."""
    return subprocess.run(
        [sys.executable, "-m", "pytest_backendconf.cli", *args],
        cwd=cwd,
        stdout=stdout,
        stderr=subprocess.PIPE,
        text=True,
        timeout=120,
    )


def read_fifo(fifo: Path) -> tuple[threading.Thread, list[str]]:
    """A reader of ``fifo`` in a thread (a writer's open blocks until one is there), and what it reads."""
    read: list[str] = []

    def reader() -> None:
        with open(fifo, encoding="utf-8") as pipe:
            read.append(pipe.read())

    thread = threading.Thread(target=reader, daemon=True)
    thread.start()
    return thread, read


# --- the check ----------------------------------------------------------------------------------


def test_a_directory_is_refused_naming_the_option_the_value_and_the_fix(tmp_path):
    with pytest.raises(OutputPathError) as info:
        output_file("-o", str(tmp_path))
    assert str(info.value) == f"-o {str(tmp_path)!r}: that is a directory; give a file name in it"


def test_a_file_in_a_missing_folder_is_refused_naming_the_folder(tmp_path):
    with pytest.raises(OutputPathError) as info:
        output_file("--output", "no/such/r.html", base=tmp_path)
    assert str(info.value) == (
        f"--output 'no/such/r.html': the directory {str(tmp_path / 'no' / 'such')!r} does not exist; create it first"
    )


def test_a_symlink_into_a_missing_folder_is_refused_naming_the_folder_of_its_target(tmp_path):
    (tmp_path / "link.json").symlink_to(tmp_path / "gone" / "r.json")
    with pytest.raises(OutputPathError, match=r"the directory '.*gone' does not exist; create it first"):
        output_file("-o", str(tmp_path / "link.json"))


def test_a_command_names_the_option_the_value_and_the_fix_before_reading_anything(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "out").mkdir()
    assert main(["report", "known-failures", "missing.json", "-o", "out"]) == 1
    assert capsys.readouterr().err == "backendconf: error: -o 'out': that is a directory; give a file name in it\n"
    assert main(["report", "html", "missing.json", "-o", "no/such/index.html"]) == 1
    assert capsys.readouterr().err == (
        "backendconf: error: --output 'no/such/index.html': the directory 'no/such' does not exist; create it first\n"
    )


def test_standard_output_is_refused_where_the_command_prints_its_own_there(tmp_path):
    with pytest.raises(OutputPathError) as info:
        output_file("--chrome-trace", "-", stdout_carries="the profile's table")
    assert str(info.value) == (
        "--chrome-trace '-': that is standard output, which carries the profile's table; give a file name"
    )


def test_a_write_that_fails_names_the_option_and_the_reason(tmp_path):
    output = output_file("-o", str(tmp_path / "r.json"))
    (tmp_path / "r.json").mkdir()  # after the check: the write itself fails
    with pytest.raises(OutputPathError, match=r"cannot write -o '.*r\.json': Is a directory"):
        output.write("{}")


# --- how it is written ----------------------------------------------------------------------------


def test_dash_is_standard_output(capsys, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # where a file named "-" would appear
    output = output_file("-o", "-")
    output.write("the document\n")
    assert capsys.readouterr().out == "the document\n"
    assert output.to_stdout and output.name == "standard output" and output.old_file is None
    assert not (tmp_path / "-").exists()


def test_a_symlink_to_a_regular_file_stays_a_symlink_and_its_target_gets_the_document(tmp_path):
    target = tmp_path / "elsewhere" / "report.json"
    target.parent.mkdir()
    target.write_text("old")
    os.chmod(target, 0o644)
    link = tmp_path / "report.json"
    link.symlink_to(target)
    output = output_file("-o", str(link))
    assert output.old_file == link  # its old text may be kept (a known-failures file's comments)
    output.write("new")
    assert link.is_symlink() and os.readlink(link) == str(target)
    assert target.read_text() == "new"
    assert os.stat(target).st_mode & 0o777 == 0o644  # replaced atomically, its mode kept
    assert [p.name for p in target.parent.iterdir()] == ["report.json"]  # no temporary file left


def test_a_dangling_symlink_gets_its_target_written(tmp_path):
    link = tmp_path / "report.json"
    link.symlink_to("made.json")
    output_file("-o", str(link)).write("made")
    assert link.is_symlink() and (tmp_path / "made.json").read_text() == "made"


def test_a_symlink_to_a_fifo_is_written_as_a_stream_and_the_fifo_stays(tmp_path):
    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    link = tmp_path / "out.json"
    link.symlink_to(fifo)
    output = output_file("-o", str(link))
    assert output.old_file is None  # nothing to read from a pipe: it would block or eat the input
    thread, read = read_fifo(fifo)
    output.write("through the pipe")
    thread.join(timeout=10)
    assert read == ["through the pipe"]
    assert link.is_symlink() and not fifo.is_file() and fifo.exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out.json", "pipe"]


# --- every command: `-` is standard output, status lines go to standard error ---------------------


def test_report_html_to_standard_output(tmp_path):
    (tmp_path / "r.json").write_text(json.dumps(make_report()))
    done = backendconf("report", "html", "r.json", "-o", "-", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert done.stdout.lstrip().lower().startswith("<!doctype html") and done.stdout.rstrip().endswith("</html>")
    assert done.stderr == "backendconf: HTML report of 1 report written to standard output\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["r.json"]  # no file named "-"


def test_report_known_failures_to_standard_output_reads_nothing(tmp_path):
    _failing_report(tmp_path / "r.json")
    (tmp_path / "-").write_text('"backendconf::old::entry" = { reason = "a file named -" }\n')  # never read
    done = backendconf("report", "known-failures", "r.json", "-o", "-", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert '"backendconf::parity::linear[float32]" = { reason = "OutputSpecError: float64 outputs"' in done.stdout
    assert "backendconf::old::entry" not in done.stdout
    assert done.stderr == "backendconf: wrote 1 known failure to standard output (1 added, 0 removed)\n"


def test_report_merge_markdown_to_standard_output_and_the_text_to_standard_error(tmp_path):
    (tmp_path / "a.json").write_text(json.dumps(make_report()))
    (tmp_path / "b.json").write_text(json.dumps(make_report(torch="2.14.1", outcomes={LINEAR: "failed"})))
    done = backendconf("report", "merge", "a.json", "b.json", "--markdown", "-", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("#") and "| " in done.stdout  # the Markdown alone
    assert "written to" not in done.stdout and "backendconf: merged 2 reports" not in done.stdout
    assert done.stderr.endswith("backendconf: markdown written to standard output\n")
    assert done.stderr.startswith("backendconf: merged 2 reports\n")  # the text, beside the document


def test_report_merge_output_joins_shards_to_standard_output(tmp_path):
    for i, document in enumerate(shard_reports(tmp_path)):
        (tmp_path / f"s{i}.json").write_text(json.dumps(document))
    done = backendconf("report", "merge", "--output", "-", "s0.json", "s1.json", "s2.json", cwd=tmp_path)
    assert done.returncode == 1, done.stderr  # a check failed in a shard, as in the joined run
    joined = json.loads(done.stdout)
    assert len(joined["tests"]) == 6
    assert "backendconf: joined 3 of 3 shards of backend mybackend" in done.stderr
    assert "checks, written to standard output" in done.stderr
    assert "FAILED backendconf::serialization::round_trip[small_cnn]" in done.stderr


def test_profile_refuses_a_chrome_trace_on_standard_output(tmp_path, capsys):
    assert main(["profile", str(tmp_path / "m.bcpt"), "--example-inputs", "--chrome-trace", "-"]) == 1
    assert capsys.readouterr().err == (
        "backendconf: error: --chrome-trace '-': that is standard output, which carries the profile's table; "
        "give a file name\n"
    )


def test_replay_refuses_two_documents_on_standard_output(tmp_path, capsys):
    (tmp_path / "a.bcpt").write_bytes(b"")
    assert main(["replay", str(tmp_path / "a.bcpt"), "--report", "-", "--junitxml", "-"]) == 1
    assert "--report and --junitxml both name standard output; give one of them a file name" in capsys.readouterr().err


@pytest.mark.slow
@pytest.mark.parametrize("option", ["--report", "--junitxml"])
def test_replay_writes_its_document_to_standard_output_and_its_lines_to_standard_error(tmp_path, option):
    import torch

    import pytest_backendconf as bc

    x = torch.linspace(-2, 2, 12).reshape(3, 4)
    model = torch.nn.ReLU()
    lowered = bc.to_backend(model, "reference", {"forward": {}}, example_inputs=(x,))
    bc.save(lowered, tmp_path / "relu.bcpt", bundled_inputs={"forward": [(x,)]}, eager=model)
    done = backendconf("replay", "relu.bcpt", option, "-", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    if option == "--report":
        assert json.loads(done.stdout)["tests"][0]["id"] == "backendconf::replay::relu.forward[0]"
        assert done.stderr.endswith("replay: report written to standard output\n")
    else:
        assert done.stdout.startswith('<?xml version="1.0" encoding="utf-8"?>\n<testsuites>')
        assert done.stderr.endswith("replay: JUnit XML written to standard output\n")
    assert "PASSED backendconf::replay::relu.forward[0]" in done.stderr
    assert not (tmp_path / "-").exists()


# --- every command writes through symlinks and pipes ----------------------------------------------


def test_report_known_failures_through_a_symlink_keeps_the_link_and_the_targets_entries(tmp_path):
    _failing_report(tmp_path / "r.json")
    target = tmp_path / "ci" / "known.toml"
    target.parent.mkdir()
    target.write_text('# ours\n"backendconf::parity::mlp[float32]" = { reason = "kept" }\n')
    (tmp_path / "known.toml").symlink_to(target)
    done = backendconf("report", "known-failures", "r.json", "-o", "known.toml", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert (tmp_path / "known.toml").is_symlink()
    text = target.read_text()
    assert "# ours" in text and "kept" in text and "float64 outputs" in text
    assert "backendconf: wrote 2 known failures to known.toml (1 added, 0 removed)" in done.stdout


def test_report_html_through_a_symlink_to_a_fifo(tmp_path):
    (tmp_path / "r.json").write_text(json.dumps(make_report()))
    fifo = tmp_path / "page.fifo"
    os.mkfifo(fifo)
    (tmp_path / "index.html").symlink_to(fifo)
    thread, read = read_fifo(fifo)
    try:
        done = backendconf("report", "html", "r.json", "-o", "index.html", cwd=tmp_path)
    finally:
        if thread.is_alive():
            os.close(os.open(fifo, os.O_WRONLY | os.O_NONBLOCK))  # let the reader go
        thread.join(timeout=10)
    assert done.returncode == 0, done.stderr
    assert read and read[0].rstrip().endswith("</html>")
    assert (tmp_path / "index.html").is_symlink() and not fifo.is_file()
    assert done.stdout == "backendconf: HTML report of 1 report written to index.html\n"


@pytest.mark.skipif(not os.path.isdir("/proc/self/fd"), reason="/proc/self/fd names this process's files")
def test_a_path_that_is_standard_output_redirected_to_a_file_is_appended_to_not_replaced(tmp_path):
    # /dev/stdout itself is never used here: a symlink of our own stands for it.
    (tmp_path / "stdout").symlink_to("/proc/self/fd/1")
    _failing_report(tmp_path / "r.json")
    log = tmp_path / "log.txt"
    with open(log, "w") as out:
        out.write("earlier output\n")
        out.flush()
        done = backendconf("report", "known-failures", "r.json", "-o", "stdout", cwd=tmp_path, stdout=out)
    assert done.returncode == 0, done.stderr
    text = log.read_text()
    assert text.startswith("earlier output\n") and "float64 outputs" in text  # the shell's file, kept and appended to
    assert done.stderr == "backendconf: wrote 1 known failure to stdout (1 added, 0 removed)\n"
    assert (tmp_path / "stdout").is_symlink()
