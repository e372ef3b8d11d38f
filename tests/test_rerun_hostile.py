"""``python -m pytest_backendconf.rerun FILE`` with hostile tensor files: a clear usage error (exit 2)
naming the file and the field, never a traceback and never an allocation the file asks for.

The variants cover the tensor header (bad shapes such as ``[2.7]``, negative, huge, nested, wrong
dtype names, deep JSON), the metadata of ops files (operator, tags, arguments, sizes against the
recorded sample) and of parity files (case, method, dtype, sizes against the recorded ranges,
tensors against the recorded shapes). Each runs in-process: any exception fails the test.
"""

from __future__ import annotations

import json
import re
import struct

import pytest
import torch

from pytest_backendconf.archive import write_tensors
from pytest_backendconf.cli import _rerun

ADD = {
    "overload": "aten.add.Tensor",
    "dtype": "float32",
    "index": 0,
    "opinfo": "add",
    "args": [{"$input": 0}, {"$input": 1}],
    "kwargs": {},
    "outputs": None,
    "inputs": 2,
}
SCALARS = {"input0": torch.tensor(1.0), "input1": torch.tensor(2.0)}
DEEP = "[" * 100_000 + "]" * 100_000


def raw(header: object, body: bytes = b"", *, text: str | None = None) -> bytes:
    encoded = (text if text is not None else json.dumps(header)).encode()
    return struct.pack("<Q", len(encoded)) + encoded + body


def record(**fields) -> dict:
    base = {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]}
    base.update(fields)
    return base


META = {"kind": "ops", "sample": json.dumps(ADD)}
HEADER_VARIANTS = {
    "empty": b"",
    "short": b"\x01\x02",
    "header past the end": struct.pack("<Q", 2**40) + b"{}",
    "header not json": raw(None, text="{not json"),
    "header a list": raw([1, 2]),
    "header nested deeply": raw(None, text=DEEP),
    "metadata a list": raw({"__metadata__": [1]}),
    "metadata not strings": raw({"__metadata__": {"kind": {"x": 1}}}),
    "shape 2.7": raw({"__metadata__": META, "input0": record(shape=[2.7])}, b"\0" * 8),
    "shape negative": raw({"__metadata__": META, "input0": record(shape=[-2])}, b"\0" * 8),
    "shape huge": raw({"__metadata__": META, "input0": record(shape=[2**70])}, b"\0" * 8),
    "shape 64 GB in 300 bytes": raw({"__metadata__": META, "input0": record(shape=[2**17, 2**17])}, b"\0" * 8),
    "shape a string": raw({"__metadata__": META, "input0": record(shape="2")}, b"\0" * 8),
    "shape nested": raw({"__metadata__": META, "input0": record(shape=[[2]])}, b"\0" * 8),
    "shape of booleans": raw({"__metadata__": META, "input0": record(shape=[True, True])}, b"\0" * 8),
    "shape of 65 dimensions": raw({"__metadata__": META, "input0": record(shape=[1] * 65)}, b"\0" * 8),
    "dtype unknown": raw({"__metadata__": META, "input0": record(dtype="F99")}, b"\0" * 8),
    "dtype a number": raw({"__metadata__": META, "input0": record(dtype=5)}, b"\0" * 8),
    "dtype an attribute": raw({"__metadata__": META, "input0": record(dtype="__class__")}, b"\0" * 8),
    "offsets one number": raw({"__metadata__": META, "input0": record(data_offsets=[0])}, b"\0" * 8),
    "offsets negative": raw({"__metadata__": META, "input0": record(data_offsets=[-8, 0])}, b"\0" * 8),
    "offsets past the body": raw({"__metadata__": META, "input0": record(data_offsets=[0, 8])}, b"\0" * 4),
    "offsets floats": raw({"__metadata__": META, "input0": record(data_offsets=[0.0, 8.0])}, b"\0" * 8),
    "record a list": raw({"__metadata__": META, "input0": [1, 2]}, b"\0" * 8),
    "record with an extra field": raw({"__metadata__": META, "input0": record(code="x")}, b"\0" * 8),
}


def ops_file(**changes) -> dict[str, str]:
    sample = {**ADD, **changes}
    return {"kind": "ops", "sample": json.dumps(sample)}


