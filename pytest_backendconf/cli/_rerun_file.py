"""What a rerun file may say, checked before anything is built or allocated from it.

A rerun file is a tensor file (``archive.read_tensors``) whose metadata names
the comparison to run again: a ``parity`` check (model case, dtype, method,
and for a dynamic-shape check the sizes of its dimensions) or an ``ops`` check
(one OpInfo sample: the overload, its arguments, the inputs). The file may come
from anywhere, so every field is checked here: the operator through the
allowlist (`pytest_backendconf.allowlist`), tags through fixed tables, the
sizes against the case's recorded ranges and the tensors against the shapes the
method or sample records, so that a 300-byte file cannot ask for 64 GB. Any
problem is a `RerunFileError` naming the file and the field.
"""

from __future__ import annotations

import json
from typing import Any

#: Nesting of a sample's argument lists (real samples: 3).
MAX_ARG_DEPTH = 8
#: What the outputs of one rerun op call may take, checked on fake tensors before any runs.
MAX_OUTPUT_BYTES = 256 * 2**20


class RerunFileError(ValueError):
    """A rerun file says something the command will not act on; the text names the file and the field."""


def parse_json(text: str, what: str) -> Any:
    """JSON from a metadata field; too deep or malformed is a `RerunFileError`."""
    try:
        return json.loads(text)
    except RecursionError:
        raise RerunFileError(f"{what} nests JSON too deeply") from None
    except ValueError as exc:
        raise RerunFileError(f"{what} is not JSON ({exc})") from None


def _short(value: Any, limit: int = 60) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _depth(value: Any, limit: int) -> int:
    """The nesting of lists and objects in ``value``, stopping past ``limit``."""
    if limit < 0:
        return 1
    if isinstance(value, list):
        return 1 + max((_depth(v, limit - 1) for v in value), default=0)
    if isinstance(value, dict):
        return 1 + max((_depth(v, limit - 1) for v in value.values()), default=0)
    return 0


# --- ops ------------------------------------------------------------------------------


