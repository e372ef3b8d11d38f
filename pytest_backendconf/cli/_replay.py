"""``backendconf replay PATH [PATH ...]``: the device half of vendor CI.

Each archive (or every archive of a folder: those its ``index.json`` lists
when ``pytest --backendconf-golden=DIR`` wrote it, else its ``*.bcpt``
files) is loaded on a simulated target, as ``run-target`` loads it, and
every bundled input is run and compared with its expected outputs
(`target.replay_archives`). The exit status is 0 only when every bundle
matches. ``--report`` writes the suite's report schema (category
``replay``, one test per bundle, ids ``backendconf::replay::<archive>.<method>[<n>]``)
so that ``backendconf report merge`` and ``report html host.json device.json``
put host and device side by side; ``--junitxml`` writes JUnit XML for CI
systems. Only torch, the backend's runtime and this package are imported:
no pytest, no Hypothesis.
"""

from __future__ import annotations

import argparse
import json
import os
import time
from typing import Any, Sequence

from ._options import add_target_options, connect_target, file_errors, printing_aside, unreachable

#: What a golden folder's index is called (`suite._golden` writes it).
INDEX = "index.json"
CATEGORY = "replay"


def add_command(commands: argparse._SubParsersAction) -> None:
    replay = commands.add_parser(
        "replay",
        help="run archives' bundled inputs on a simulated target and compare with their expected outputs",
        description="Load each ARCHIVE (or each archive of a folder, e.g. one written by pytest "
        "--backendconf-golden=DIR) in a fresh process in which the backend's host_only_modules and "
        "torch's tracing entry points cannot be imported, run every bundled input and compare the "
        "outputs with the expected ones stored beside it. Exit status 0 only when every bundle matches.",
    )
    replay.add_argument("paths", metavar="PATH", nargs="+", help="an archive, or a folder of archives")
    replay.add_argument(
        "--report",
        metavar="FILE",
        help="write the results as a backendconf report (JSON); '-' writes it to standard output",
    )
    replay.add_argument(
        "--junitxml", metavar="FILE", help="write the results as JUnit XML; '-' writes it to standard output"
    )
    add_target_options(replay)
    replay.add_argument("--timeout", type=float, default=120, metavar="SECONDS", help="per archive (default 120)")
    replay.set_defaults(run=run)


def archive_paths(paths: Sequence[str]) -> list[str]:
    """The archives of ``paths``: files as given; a folder's index entries, else its ``*.bcpt`` files, sorted."""
    from ..errors import BackendConfError

    found: list[str] = []
    for path in paths:
        if os.path.isdir(path):
            index = os.path.join(path, INDEX)
            if os.path.lexists(index):
                listed = [os.path.join(path, name) for name in _index_files(index)]
            else:
                listed = sorted(os.path.join(path, n) for n in os.listdir(path) if n.endswith(".bcpt"))
            # A folder's files may come from elsewhere (a CI artifact): each must be a file of its own,
            # not a link out of the folder, a FIFO or a device.
            found += [_regular(file, follow_symlinks=False) for file in listed]
        elif os.path.lexists(path):
            found.append(_regular(path, follow_symlinks=True))  # a link the user named is followed
        else:
            raise BackendConfError(f"{path!r} does not exist; give archives or folders of them")
    if not found:
        raise BackendConfError(f"no archives in {', '.join(map(repr, paths))} (*.bcpt files, or a folder's {INDEX})")
    return found


def _regular(path: str, *, follow_symlinks: bool) -> str:
    """``path``, if it is a regular file (an archive); a `BackendConfError` naming what it is otherwise."""
    from ..archive import SpecialFileError, check_regular_file
    from ..errors import BackendConfError

    try:
        check_regular_file(path, follow_symlinks=follow_symlinks)
    except SpecialFileError as exc:
        raise BackendConfError(str(exc)) from None
    except OSError as exc:
        raise BackendConfError(f"cannot read {path!r} ({exc.strerror or exc})") from None
    return path


#: Bounds of a golden folder's index, checked before it is parsed (docs/security.md): a suite run lists
#: one entry per golden check (a few hundred, under 100 bytes each), so these leave room tenfold over.
MAX_INDEX_BYTES = 4 * 1024 * 1024
MAX_INDEX_ENTRIES = 20_000


def _index_files(index: str) -> list[str]:
    """The archive names ``index`` lists: bounded in size, depth and count, each a file of its folder, once."""
    from ..archive import FileTooLargeError, read_regular_file
    from ..errors import BackendConfError
    from ..report import load_json

    fix = "write the folder again with pytest --backendconf-golden=DIR, or delete the index to replay every *.bcpt file"
    try:
        data = read_regular_file(index, MAX_INDEX_BYTES)  # a file of the folder: no link, FIFO or device
    except FileTooLargeError:
        raise BackendConfError(
            f"{index!r} is larger than {MAX_INDEX_BYTES // (1024 * 1024)} MiB, more than any golden folder's index "
            f"(one short entry per golden check); {fix}"
        ) from None
    except OSError as exc:
        raise BackendConfError(f"cannot read {index!r} ({exc.strerror or exc}); {fix}") from None
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise BackendConfError(f"{index!r} is not UTF-8 text ({exc}); {fix}") from None
    # Depth-checked before parsing (`report.load_json`): a deeply nested index is a clean error, not a RecursionError.
    document = load_json(text, f"{index!r}", fix, error=BackendConfError)
    try:
        names = [entry["archive"] for entry in document["archives"]]
    except (KeyError, TypeError) as exc:
        raise BackendConfError(
            f"{index!r} is not a golden folder's index ({type(exc).__name__}: {exc}); {fix}"
        ) from None
    if len(names) > MAX_INDEX_ENTRIES:
        raise BackendConfError(
            f"{index!r} lists {len(names):,} archives; at most {MAX_INDEX_ENTRIES:,} are replayed from one index. {fix}"
        )
    seen: set[str] = set()
    for name in names:
        # A name from the file: a plain file name in the folder, never a path out of it.
        if not isinstance(name, str) or os.path.basename(name) != name or name in ("", ".", ".."):
            raise BackendConfError(f"{index!r} lists {name!r}, which is not a file name in its folder")
        if name in seen:
            raise BackendConfError(f"{index!r} lists {name!r} more than once; an index names each archive once. {fix}")
        seen.add(name)
    return names


