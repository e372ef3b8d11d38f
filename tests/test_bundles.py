"""Bundled inputs in the archive: save and load them, their tolerance, schema 1.4, tampering, inspect."""

from __future__ import annotations

import hashlib
import io
import json
import os
import zipfile

import pytest
import torch

import pytest_backendconf as bc
from pytest_backendconf.archive import _zip as _archive_zip
from pytest_backendconf.cli import main
from pytest_backendconf.conformance._spec import section
from pytest_backendconf.errors import (
    ArchiveChecksumError,
    ArchiveEntryError,
    ArchiveError,
    ArchiveManifestError,
    ArchiveSizeError,
)
from pytest_backendconf.lowering import DEFAULT_TOLERANCES

DATA = os.path.join(os.path.dirname(os.path.abspath(__file__)), "data")


class SinScale(torch.nn.Module):
    def forward(self, x):
        return torch.sin(x) * 2


class TwoMethods(torch.nn.Module):
    def forward(self, x):
        return x + 1

    def double(self, x):
        return (x * 2, x.sum())


X1, X2 = torch.linspace(-2, 2, 12).reshape(3, 4), torch.linspace(0, 1, 12).reshape(3, 4)


@pytest.fixture(scope="module")
def lowered():
    return bc.to_backend(SinScale(), "reference", {"forward": {}}, example_inputs=(X1,))


def saved(lowered, **options) -> bytes:
    buffer = io.BytesIO()
    bc.save(lowered, buffer, **options)
    return buffer.getvalue()


def entries_of(data: bytes) -> dict[str, bytes]:
    with zipfile.ZipFile(io.BytesIO(data)) as z:
        return {info.filename: z.read(info) for info in z.infolist()}


def test_bundled_inputs_come_back_with_eager_outputs_and_the_default_tolerance(lowered):
    model = SinScale()
    data = saved(lowered, bundled_inputs={"forward": [(X1,), (X2,)]}, eager=model)
    again = bc.load(data)
    inputs = again.bundled_inputs("forward")
    assert len(inputs) == 2 and all(type(i) is tuple and len(i) == 1 for i in inputs)
    assert torch.equal(inputs[0][0], X1) and torch.equal(inputs[1][0], X2)
    bundles = bc.bundles(again, "forward")
    assert torch.equal(bundles[1].expected, model(X2))
    assert (bundles[0].rtol, bundles[0].atol, bundles[0].tolerance) == (1.3e-6, 1e-5, "default for float32")
    assert bundles[0].check is None
    # The module runs its own bundles within their tolerance.
    torch.testing.assert_close(again(*inputs[0]), bundles[0].expected, rtol=bundles[0].rtol, atol=bundles[0].atol)
    # Loaded and saved again: the same bytes, bundles included.
    assert saved(again) == data
    assert bc.read_archive(data).schema_version == (1, 4)


def test_an_archive_without_bundles_keeps_its_schema_and_has_none(lowered):
    data = saved(lowered)
    assert bc.read_archive(data).schema_version == (1, 2)
    assert "bundles.json" not in entries_of(data)
    assert bc.load(data).bundled_inputs("forward") == []
    # An archive written by 0.1.0 (schema 1.0) loads and has no bundles either.
    old = bc.load(os.path.join(DATA, "archive-0.1.0.bcpt"))
    assert old.bundled_inputs(next(iter(old.lowered.methods))) == []


def test_explicit_bundles_and_tolerances_and_other_methods():
    model = TwoMethods()
    lowered = bc.to_backend(
        model, "reference", {"forward": {}, "double": {}}, example_inputs={"forward": (X1,), "double": (X1,)}
    )
    explicit = bc.Bundle(inputs=(X2,), expected=X2 + 1, rtol=0.0, atol=1e-3, tolerance="from the vendor's spec")
    data = saved(
        lowered,
        bundled_inputs={"forward": [explicit], "double": [(X1,)]},
        eager=model,
        tolerance=(1e-4, 1e-4),
    )
    again = bc.load(data)
    (forward,) = bc.bundles(again, "forward")
    assert (forward.atol, forward.tolerance) == (1e-3, "from the vendor's spec")
    (double,) = bc.bundles(again, "double")
    assert (double.rtol, double.atol, double.tolerance) == (1e-4, 1e-4, "given to save()")
    assert isinstance(double.expected, tuple) and torch.equal(double.expected[1], X1.sum())
    assert again.bundled_inputs("double")[0][0].shape == (3, 4)