def checked_sample(path: Any, metadata: dict, tensors: dict) -> Any:
    """The `OpSample` of an ops rerun file, every field checked (`RerunFileError` otherwise)."""
    from .. import _compat
    from ..allowlist import argument_check
    from ..conformance.ops import discovery
    from ..errors import OperatorRefusedError

    where = f"{path}: metadata field 'sample'"
    record = parse_json(metadata.get("sample", ""), where)
    if not isinstance(record, dict):
        raise RerunFileError(f"{where} must be a JSON object, got {_short(record)}")
    expected = {"overload", "dtype", "index", "opinfo", "args", "kwargs", "outputs", "inputs"}
    optional = {"kind", "opinfo_tolerance"}  # a long-reduction sample; OpInfo's own tolerance for the dtype
    if not expected <= set(record) <= expected | optional:
        raise RerunFileError(
            f"{where} must have the keys {sorted(expected)} (and optionally {sorted(optional)}), "
            f"got {_short(sorted(record))}"
        )
    kind = record.get("kind", "sample")
    if kind not in ("sample", "long"):
        raise RerunFileError(f"{where}: kind must be 'sample' or 'long', got {_short(kind)}")
    tolerance = record.get("opinfo_tolerance")
    if tolerance is not None and not (
        isinstance(tolerance, list)
        and len(tolerance) == 2
        and all(type(v) in (int, float) and 0 <= v < 1e6 for v in tolerance)
    ):
        raise RerunFileError(f"{where}: opinfo_tolerance must be null or [rtol, atol], got {_short(tolerance)}")
    overload, dtype, index, opinfo = record["overload"], record["dtype"], record["index"], record["opinfo"]
    args, kwargs, outputs, n_inputs = record["args"], record["kwargs"], record["outputs"], record["inputs"]
    if dtype not in discovery.DISCOVERY_DTYPES:
        raise RerunFileError(f"{where}: dtype {_short(dtype)} is not one of {', '.join(discovery.DISCOVERY_DTYPES)}")
    for name, value in (("index", index), ("inputs", n_inputs)):
        if type(value) is not int or not 0 <= value < 10_000:
            raise RerunFileError(f"{where}: {name} must be an integer from 0 to 9999, got {_short(value)}")
    if type(opinfo) is not str or len(opinfo) > 200:
        raise RerunFileError(f"{where}: opinfo must be a string of at most 200 characters")
    if not isinstance(args, list) or not isinstance(kwargs, dict):
        raise RerunFileError(f"{where}: args must be a list and kwargs an object")
    if _depth([args, kwargs], MAX_ARG_DEPTH) > MAX_ARG_DEPTH:
        raise RerunFileError(f"{where}: args nest deeper than {MAX_ARG_DEPTH} levels")
    if outputs is not None and not (
        isinstance(outputs, list) and all(type(i) is int and 0 <= i < 64 for i in outputs) and len(outputs) <= 64
    ):
        raise RerunFileError(f"{where}: outputs must be null or a list of result indices, got {_short(outputs)}")
    try:
        op = discovery.resolve_overload(overload, where=f"{path}, sample")
    except OperatorRefusedError as exc:
        raise RerunFileError(str(exc)) from None
    if _compat.op_schema(op).is_mutable:  # the ops data holds functional calls only
        reason = "it writes to its arguments; the ops category runs functional operators only"
        raise RerunFileError(str(OperatorRefusedError(overload, f"{path}, sample", reason)))
    inputs = []
    for i in range(n_inputs):
        tensor = tensors.get(f"input{i}")
        if tensor is None:
            raise RerunFileError(f"{path}: the sample takes {n_inputs} inputs, but tensor 'input{i}' is missing")
        inputs.append(tensor)
    try:
        call_args = discovery.decode_arg(args, inputs)
        call_kwargs = discovery.decode_arg_dict(kwargs, inputs)
    except ValueError as exc:
        raise RerunFileError(f"{where}: {exc}") from None
    # An operator whose kernel trusts index-like arguments (segment_reduce's offsets) has them checked
    # here, as the interpreter checks them per call: the rerun also calls the operator eagerly, for the
    # reference, and that call must not read outside its tensors either.
    check = argument_check(overload)
    if check is not None:
        try:
            check(*call_args, **call_kwargs)
        except (TypeError, ValueError) as exc:
            raise RerunFileError(f"{where}: {exc}") from None
    sample = discovery.OpSample(
        overload,
        dtype,
        index,
        opinfo,
        args,
        kwargs,
        outputs,
        inputs,
        kind=kind,
        opinfo_tolerance=tuple(tolerance) if tolerance is not None else None,
    )
    _check_against_recorded(path, sample)
    return sample


def _check_against_recorded(path: Any, sample: Any) -> None:
    """The sample must be the one the ops data records (same call, same input shapes), where that data is here."""
    from ..conformance.ops import discovery

    if sample.kind == "long":
        from ..conformance.ops import long_samples

        data: Any = discovery.OpsData("", long_samples())
        source = "the suite's long-reduction samples"
    else:
        data = discovery.load(discovery.DATA_DIR, discovery.release())
        source = f"the ops data of torch {data.torch_version}" if data is not None else ""
    if data is None:
        return  # no data for this torch: the output-size check on fake tensors still bounds the run
    for recorded in data.samples:
        if (recorded.overload, recorded.dtype, recorded.kind, recorded.index) != (
            sample.overload,
            sample.dtype,
            sample.kind,
            sample.index,
        ):
            continue
        same_call = (recorded.args, recorded.kwargs, recorded.outputs) == (sample.args, sample.kwargs, sample.outputs)
        same_inputs = [(t.dtype, tuple(t.shape)) for t in recorded.inputs] == [
            (t.dtype, tuple(t.shape)) for t in sample.inputs
        ]
        if not (same_call and same_inputs):
            raise RerunFileError(
                f"{path}: sample {sample.name} differs from the one {source} "
                "records (its arguments or its inputs' shapes and dtypes); the file was changed after it was written"
            )
        return
    raise RerunFileError(f"{path}: {source} has no sample {sample.name}")


def check_output_sizes(path: Any, program: Any) -> None:
    """Refuse a call whose outputs (known from fake-tensor propagation) would take more than `MAX_OUTPUT_BYTES`."""
    total = 0
    for node in program.graph.nodes:
        if node.op == "call_function":
            values = node.meta.get("val")
            for value in values if isinstance(values, (list, tuple)) else (values,):
                if hasattr(value, "numel") and hasattr(value, "element_size"):
                    total += int(value.numel()) * value.element_size()
    if total > MAX_OUTPUT_BYTES:
        raise RerunFileError(
            f"{path}: the sample's call would make {total} bytes of outputs, more than {MAX_OUTPUT_BYTES}"
        )