@unreachable
@file_errors
def run(args: argparse.Namespace) -> int:
    """The command; what comes from the files is escaped (`printable`) before it reaches the terminal."""
    from ..archive import output_file
    from ..errors import BackendConfError
    from ..report import printable
    from ..target import replay_archives

    started = time.time()
    paths = archive_paths(args.paths)
    report = output_file("--report", args.report) if args.report is not None else None
    junit = output_file("--junitxml", args.junitxml) if args.junitxml is not None else None
    if report is not None and junit is not None and report.to_stdout and junit.to_stdout:
        raise BackendConfError("--report and --junitxml both name standard output; give one of them a file name")
    aside = printing_aside(report, junit)  # the bundles' lines, when a document has standard output
    with aside:
        device = connect_target(args)
        results = replay_archives(paths, plugins=args.plugins, blocked_modules=args.blocked, timeout=args.timeout)
        for result in results:
            label = f"{result.outcome.upper():6} {test_id(result)}"
            print(printable(label))
            if result.outcome != "passed" and result.message:
                for line in result.message.splitlines():
                    print(printable(f"    {line}"))
        passed = sum(r.outcome == "passed" for r in results)
        print(f"replay: {passed}/{len(results)} bundles match their expected outputs ({len(paths)} archives)")
    status = 0 if results and passed == len(results) else 1
    if report is not None:
        report.write(json.dumps(report_document(results, status, started, device), indent=2) + "\n")
        with aside:
            print(printable(f"replay: report written to {report.name}"))
    if junit is not None:
        junit.write(junit_xml(results, time.time() - started))
        with aside:
            print(printable(f"replay: JUnit XML written to {junit.name}"))
    return status


def test_id(result: Any) -> str:
    """``backendconf::replay::<archive stem>.<method>[<n>]`` (`report.replay_test_id`)."""
    from ..report import replay_test_id

    return replay_test_id(result)


def _stem(path: str) -> str:
    from ..report import archive_stem

    return archive_stem(path)


def report_document(results: Sequence[Any], status: int, started: float, device: dict | None = None) -> dict[str, Any]:
    """The results in the suite's report document (`report.report_document`, its one writer), category
    ``replay``: one test per bundle."""
    from ..report import replay_test_results, report_document as write, run_entry

    backends = sorted({r.backend for r in results if r.backend})
    tests = replay_test_results(results)
    backend = {
        "name": ",".join(backends) or "?",
        "source": "archives replayed by backendconf replay",
        "distribution": None,
        "version": None,
        "available": True,
        "unavailable_reason": None,
    }
    return write(
        tests,
        backend=backend,
        run={**run_entry(started, status), **({"target": device} if device else {})},
        pytest_version=None,  # the device side runs without pytest
        categories=(CATEGORY,),
    )


def junit_xml(results: Sequence[Any], duration: float) -> str:
    """One ``<testcase>`` per bundle (classname ``backendconf.replay.<archive>``), failures with their text."""
    from xml.etree import ElementTree as ET

    from .._quoting import xml_text

    def text(value: str) -> str:
        # ElementTree escapes the markup; what XML 1.0 cannot hold at all is shown escaped (`xml_text`).
        return xml_text(str(value), markup=False)

    failures = sum(r.outcome == "failed" for r in results)
    errors = sum(r.outcome == "error" for r in results)
    suite = ET.Element(
        "testsuite",
        name="backendconf replay",
        tests=str(len(results)),
        failures=str(failures),
        errors=str(errors),
        skipped="0",
        time=f"{duration:.3f}",
    )
    for r in results:
        case = ET.SubElement(
            suite,
            "testcase",
            classname=text(f"backendconf.replay.{_stem(r.archive)}"),
            name=text(f"{r.method}[{r.index}]"),
            time=f"{r.duration:.3f}",
        )
        if r.outcome != "passed":
            tag = "failure" if r.outcome == "failed" else "error"
            element = ET.SubElement(
                case,
                tag,
                type=text((r.error or {}).get("type", r.outcome)),
                message=text((r.message or "").split("\n")[0]),
            )
            element.text = text(r.message or "")
    testsuites = ET.Element("testsuites")
    testsuites.append(suite)
    return '<?xml version="1.0" encoding="utf-8"?>\n' + ET.tostring(testsuites, encoding="unicode") + "\n"