def test_the_default_tolerances_are_the_suites_parity_defaults():
    for dtype, pair in section("parity")["tolerances"].items():
        assert DEFAULT_TOLERANCES[dtype] == tuple(pair), dtype


@pytest.mark.parametrize(
    "options, message",
    [
        ({"bundled_inputs": {"forward": [(X1,)]}}, r"pass it as save\(\.\.\., eager=model\)"),
        (
            {"bundled_inputs": {"decode": [(X1,)]}, "eager": SinScale()},
            "method 'decode', which the lowered module does not have",
        ),
        (
            {"bundled_inputs": {"forward": [X1]}, "eager": SinScale()},
            r"must be a tuple of positional inputs \(or a Bundle\)",
        ),
        ({"bundled_inputs": [(X1,)]}, "bundled_inputs must be"),
        ({"eager": SinScale()}, "pass the inputs to bundle too"),
        ({"bundled_inputs": {"forward": [(X1,)]}, "eager": SinScale(), "tolerance": 0.1}, r"a pair \(rtol, atol\)"),
        (
            {"bundled_inputs": {"forward": [bc.Bundle((X1,), X1, rtol=-1.0, atol=0.0)]}},
            "rtol must be a finite number >= 0",
        ),
    ],
)
def test_bad_bundles_are_refused_before_anything_is_written(lowered, tmp_path, options, message):
    path = tmp_path / "model.bcpt"
    with pytest.raises(ArchiveError, match=message):
        bc.save(lowered, path, **options)
    assert not path.exists()


def test_tampered_expected_outputs_are_refused_by_the_archives_hashes(lowered):
    data = saved(lowered, bundled_inputs={"forward": [(X1,)]}, eager=SinScale())
    entries = entries_of(data)
    document = json.loads(entries["bundles.json"])
    expected_index = document["methods"]["forward"][0]["expected"]["tensor"]
    name = f"bundles/{expected_index}.bin"
    values = torch.frombuffer(bytearray(entries[name]), dtype=torch.float32).clone()
    values[0] *= 1.01  # "fix" the expected output to what a drifting device computes
    entries[name] = values.numpy().tobytes()
    # A well-formed zip (sizes and CRCs fit) whose manifest still records the original hashes.
    order = ["manifest.json"] + sorted(n for n in entries if n != "manifest.json")
    tampered = _archive_zip.pack([(n, entries[n]) for n in order])
    with pytest.raises(
        ArchiveChecksumError, match=rf"entry '{name}': SHA-256 is [0-9a-f]{{64}}, but manifest.json records"
    ):
        bc.load(tampered)


def test_inspect_lists_the_bundles_and_their_sizes(lowered, tmp_path, capsys):
    path = tmp_path / "model.bcpt"
    bc.save(lowered, path, bundled_inputs={"forward": [(X1,), (X2,)]}, eager=SinScale())
    assert main(["inspect", str(path)]) == 0
    out = capsys.readouterr().out
    # Two inputs and two outputs of 3x4 float32.
    assert (
        "bundled inputs (backendconf replay runs them):\n  forward: 2 bundles, 192 bytes of inputs and expected outputs"
        in out
    )
    assert "schema version 1.4" in out


# --- damaged bundles: each an ArchiveError naming the entry ------------------------------------------


def honest(entries: dict[str, bytes]) -> bytes:
    """Repack ``entries`` with a manifest whose sizes and hashes fit them (a forged, not a damaged, file)."""
    manifest = json.loads(entries["manifest.json"])
    manifest["entries"] = {
        n: {"size": len(d), "sha256": hashlib.sha256(_archive_zip.stored_bytes(n, d)).hexdigest()}
        for n, d in sorted(entries.items())
        if n != "manifest.json"
    }
    entries = {**entries, "manifest.json": json.dumps(manifest, indent=1).encode()}
    order = ["manifest.json"] + sorted(n for n in entries if n != "manifest.json")
    return _archive_zip.pack([(n, entries[n]) for n in order])