# --- parity -----------------------------------------------------------------------------


def checked_parity(path: Any, metadata: dict, tensors: dict, ctx: Any) -> tuple[str, str, str, dict | None]:
    """``(case, dtype, method, sizes)`` of a parity rerun file, checked against the case before allocating."""
    case_name, dtype, method = (str(metadata.get(k, "")) for k in ("case", "dtype", "method"))
    case = ctx.cases.get(case_name)
    if case is None:
        raise RerunFileError(
            f"{path}: no model case {_short(case_name)} here (a vendor case needs its plugin: add -p MODULE)"
        )
    if method not in case.methods:
        raise RerunFileError(f"{path}: case {case_name!r} has no method {_short(method)}; its methods: {case.methods}")
    if dtype not in ctx.dtypes_for(case):
        raise RerunFileError(
            f"{path}: case {case_name!r} is not checked in dtype {_short(dtype)} by this backend; "
            f"its dtypes: {', '.join(ctx.dtypes_for(case))}"
        )
    sizes = None
    if "sizes" in metadata:
        sizes = parse_json(metadata["sizes"], f"{path}: metadata field 'sizes'")
        dims = case.method_dims(method)
        if not isinstance(sizes, dict) or not sizes:
            raise RerunFileError(f"{path}: metadata field 'sizes' must be a JSON object {{dim: size}}")
        for name, size in sizes.items():
            dim = dims.get(name)
            if dim is None:
                raise RerunFileError(
                    f"{path}: sizes name {_short(name)}, which is not a dynamic dimension of "
                    f"{case_name}.{method} (its dimensions: {', '.join(dims) or 'none'})"
                )
            if type(size) is not int or not dim.min <= size <= dim.max:
                raise RerunFileError(
                    f"{path}: size {_short(size)} of dimension {name!r} is not an integer in its recorded range "
                    f"[{dim.min}, {dim.max}]"
                )
    _check_tensors(path, tensors, _expected_tensors(case, dtype, method, sizes))
    return case_name, dtype, method, sizes


def _expected_tensors(case: Any, dtype: str, method: str, sizes: dict | None) -> list[tuple[str, tuple]]:
    """``(dtype name, shape)`` of each tensor the method's example has, computed without making any."""
    from ..cases import TensorInput
    from ..suite import FIXED

    from .. import _compat

    merged = {**case.example_sizes(), **(sizes or {})} if case.dims else None
    found = []
    for spec in case.inputs[method]:
        if isinstance(spec, TensorInput):
            name = dtype if spec.dtype == "float" else spec.dtype
            found.append(("float32" if name == FIXED else name, tuple(spec.concrete_shape(merged))))
        else:  # a fixed value of the case: its tensors are saved as they are
            found.extend(_tensor_leaves(_compat.tree_leaves(spec)))
    found.extend(_tensor_leaves(_compat.tree_leaves(dict(case.kwargs.get(method, {})))))
    return found


def _tensor_leaves(leaves: list) -> list[tuple[str, tuple]]:
    import torch

    return [(str(v.dtype).removeprefix("torch."), tuple(v.shape)) for v in leaves if isinstance(v, torch.Tensor)]


def _check_tensors(path: Any, tensors: dict, expected: list[tuple[str, tuple]]) -> None:
    if len(tensors) != len(expected) or any(f"input{i}" not in tensors for i in range(len(expected))):
        raise RerunFileError(
            f"{path}: the method takes {len(expected)} tensors (input0 ...), the file holds "
            f"{len(tensors)}: {_short(sorted(tensors))}"
        )
    for i, (dtype, shape) in enumerate(expected):
        tensor = tensors[f"input{i}"]
        got = (str(tensor.dtype).removeprefix("torch."), tuple(tensor.shape))
        if got != (dtype, shape):
            raise RerunFileError(
                f"{path}: tensor 'input{i}' is {got[0]}{list(got[1])}; the method's recorded input is "
                f"{dtype}{list(shape)}"
            )
