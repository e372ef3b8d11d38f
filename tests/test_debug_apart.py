"""save(..., debug_info="separate"): a handles-only archive and its .debug file, and everything that reads them."""

from __future__ import annotations

import io
import os
import re
import subprocess
import sys
import zipfile
import zlib

import pytest
import torch

import pytest_backendconf as bc
from pytest_backendconf.archive import _archive
from pytest_backendconf.lowering import _saving
from pytest_backendconf.conformance.symbolication.debug_apart import leaks, secrets
from pytest_backendconf.errors import ArchiveError, DebugSidecarError

from lowering_models import N

FAULT = {"forward": {"__backendconf_fault__": {"node": "mul"}}}


@pytest.fixture(scope="module")
def lowered():
    return bc.to_backend(N(), "reference", FAULT, example_inputs=(torch.randn(2, 3),))


@pytest.fixture(scope="module")
def pair(lowered, tmp_path_factory):
    path = tmp_path_factory.mktemp("apart") / "model.bcpt"
    bc.save(lowered, path, debug_info="separate")
    return path, path.with_name("model.bcpt.debug")


def _everything(data: bytes) -> bytes:
    with zipfile.ZipFile(io.BytesIO(data)) as z:
        return data + b"".join(z.read(n) for n in z.namelist())


def test_the_archive_holds_handles_only(lowered, pair):
    path, sidecar = pair
    data = path.read_bytes()
    # The N/M/L trio's innermost line and its file's name, in the file or any entry inflated.
    assert b"return x * 5" not in _everything(data) and b"zoo.py" not in _everything(data)
    assert leaks(data, secrets(bc.debug_info(lowered))) == []
    # The embedded form has both, inflated (debug.json is deflated in the file).
    embedded = _saving.to_bytes(lowered)
    assert b"return x * 5" in _everything(embedded) and b"zoo.py" in _everything(embedded)
    archive = bc.read_archive(data)
    assert archive.schema_version == (1, 3) and archive.debug == {}
    assert archive.handles == tuple(sorted(bc.debug_info(lowered)))
    assert sidecar.is_file() and os.path.getsize(sidecar) > 0


def test_the_pair_is_deterministic_and_resaves_byte_identically(lowered, pair, tmp_path):
    path, sidecar = pair
    assert _saving.to_bytes_separate(lowered) == (path.read_bytes(), sidecar.read_bytes())
    again = tmp_path / "again.bcpt"
    bc.save(bc.load(path), again, debug_info="separate")
    assert again.read_bytes() == path.read_bytes()
    assert (tmp_path / "again.bcpt.debug").read_bytes() == sidecar.read_bytes()


def test_the_sidecar_symbolicates_every_handle_as_the_embedded_form(lowered, pair):
    path, sidecar = pair
    handles = sorted(bc.debug_info(lowered))
    embedded = bc.symbolicate(_saving.to_bytes(lowered), handles)
    assert bc.symbolicate(str(sidecar), handles) == embedded
    assert bc.symbolicate(path, handles) == embedded  # the .debug file beside it is found
    for h in handles:
        assert bc.symbolicate(sidecar, h) == bc.symbolicate(lowered, h)


def test_a_wrong_sidecar_is_refused_naming_both_hashes(pair, tmp_path):
    path, sidecar = pair
    other = tmp_path / "other.bcpt"
    bc.save(
        bc.to_backend(N(), "reference", {"forward": {}}, example_inputs=(torch.randn(2, 3),)),
        other,
        debug_info="separate",
    )
    archive, theirs = bc.read_archive(path), _archive.debug_source(str(other) + ".debug")
    with pytest.raises(DebugSidecarError) as info:
        bc.load(path, debug_file=str(other) + ".debug")
    text = str(info.value)
    assert archive.sha256 in text and archive.separate_debug["sha256"] in text
    assert theirs.archive_sha256 in text and theirs.debug_sha256 in text
    assert "Use the .debug file saved together with this archive" in text
    # A wrong sidecar beside the archive is refused too, also by symbolicate.
    beside = tmp_path / "model.bcpt"
    beside.write_bytes(path.read_bytes())
    (tmp_path / "model.bcpt.debug").write_bytes((tmp_path / "other.bcpt.debug").read_bytes())
    with pytest.raises(DebugSidecarError, match="does not belong to archive"):
        bc.load(beside)
    with pytest.raises(DebugSidecarError, match="does not belong to archive"):
        bc.symbolicate(beside, 1)


def test_without_its_sidecar_it_loads_and_a_failure_says_how_to_symbolicate(lowered, pair, tmp_path):
    path, _ = pair
    alone = tmp_path / "model.bcpt"
    alone.write_bytes(path.read_bytes())
    loaded = bc.load(alone)
    handle = next(h for h, i in bc.debug_info(lowered).items() if i.node == "mul")
    with pytest.raises(bc.BackendRuntimeError) as info:
        loaded(torch.randn(2, 3))
    assert str(info.value) == (
        f"injected fault at node 'mul' (aten::mul) (debug_handle={handle}; symbolicate with: "
        f"backendconf symbolicate {alone}.debug {handle})"
    )
    assert info.value.debug_handle == handle
    with pytest.raises(
        DebugSidecarError, match=r"keeps its debug info in a separate \.debug file, which is not beside it"
    ):
        bc.symbolicate(alone, handle)
    with pytest.raises(ArchiveError, match="loaded from a handles-only archive without its .debug file"):
        bc.save(loaded, tmp_path / "x.bcpt")
    # With the sidecar, the full text.
    with pytest.raises(bc.BackendRuntimeError, match="Module hierarchy:top\\(N\\)::forward.m\\(M\\)"):
        bc.load(path)(torch.randn(2, 3))