def edit_bundles(data: bytes, edit) -> bytes:
    entries = entries_of(data)
    document = json.loads(entries["bundles.json"])
    edit(document, entries)
    entries["bundles.json"] = json.dumps(document).encode()
    return honest(entries)


def _set_version(data: bytes, version: list) -> bytes:
    entries = entries_of(data)
    manifest = json.loads(entries["manifest.json"])
    manifest["schema_version"] = version
    entries["manifest.json"] = json.dumps(manifest).encode()
    return honest(entries)


@pytest.mark.parametrize(
    "damage, error, message",
    [
        (
            lambda d: _set_version(d, [1, 2]),
            ArchiveEntryError,
            r"entry 'bundles.json': bundled inputs are schema 1.4, but the archive says 1.2",
        ),
        (
            lambda d: edit_bundles(d, lambda doc, e: doc["methods"].update(decode=doc["methods"]["forward"])),
            ArchiveManifestError,
            "has bundles for method 'decode', which the manifest does not list",
        ),
        (
            lambda d: edit_bundles(d, lambda doc, e: doc["methods"]["forward"][0].pop("expected")),
            ArchiveManifestError,
            r"bundle forward\[0\]: must have exactly the fields",
        ),
        (
            lambda d: edit_bundles(d, lambda doc, e: doc["methods"]["forward"][0].update(expected={"tensor": 99})),
            ArchiveManifestError,
            r"bundle forward\[0\], expected outputs: tensor reference 99 is outside the table of 2 tensors",
        ),
        (
            lambda d: edit_bundles(d, lambda doc, e: doc["methods"]["forward"][0].update(inputs=[{"tensor": 0}])),
            ArchiveManifestError,
            "inputs must be an encoded tuple",
        ),
        (
            lambda d: edit_bundles(d, lambda doc, e: doc["methods"]["forward"][0].update(rtol="loose")),
            ArchiveManifestError,
            "rtol must be a number >= 0",
        ),
        (
            lambda d: edit_bundles(d, lambda doc, e: e.update({"bundles/1.bin": e["bundles/1.bin"][:-4]})),
            ArchiveSizeError,
            r"entry 'bundles/1.bin': has 44 bytes, but a float32 tensor of shape \[3, 4\] needs 48",
        ),
        (
            lambda d: edit_bundles(d, lambda doc, e: e.update({"bundles/7.bin": b""})),
            ArchiveEntryError,
            r"entry 'bundles/7.bin': no tensor of bundles.json refers to it",
        ),
        (
            lambda d: edit_bundles(d, lambda doc, e: e.pop("bundles/0.bin")),
            ArchiveEntryError,
            r"entry 'bundles/0.bin': tensor 0 of bundles.json is missing",
        ),
    ],
)
def test_damaged_bundles_are_archive_errors_naming_the_entry(lowered, damage, error, message):
    data = saved(lowered, bundled_inputs={"forward": [(X1,)]}, eager=SinScale())
    with pytest.raises(error, match=message):
        bc.read_archive(damage(data))


def test_bundles_and_debug_info_apart_go_together(lowered, tmp_path):
    path = tmp_path / "model.bcpt"
    bc.save(lowered, path, debug_info="separate", bundled_inputs={"forward": [(X1,)]}, eager=SinScale())
    assert bc.read_archive(path).schema_version == (1, 4)
    again = bc.load(path)  # the .debug file beside it is found
    assert torch.equal(again.bundled_inputs()[0][0], X1)
    archive, sidecar = io.BytesIO(), io.BytesIO()
    bc.save(again, archive, debug_info="separate", debug_file=sidecar)
    assert archive.getvalue() == path.read_bytes()
    assert sidecar.getvalue() == (tmp_path / "model.bcpt.debug").read_bytes()