METADATA_VARIANTS = {
    "kind missing": ({}, SCALARS),
    "kind unknown": ({"kind": "evil"}, SCALARS),
    "sample not json": ({"kind": "ops", "sample": "{"}, SCALARS),
    "sample nested deeply": ({"kind": "ops", "sample": DEEP}, SCALARS),
    "sample a list": ({"kind": "ops", "sample": "[]"}, SCALARS),
    "sample without keys": ({"kind": "ops", "sample": json.dumps({"overload": "aten.add.Tensor"})}, SCALARS),
    "sample dtype an attribute": (ops_file(dtype="__class__"), SCALARS),
    "sample index negative": (ops_file(index=-1), SCALARS),
    "sample index a string": (ops_file(index="0"), SCALARS),
    "sample inputs huge": (ops_file(inputs=10**9), SCALARS),
    "sample inputs missing": (ops_file(inputs=3), SCALARS),
    "args nested deeply": (ops_file(args=[[[[[[[[[[[[1]]]]]]]]]]]]), SCALARS),
    "args dtype tag an attribute": (ops_file(args=[{"$input": 0}, {"$dtype": "__class__"}]), SCALARS),
    "args input out of range": (ops_file(args=[{"$input": 0}, {"$input": 5}]), SCALARS),
    "args float tag not inf": (ops_file(args=[{"$input": 0}, {"$float": "1e400"}]), SCALARS),
    "args device other": (ops_file(args=[{"$input": 0}, {"$device": "meta"}]), SCALARS),
    "args unknown tag": (ops_file(args=[{"$input": 0}, {"$call": "os.system"}]), SCALARS),
    "args two-key tag": (ops_file(args=[{"$input": 0, "$float": "inf"}]), SCALARS),
    "args not the recorded ones": (ops_file(args=[{"$input": 0}, {"$input": 0}]), SCALARS),
    "sample not recorded": (ops_file(index=99), SCALARS),
    "inputs not the recorded shapes": (ops_file(), {"input0": torch.ones(64, 64), "input1": torch.ones(64, 64)}),
    "outputs not indices": (ops_file(outputs=["x"]), SCALARS),
    "parity case unknown": ({"kind": "parity", "case": "nope", "dtype": "float32", "method": "forward"}, {}),
    "parity method unknown": ({"kind": "parity", "case": "linear", "dtype": "float32", "method": "__init__"}, {}),
    "parity dtype an attribute": ({"kind": "parity", "case": "linear", "dtype": "__class__", "method": "forward"}, {}),
    "parity sizes nested": (
        {"kind": "parity", "case": "linear", "dtype": "float32", "method": "forward", "sizes": DEEP},
        {},
    ),
    "parity sizes a list": (
        {"kind": "parity", "case": "linear", "dtype": "float32", "method": "forward", "sizes": "[2]"},
        {},
    ),
    "parity sizes unknown dim": (
        {"kind": "parity", "case": "linear", "dtype": "float32", "method": "forward", "sizes": '{"rows": 2}'},
        {},
    ),
    "parity sizes outside the range": (
        {"kind": "parity", "case": "linear", "dtype": "float32", "method": "forward", "sizes": '{"batch": 1000000000}'},
        {"input0": torch.ones(2, 8)},
    ),
    "parity size 2.7": (
        {"kind": "parity", "case": "linear", "dtype": "float32", "method": "forward", "sizes": '{"batch": 2.7}'},
        {"input0": torch.ones(2, 8)},
    ),
    "parity tensor missing": ({"kind": "parity", "case": "linear", "dtype": "float32", "method": "forward"}, {}),
    "parity tensor of another shape": (
        {"kind": "parity", "case": "linear", "dtype": "float32", "method": "forward"},
        {"input0": torch.ones(3, 3)},
    ),
}


@pytest.mark.parametrize("name", sorted(HEADER_VARIANTS))
def test_a_hostile_tensor_header_is_a_usage_error(tmp_path, capsys, name):
    path = tmp_path / "hostile.safetensors"
    path.write_bytes(HEADER_VARIANTS[name])
    assert _rerun.main([str(path), "--backend=reference"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and str(path) in err and len(err) < 2_000


@pytest.mark.parametrize("name", sorted(METADATA_VARIANTS))
def test_hostile_rerun_metadata_is_a_usage_error(tmp_path, capsys, name):
    metadata, tensors = METADATA_VARIANTS[name]
    path = tmp_path / "hostile.safetensors"
    write_tensors(path, tensors, metadata)
    assert _rerun.main([str(path), "--backend=reference"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and len(err) < 2_000


def test_the_recorded_sample_still_reruns(tmp_path, capsys):
    path = tmp_path / "good.safetensors"
    write_tensors(path, SCALARS, {**ops_file(), "low_precision_reference": "True"})
    assert _rerun.main([str(path), "--backend=reference"]) == 0
    assert "aten.add.Tensor[float32-sample0] on backend 'reference'" in capsys.readouterr().out


SEGMENT = {
    "overload": "aten.segment_reduce.default",
    "dtype": "float32",
    "index": 0,
    "opinfo": "_segment_reduce.offsets",
    "args": [{"$input": 0}, "sum"],
    "kwargs": {"offsets": {"$input": 1}},
    "outputs": None,
    "inputs": 2,
}


@pytest.mark.parametrize(
    ("kwargs", "second", "message"),
    [
        ({"offsets": {"$input": 1}}, torch.tensor([0, 4096]), r"offsets must be non-decreasing and within \[0, 4\]"),
        ({"offsets": {"$input": 1}}, torch.tensor([-8, 2]), r"offsets must be non-decreasing and within \[0, 4\]"),
        ({"offsets": {"$input": 1}}, torch.tensor([3, 1]), r"offsets must be non-decreasing"),
        (
            {"lengths": {"$input": 1}, "unsafe": True},
            torch.tensor([4096]),
            r"unsafe=True skips its own argument checks",
        ),
        ({"lengths": {"$input": 1}, "evil": 1}, torch.tensor([4]), r"unexpected keyword argument 'evil'"),
    ],
)
def test_hostile_segment_reduce_arguments_never_reach_the_eager_kernel(tmp_path, capsys, kwargs, second, message):
    # The rerun calls the operator eagerly for its reference: the allowlist's argument check runs first,
    # whether or not the ops data of this torch records the sample.
    path = tmp_path / "segment.safetensors"
    sample = {**SEGMENT, "kwargs": kwargs}
    write_tensors(path, {"input0": torch.ones(4), "input1": second}, {"kind": "ops", "sample": json.dumps(sample)})
    assert _rerun.main([str(path), "--backend=reference"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and re.search(message, err), err