@pytest.mark.parametrize(
    "call, error, says",
    [
        (
            lambda low, tmp: bc.save(low, tmp / "a.bcpt", debug_info="apart"),
            ValueError,
            "save\\(debug_info='apart'\\): pass debug_info=\"embedded\"",
        ),
        (
            lambda low, tmp: bc.save(low, io.BytesIO(), debug_info="separate"),
            ArchiveError,
            "to a file object needs debug_file=",
        ),
        (
            lambda low, tmp: bc.save(low, tmp / "a.bcpt", debug_file=tmp / "a.debug"),
            ArchiveError,
            'save\\(debug_file=...\\) is for debug_info="separate"',
        ),
        (
            lambda low, tmp: (bc.save(low, tmp / "e.bcpt"), bc.load(tmp / "e.bcpt", debug_file=tmp / "e.debug")),
            ArchiveError,
            "has its debug info embedded; it has no .debug file",
        ),
    ],
)
def test_misuse_is_a_clear_error(lowered, tmp_path, call, error, says):
    with pytest.raises(error, match=says):
        call(lowered, tmp_path)


def test_to_file_objects_and_a_damaged_or_misplaced_sidecar(lowered, tmp_path):
    archive, sidecar = io.BytesIO(), io.BytesIO()
    bc.save(lowered, archive, debug_info="separate", debug_file=sidecar)
    assert (archive.getvalue(), sidecar.getvalue()) == _saving.to_bytes_separate(lowered)
    damaged = bytearray(sidecar.getvalue())
    damaged[-60] ^= 0xFF
    with pytest.raises(ArchiveError):
        bc.symbolicate(bytes(damaged), 1)
    path = tmp_path / "m.bcpt.debug"
    path.write_bytes(sidecar.getvalue())
    with pytest.raises(ArchiveError, match="this is the .debug file of a handles-only archive, not the archive"):
        bc.load(path)


def test_backendconf_symbolicate_reads_the_sidecar_with_handles_and_log(lowered, pair):
    path, sidecar = pair
    handle = next(h for h, i in bc.debug_info(lowered).items() if i.node == "mul")
    log = f"step 3 failed (debug_handle={handle}; symbolicate with: backendconf symbolicate {sidecar} {handle})\n"
    done = subprocess.run(
        [sys.executable, "-m", "pytest_backendconf.cli", "symbolicate", str(sidecar), str(handle), "--log", "-"],
        capture_output=True,
        text=True,
        input=log,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    expected = bc.symbolicate(lowered, handle)
    assert "return x * 5" in expected

    def same_file(text: str) -> str:
        # Where the zoo's module is not imported, the stored path is shown instead of the local file.
        return re.sub(r'File "[^"]*zoo\.py"', 'File "zoo.py"', text)

    assert same_file(done.stdout) == same_file(f"{expected}\n{log}{expected}\n")


def _repacked(data: bytes, deflate_manifest: bool) -> bytes:
    """The same debug file with its manifest deflated: every hash it records still holds."""
    from pytest_backendconf.archive import _zip

    with zipfile.ZipFile(io.BytesIO(data)) as z:
        entries = [(n, z.read(n)) for n in z.namelist()]
    chunks, central, offset = [], [], 0
    for name, content in entries:
        method = 8 if name == "debug.json" or (deflate_manifest and name == "manifest.json") else 0
        stored = _zip.deflate(content) if method == 8 else content
        header = _zip.local_header(name.encode(), method, zlib.crc32(content), len(stored), len(content))
        central.append(
            _zip.central_header(name.encode(), method, zlib.crc32(content), len(stored), len(content), offset)
        )
        chunks += [header, stored]
        offset += len(header) + len(stored)
    directory = b"".join(central)
    end = _zip._END.pack(_zip._END_SIG, 0, 0, len(entries), len(entries), len(directory), offset, 0)
    return b"".join(chunks) + directory + end


def test_a_sidecar_with_a_deflated_manifest_is_refused_before_inflating_it(pair, tmp_path):
    path, sidecar = pair
    assert _repacked(sidecar.read_bytes(), deflate_manifest=False) == sidecar.read_bytes()
    (tmp_path / "model.bcpt").write_bytes(path.read_bytes())
    forged = tmp_path / "model.bcpt.debug"
    forged.write_bytes(_repacked(sidecar.read_bytes(), deflate_manifest=True))
    with pytest.raises(ArchiveError, match=r"entry 'manifest.json': is deflated, but this format stores it"):
        bc.load(tmp_path / "model.bcpt")
    with pytest.raises(ArchiveError, match=r"entry 'manifest.json': is deflated, but this format stores it"):
        bc.symbolicate(str(forged), [1])


def test_a_file_beside_the_archive_too_big_to_be_its_sidecar_is_not_read(pair, tmp_path):
    path, _ = pair
    (tmp_path / "model.bcpt").write_bytes(path.read_bytes())
    big = tmp_path / "model.bcpt.debug"
    with open(big, "wb") as f:
        f.truncate(1 << 30)  # sparse: 1 GiB that would be read whole before any check
    limits = bc.Limits()
    with pytest.raises(
        ArchiveError,
        match=rf"debug file '{re.escape(str(big))}' is {1 << 30} bytes, more than a debug file of at most "
        rf"{limits.max_debug_bytes} bytes of debug info can be \(\d+\); pass limits=Limits\(max_debug_bytes=\.\.\.\)",
    ):
        bc.load(tmp_path / "model.bcpt")
