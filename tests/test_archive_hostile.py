"""Hostile archive content with valid checksums: bombs, huge numbers, wrong types, and fuzzing.

A checksum is no signature: an attacker records the hash of whatever they
wrote. These archives are internally consistent (every size and SHA-256 in
the manifest fits), so only the reader's checks of the content stand
between them and the process. Every case must end in an `ArchiveError`
naming the entry (or load fine), quickly and without a large allocation.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import signal
import subprocess
import sys
import time
import zlib

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import pytest_backendconf as bc
from pytest_backendconf.archive import _zip as _archive_zip, _files
from pytest_backendconf.lowering import _saving
from pytest_backendconf.debuginfo import _symbolication
from pytest_backendconf.cli import _main as cli
from pytest_backendconf.errors import (
    ArchiveError,
    ArchiveFormatError,
    ArchiveManifestError,
    ArchiveSizeError,
    BackendConfError,
    BackendContractError,
)
from test_archive import X, TinyBackend, entries_of, lower
from test_archive import registry  # noqa: F401  (the module-scoped fixture: that module's backends)


@pytest.fixture(scope="module")
def rich():
    """An archive with attributes, a tensor, a parameter and debug rows."""
    lowered = lower()
    lowered.scale = torch.tensor([1.5, 2.0])
    lowered.settings = {"name": "n", 3: [True, None, 2.5], "pair": (1, 2.5)}
    return _saving.to_bytes(lowered)


def honest(entries: dict[str, bytes], deflated: frozenset = frozenset({"debug.json"})) -> bytes:
    """A zip in the archive's header layout whose manifest records every entry's true size and hash."""
    manifest = json.loads(entries["manifest.json"])
    stored = {}
    for n, d in entries.items():
        if n in deflated:
            c = zlib.compressobj(9, zlib.DEFLATED, -15)
            stored[n] = c.compress(d) + c.flush()
        else:
            stored[n] = d
    if isinstance(manifest, dict):
        manifest["entries"] = {
            n: {"size": len(d), "sha256": hashlib.sha256(stored[n]).hexdigest()}
            for n, d in sorted(entries.items())
            if n != "manifest.json"
        }
    entries = {**entries, "manifest.json": json.dumps(manifest).encode()}
    stored["manifest.json"] = entries["manifest.json"]
    order = ["manifest.json"] + sorted(n for n in entries if n != "manifest.json")
    chunks, central, offset = [], [], 0
    for name in order:
        raw, data = name.encode(), entries[name]
        method = 8 if name in deflated else 0
        header = _archive_zip.local_header(raw, method, zlib.crc32(data), len(stored[name]), len(data))
        central.append(_archive_zip.central_header(raw, method, zlib.crc32(data), len(stored[name]), len(data), offset))
        chunks += [header, stored[name]]
        offset += len(header) + len(stored[name])
    directory = b"".join(central)
    end = _archive_zip._END.pack(_archive_zip._END_SIG, 0, 0, len(order), len(order), len(directory), offset, 0)
    return b"".join(chunks) + directory + end


def with_json(data: bytes, name: str, edit) -> bytes:
    entries = entries_of(data)
    document = json.loads(entries[name])
    edit(document)
    entries[name] = json.dumps(document).encode()
    return honest(entries)


# --- the bombs of the issue, built small ------------------------------------------------------------


def test_a_debug_section_that_inflates_a_thousandfold_is_refused_before_inflating(rich):
    entries = entries_of(rich)
    document = json.loads(entries["debug.json"])
    document["names"].append(" " * (8 << 20))  # honest JSON, 8 MB of it, deflating to ~8 KB
    entries["debug.json"] = json.dumps(document).encode()
    bomb = honest(entries)
    started = time.perf_counter()
    with pytest.raises(
        ArchiveSizeError,
        match=r"entry 'debug.json': declares \d+ bytes from \d+ deflated bytes, more "
        r"than the limit of 64 times \(a zip bomb\?\); pass limits=Limits\(max_expansion_ratio=\.\.\.\)",
    ):
        bc.load(bomb)
    assert time.perf_counter() - started < 5
    # A trusted archive can be read by raising the limit.
    assert bc.read_archive(bomb, limits=bc.Limits(max_expansion_ratio=2000)).debug


def test_a_deflated_tensor_is_refused_whatever_its_ratio(rich):
    entries = entries_of(rich)
    attributes = json.loads(entries["attributes.json"])
    attributes["tensors"][0] = {"dtype": "uint8", "shape": [4 << 20]}
    entries["attributes.json"] = json.dumps(attributes).encode()
    entries["tensors/0.bin"] = bytes(4 << 20)
    with pytest.raises(ArchiveFormatError, match=r"entry 'tensors/0.bin': is deflated, but this format stores it"):
        bc.load(
            honest(entries, deflated=frozenset({"debug.json", "tensors/0.bin"})),
            limits=bc.Limits(max_expansion_ratio=10**6),
        )


def test_each_kind_of_entry_has_its_own_cap(rich):
    with pytest.raises(
        ArchiveSizeError,
        match=r"entry 'debug.json': \d+ bytes of JSON, more than the limit of 100; "
        r"pass limits=Limits\(max_debug_bytes=\.\.\.\)",
    ):
        bc.load(rich, limits=bc.Limits(max_debug_bytes=100))
    lowered = lower()
    lowered.notes = "n" * 3000
    with pytest.raises(
        ArchiveSizeError, match=r"entry 'attributes.json': \d+ bytes of JSON, more than the limit of 2500"
    ):
        bc.load(_saving.to_bytes(lowered), limits=bc.Limits(max_json_bytes=2500))


def test_limits_are_checked_when_given():
    with pytest.raises(TypeError, match=r"limits must be a pytest_backendconf.Limits, got dict; e.g. limits=Limits\("):
        bc.load(b"", limits={})
    with pytest.raises(ValueError, match=r"Limits\(max_entries=0\): each limit is a positive integer"):
        bc.Limits(max_entries=0)


def test_a_file_is_read_by_its_size_in_chunks(tmp_path, rich):
    sizes = []

    class Recording(io.BytesIO):
        def read(self, n=-1):
            sizes.append(n)
            return super().read(n)

    assert bc.read_archive(Recording(rich)).backend_name == "tiny"
    assert sizes and 0 < max(sizes) <= 1 << 20  # never the 4 GiB cap at once
    with pytest.raises(ArchiveSizeError, match=r"more than the limit of 100 bytes"):
        bc.read_archive(Recording(rich), limits=bc.Limits(max_archive_bytes=100))


# --- integer fields and columns ------------------------------------------------------------------------


@pytest.mark.parametrize("column", [1_500_000_000, 10**19, 1.5e9, -1, 200])
def test_caret_columns_are_bounded_by_the_source_line(rich, column):
    def edit(document):
        frame = next(f for f in document["frames"] if len(f) == 6)
        frame[5] = column

    started = time.perf_counter()
    with pytest.raises(
        ArchiveManifestError, match=r"entry 'debug.json': frames\[\d+\] has column .*outside its source line"
    ):
        bc.symbolicate(with_json(rich, "debug.json", edit), [1])
    assert time.perf_counter() - started < 5


@pytest.mark.parametrize("line", [10**19, 2**31, -3])
def test_line_numbers_are_bounded(rich, line):
    def edit(document):
        document["frames"][0][1] = line

    with pytest.raises(ArchiveManifestError, match=r"frames\[0\] has line .*lines are integers from 0 to 2147483647"):
        bc.read_archive(with_json(rich, "debug.json", edit))


def test_a_tensor_dtype_that_is_an_object_names_the_field(rich):
    def edit(document):
        document["tensors"][0]["dtype"] = {"a": 1}

    with pytest.raises(
        ArchiveManifestError, match=r"entry 'attributes.json', tensors\[0\]: unknown tensor dtype \{'a': 1\}"
    ):
        bc.load(with_json(rich, "attributes.json", edit))


def test_an_input_shape_beyond_int64_is_a_manifest_error(rich):
    def edit(document):
        document["methods"][0]["inputs"][0]["shape"] = [2**63, 3]

    with pytest.raises(ArchiveManifestError, match=r"entry 'manifest.json': methods\[0\] is not a valid method spec"):
        bc.read_archive(with_json(rich, "manifest.json", edit))


# --- run-target --example-inputs ---------------------------------------------------------------------------


def test_example_inputs_from_the_manifest_are_bounded(tmp_path, rich, capsys):
    def edit(document):
        document["methods"][0]["inputs"][0]["shape"] = [16384, 16384]

    path = tmp_path / "big.bcpt"
    path.write_bytes(with_json(rich, "manifest.json", edit))
    assert cli.main(["run-target", str(path), "--example-inputs"]) == 1
    err = capsys.readouterr().err
    assert (
        "the example inputs of its methods need more than 268435456 bytes (method 'forward', input 'x' of shape [16384, 16384])"
        in err
    )
    assert "--max-example-input-bytes" in err
    assert cli.main(["inspect", str(path), "--max-debug-bytes", "10"]) == 1
    err = capsys.readouterr().err
    assert "entry 'debug.json'" in err and "max_debug_bytes" in err


# --- a blob the backend rejects -------------------------------------------------------------------------------


class Fussy(TinyBackend):
    def compile(self, blobs, specs):
        for blob in blobs.values():
            json.loads(blob)  # the real compiler parses its blob
        return super().compile(blobs, specs)


FUSSY = Fussy("fussy")


def test_a_corrupt_blob_with_consistent_hashes_says_compile_failed_on_the_archive():
    entries = entries_of(_saving.to_bytes(lower()))
    entries["blobs/forward.bin"] = b"\x00not the blob"
    archive = bc.read_archive(honest(entries))  # every hash fits: only compile can tell
    with pytest.raises(BackendContractError) as error:
        _saving.instantiate(archive, FUSSY)
    text = str(error.value)
    assert "backend 'fussy': compile() failed at load: " in text
    assert (
        "It failed on this archive's blobs: the file may be damaged or written by another version of the backend"
        in text
    )


# --- symbolication ----------------------------------------------------------------------------------------------


def test_handles_too_long_to_print_are_not_found_and_none_is_refused(rich):
    text = bc.symbolicate(rich, 10**5000)
    assert "was not found" in text and "an integer of about 5001 digits" in text
    with pytest.raises(TypeError, match=r"debug handles are integers, got None \(NoneType\)"):
        bc.symbolicate(rich, [None])


def test_the_cli_takes_a_5000_digit_handle_in_a_log_and_as_an_argument(tmp_path, rich, capsys):
    path = tmp_path / "a.bcpt"
    path.write_bytes(rich)
    log = tmp_path / "log.txt"
    log.write_text("step debug_handle=" + "9" * 5000 + "\n")
    assert cli.main(["symbolicate", str(path), "--log", str(log)]) == 0
    assert "was not found" in capsys.readouterr().out
    # As an argument it is a mistake of the caller: an error naming it, not handle -1.
    assert cli.main(["symbolicate", str(path), "9" * 5000]) == 1
    assert "is outside the range of debug handles" in capsys.readouterr().err
    assert cli.main(["symbolicate", str(path), "18446744073709551616"]) == 1
    err = capsys.readouterr().err
    assert "handle 18446744073709551616 is outside the range of debug handles" in err and "-1" not in err


def test_symbolicate_into_a_closed_pipe_exits_quietly(tmp_path, rich):
    path = tmp_path / "a.bcpt"
    path.write_bytes(rich)
    log = tmp_path / "log.txt"
    log.write_text("debug_handle=1\n" * 20000)
    done = subprocess.run(
        f"{os.path.join(os.path.dirname(sys.executable), 'backendconf')} symbolicate {path} --log {log} | head -1",
        shell=True,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.stdout == "debug_handle=1\n"
    assert "Broken pipe" not in done.stderr and "Traceback" not in done.stderr, done.stderr


def test_the_text_cache_does_not_grow_with_distinct_handles(rich, monkeypatch):
    monkeypatch.setattr(_symbolication, "MAX_CACHED_TEXTS", 3)
    archive = bc.read_archive(rich)
    table = _symbolication.SymbolTable(archive.debug)
    for h in range(10**6, 10**6 + 5000):
        table.text(h)
    for h in list(archive.debug) * 3:
        table.text(h)
    assert len(table.cache) <= 3


# --- files: stale temporary files, portable paths -------------------------------------------------------------


def test_a_killed_save_leaves_a_temporary_file_the_next_save_removes(tmp_path, rich):
    target = tmp_path / "a.bcpt"
    code = (
        "import os, time, sys\n"
        "from pytest_backendconf.archive import _files\n"
        "os.fsync = lambda fd: (print('writing', flush=True), time.sleep(600))\n"
        f"_files.write_atomic({str(target)!r}, b'x' * 1000)\n"
    )
    env = {**os.environ, "BACKENDCONF_FSYNC": "on"}  # the fsync is where the child is stopped
    child = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True, env=env)
    assert child.stdout.readline() == "writing\n"
    leftovers = [n for n in os.listdir(tmp_path) if n.endswith(".tmp")]
    assert len(leftovers) == 1
    _files.write_atomic(tmp_path / "b.txt", "live")  # the writer is alive and holds its lock
    assert [n for n in os.listdir(tmp_path) if n.endswith(".tmp")] == leftovers
    child.send_signal(signal.SIGKILL)
    child.wait()
    old = time.time() - 60
    os.utime(tmp_path / leftovers[0], (old, old))
    bc.save(bc.load(rich), target)
    assert [n for n in os.listdir(tmp_path) if n.endswith(".tmp")] == []
    assert target.read_bytes() == rich


def test_debug_info_stores_paths_relative_to_the_import_root(rich):
    debug = json.loads(entries_of(rich)["debug.json"])
    assert debug["files"] == ["test_archive.py"]
    here = os.path.dirname(os.path.abspath(__file__))
    assert all(
        f.file == os.path.join(here, "test_archive.py") for i in bc.read_archive(rich).debug.values() for f in i.frames
    )


# --- fuzzing the content ------------------------------------------------------------------------------------------

json_values = st.recursive(
    st.one_of(
        st.none(),
        st.booleans(),
        st.integers(),
        st.integers(-(2**70), 2**70),
        st.floats(allow_nan=False, allow_infinity=False),
        st.text(max_size=6),
        st.sampled_from(["leaf", "float32", "tensor", "forward", "aten::mul", "parameter", "dict"]),
    ),
    lambda inner: st.one_of(st.lists(inner, max_size=3), st.dictionaries(st.text(max_size=6), inner, max_size=3)),
    max_leaves=8,
)


def _paths(document, prefix=()):
    yield prefix
    if isinstance(document, dict):
        for k, v in document.items():
            yield from _paths(v, prefix + (k,))
    elif isinstance(document, list):
        for i, v in enumerate(document):
            yield from _paths(v, prefix + (i,))


@settings(max_examples=150, deadline=None, suppress_health_check=list(HealthCheck))
@given(data=st.data())
def test_fuzzed_content_with_valid_checksums_gives_only_archive_errors(rich, data):
    entries = entries_of(rich)
    name = data.draw(st.sampled_from(["manifest.json", "attributes.json", "debug.json"]), label="entry")
    document = json.loads(entries[name])
    paths = [p for p in _paths(document) if not (name == "manifest.json" and p[:1] == ("entries",))]
    path = data.draw(st.sampled_from(paths), label="path")
    value = data.draw(json_values, label="value")
    if path:
        parent = document
        for key in path[:-1]:
            parent = parent[key]
        if data.draw(st.booleans(), label="delete") and isinstance(parent, dict):
            del parent[path[-1]]
        else:
            parent[path[-1]] = value
    else:
        document = value
    entries[name] = json.dumps(document).encode()
    archive = honest(entries)
    try:
        module = bc.load(archive)
    except ArchiveError:
        return
    try:
        module(X)
        bc.symbolicate(archive, [0, 1, 2, 10**30])
    except BackendConfError:
        pass


# --- entries of a newer minor schema ---------------------------------------------------------------------------


@pytest.mark.slow
def test_an_unknown_entry_of_a_newer_minor_schema_is_skipped_without_inflating_it(rich):
    import random
    import tracemalloc

    rng = random.Random(0)
    # 24 MiB that deflate about 30-fold: within the expansion limit, so only not inflating it keeps load small.
    future = bytes(rng.choice(b"\x00" * 39 + b"\x01") for _ in range(1 << 20)) * 24
    entries = entries_of(rich)
    manifest = json.loads(entries["manifest.json"])
    manifest["schema_version"] = [1, 9]  # a newer minor: entries this reader does not know are allowed
    entries["manifest.json"] = json.dumps(manifest).encode()
    entries["future/extra.bin"] = future
    data = honest(entries, deflated=frozenset({"debug.json", "future/extra.bin"}))
    assert len(data) < len(future) // 20
    limits = bc.Limits(max_total_bytes=1 << 30, max_entry_bytes=1 << 30)
    tracemalloc.start()
    try:
        archive = bc.read_archive(data, limits=limits)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert archive.methods and peak < len(future) // 4, peak
    # It was verified as stored: a changed byte is still refused.
    broken = bytearray(data)
    name = b"future/extra.bin"
    at = broken.index(name, broken.index(name) + 1) + len(name) + 100  # in its data, past the local header
    broken[at] ^= 0xFF
    with pytest.raises(ArchiveError, match=r"entry 'future/extra.bin': SHA-256 is"):
        bc.read_archive(bytes(broken), limits=limits)
