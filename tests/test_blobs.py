"""The shared blob frame (`pytest_backendconf.blobs`): what the ONNX Runtime and ExecuTorch backends write."""

from __future__ import annotations

import struct

import pytest

from pytest_backendconf.blobs import checked_handle, compile_each, pack_blob, unpack_blob

MAGIC = b"\x89BCTEST\n"
READ = {"kind": "test backend blob", "upgrade": "backendconf-test"}


def test_a_blob_reads_back_and_is_the_same_bytes_for_the_same_arguments():
    header = {"b": [1, 2], "a": {"nested": "x"}}
    blob = pack_blob(MAGIC, 2, header, b"payload")
    assert blob == pack_blob(MAGIC, 2, {"a": {"nested": "x"}, "b": [1, 2]}, b"payload")  # key order does not matter
    assert unpack_blob(blob, MAGIC, 2, **READ) == (header, b"payload")
    assert unpack_blob(memoryview(blob), MAGIC, 3, **READ) == (header, b"payload")  # an older blob is read


def _reheaded(blob: bytes, header: bytes) -> bytes:
    """``blob`` with another header and a CRC that matches: only the JSON reader can refuse it."""
    import zlib

    payload = blob[struct.calcsize("<8sIIQQ") + struct.unpack_from("<8sIIQQ", blob)[3] :]
    rest = header + payload
    return struct.pack("<8sIIQQ", MAGIC, 1, zlib.crc32(rest), len(header), len(payload)) + rest


@pytest.mark.parametrize(
    ("damage", "message"),
    [
        (lambda b: "text", "the test backend blob must be bytes, not str"),
        (
            lambda b: b"\x89BCORT\r\n" + b[8:],
            r"not a valid test backend blob \(bad magic or too short\); was it written by another backend\?",
        ),
        (lambda b: b[:10], "not a valid test backend blob"),
        (
            lambda b: b[:8] + struct.pack("<I", 9) + b[12:],
            r"test backend blob format 9 is newer than this reader \(1\); upgrade backendconf-test",
        ),
        (
            lambda b: b[:-1],
            r"test backend blob is truncated or padded: \d+ bytes after the prefix, expected \d+ \(header\) \+ 7 \(payload\)",
        ),
        (lambda b: b + b"x", "test backend blob is truncated or padded"),
        (lambda b: b[:-1] + b"X", "test backend blob is corrupt: CRC-32 checksum mismatch"),
        (lambda b: _reheaded(b, b"{not json"), "test backend blob has a malformed header: "),
    ],
    ids=["not-bytes", "bad-magic", "too-short", "newer", "truncated", "padded", "corrupt", "malformed-header"],
)
def test_a_damaged_blob_is_a_value_error_naming_the_problem(damage, message):
    blob = pack_blob(MAGIC, 1, {"k": 1}, b"payload")
    with pytest.raises(ValueError, match=message):
        unpack_blob(damage(blob), MAGIC, 1, **READ)


def test_writing_refuses_a_bad_magic_and_nan():
    with pytest.raises(ValueError, match="a blob magic is 8 bytes, not 4"):
        pack_blob(b"BCXX", 1, {}, b"")
    with pytest.raises(ValueError, match="Out of range float values are not JSON compliant"):
        pack_blob(MAGIC, 1, {"x": float("nan")}, b"")


def test_compile_each_loads_every_blob_and_names_the_method_of_a_bad_one():
    def load(blob: bytes) -> tuple:
        return unpack_blob(blob, MAGIC, 1, **READ)

    good = pack_blob(MAGIC, 1, {"k": 1}, b"payload")
    assert compile_each({"forward": good, "encode": good}, load) == {
        "forward": ({"k": 1}, b"payload"),
        "encode": ({"k": 1}, b"payload"),
    }
    with pytest.raises(ValueError, match="^method 'encode': test backend blob is corrupt: CRC-32 checksum mismatch$"):
        compile_each({"forward": good, "encode": good[:-1] + b"X"}, load)


def test_checked_handle_refuses_a_handle_of_another_kind_naming_who_makes_them():
    assert checked_handle(b"x", bytes, "TestBackend.compile") == b"x"
    with pytest.raises(TypeError, match=r"^execute\(\) expects a handle returned by TestBackend.compile, got str$"):
        checked_handle("x", bytes, "TestBackend.compile")
