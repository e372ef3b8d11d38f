"""Find the OpInfo entries that export to a single-op program, and keep their samples as data.

PyTorch's OpInfo database (``op_db``) lists hundreds of operators with
sample inputs per dtype. For every entry, dtype and sample, this module
wraps the call in a tiny module, exports it (``torch.export`` and, when the
op has one, the default decomposition), and keeps it when the program is
exactly one aten op: the overload it became, the node's arguments (tensors
replaced by input references) and the input tensors.

Importing ``op_db`` and exporting thousands of calls takes minutes, so the
result is data: ``conformance/ops_data/`` ships it for the torch versions the
project tests, ``python -m pytest_backendconf.conformance.ops.discovery``
regenerates it, and the suite falls back to discovering once per torch
version (into a user cache) when the installed torch has no data file.
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import hashlib
import json
import math
import operator
import os
import sys
import time
import warnings
from pathlib import Path
from typing import Any, Callable, Iterator, Mapping

import torch

from ... import _compat
from ... import allowlist as _allowlist
from ...archive import FileTooLargeError, read_regular_file, read_tensors, write_atomic, write_tensors

#: Dtypes discovery looks at; the suite tests those the backend declares (or all of them).
DISCOVERY_DTYPES = ("float32", "float16", "bfloat16", "int64", "bool")
#: Samples kept per (overload, dtype) for the default mode.
DEFAULT_SAMPLES = 2
#: Samples tried per (OpInfo entry, dtype) to find the kept ones (exports are the slow step).
DEFAULT_TRIES = 8
FORMAT = "backendconf-ops-data"
FORMAT_VERSION = 1
DATA_DIR = Path(__file__).resolve().parent.parent / "ops_data"


@dataclasses.dataclass
class OpSample:
    """One single-op call: what the ops check exports, lowers and compares."""

    overload: str  #: "aten.add.Tensor"
    dtype: str  #: the dtype under test ("float16")
    index: int  #: k of ``sample<k>`` within (overload, dtype)
    opinfo: str  #: the OpInfo entry it comes from ("add", "max.reduction_with_dim")
    args: Any  #: JSON tree; ``{"$input": i}`` is the i-th input tensor
    kwargs: dict[str, Any]
    #: ``None``: the op's result is the program's only output; else the
    #: indices of the op's result tuple the program returns, in order.
    outputs: list[int] | None
    inputs: list[torch.Tensor]
    #: ``sample``: an OpInfo sample; ``long``: a long-reduction sample of the suite's own (`_long_samples`).
    kind: str = "sample"
    #: ``(rtol, atol)`` of the OpInfo entry's ``toleranceOverride`` for this dtype, if it has one.
    opinfo_tolerance: tuple[float, float] | None = None

    @property
    def name(self) -> str:
        return f"{self.overload}[{self.dtype}-{self.kind}{self.index}]"

    def as_json(self) -> dict[str, Any]:
        record = {
            "overload": self.overload,
            "dtype": self.dtype,
            "index": self.index,
            "opinfo": self.opinfo,
            "args": self.args,
            "kwargs": self.kwargs,
            "outputs": self.outputs,
            "inputs": len(self.inputs),
        }
        if self.kind != "sample":
            record["kind"] = self.kind
        if self.opinfo_tolerance is not None:
            record["opinfo_tolerance"] = list(self.opinfo_tolerance)
        return record


@dataclasses.dataclass
class OpsData:
    torch_version: str
    samples: list[OpSample]
    #: OpInfo entries discovery looked at, and how many became single-op programs.
    entries_seen: int = 0
    entries_kept: int = 0
    #: OpInfo entry -> dtype -> ``[rtol, atol]`` of its ``toleranceOverride`` (`opinfo_tolerances`).
    tolerances: dict[str, dict[str, list[float]]] = dataclasses.field(default_factory=dict)
    #: Where the samples come from: ``shipped``, a cache folder, or ``discovered`` (this process).
    source: str = "discovered"

    def record(self) -> dict[str, Any]:
        """The report's ``ops.samples``: how many samples the run's ops checks were made from, their
        digest (names, arguments and input bytes) and where they came from, so that a run whose sample
        set shrank or changed shows it."""
        digest = hashlib.sha256()
        for sample in self.samples:
            digest.update(json.dumps([sample.name, sample.args, sample.kwargs, sample.outputs], default=str).encode())
            for tensor in sample.inputs:
                digest.update(f"{tensor.dtype}{tuple(tensor.shape)}".encode())
                digest.update(tensor.detach().contiguous().cpu().view(-1).view(torch.uint8).numpy().tobytes())
        return {"count": len(self.samples), "digest": f"sha256:{digest.hexdigest()}", "source": self.source}


def release(version: str | None = None) -> str:
    """``2.13.0`` for ``2.13.0+cpu``: data files are keyed by the release, not the build."""
    return (version or torch.__version__).split("+")[0]


# --- encoding of a node's non-tensor arguments ------------------------------------


class _Unencodable(Exception):
    pass


def encode_arg(value: Any, inputs: dict[Any, int]) -> Any:
    """A node argument as JSON; raises `_Unencodable` for what the data cannot carry."""
    if isinstance(value, torch.fx.Node):
        if value not in inputs:
            raise _Unencodable(f"argument {value.name} is not a program input")
        return {"$input": inputs[value]}
    if value is None or isinstance(value, (bool, int, str)):
        return value
    if isinstance(value, float):
        return value if math.isfinite(value) else {"$float": repr(value)}
    if isinstance(value, (list, tuple)):
        return [encode_arg(v, inputs) for v in value]
    if isinstance(value, torch.dtype):
        return {"$dtype": str(value).removeprefix("torch.")}
    if isinstance(value, torch.memory_format):
        return {"$memory_format": str(value).removeprefix("torch.")}
    if isinstance(value, torch.layout):
        return {"$layout": str(value).removeprefix("torch.")}
    if isinstance(value, torch.device):
        return {"$device": str(value)}
    raise _Unencodable(f"argument of type {type(value).__name__}")


def decode_arg(value: Any, inputs: list[Any]) -> Any:
    """The inverse of `encode_arg`: ``{"$input": i}`` becomes ``inputs[i]``.

    The data may come from a rerun file: tags name dtypes, memory formats and layouts through
    fixed tables (never ``getattr(torch, ...)``), and anything else is a ``ValueError``."""
    if isinstance(value, list):
        return [decode_arg(v, inputs) for v in value]
    if isinstance(value, dict):
        if len(value) != 1:
            raise ValueError(f"a tagged value has exactly one key, got {_short(value)}")
        ((tag, item),) = value.items()
        if tag == "$input":
            if type(item) is not int or not 0 <= item < len(inputs):
                raise ValueError(f"{_short(value)} names no input; there are {len(inputs)}")
            return inputs[item]
        if tag == "$float":
            if item not in ("inf", "-inf", "nan"):
                raise ValueError(f"{_short(value)}: $float holds 'inf', '-inf' or 'nan'")
            return float(item)
        table: dict[str, Mapping[str, object]] = {
            "$dtype": _allowlist.DTYPES,
            "$memory_format": _allowlist.MEMORY_FORMATS,
            "$layout": _allowlist.LAYOUTS,
        }
        if tag in table:
            found = table[tag].get(item) if type(item) is str else None
            if found is None:
                raise ValueError(f"{_short(value)} names no known {tag[1:]}; known: {', '.join(table[tag])}")
            return found
        if tag == "$device":
            if item != "cpu":
                raise ValueError(f"{_short(value)}: the ops data runs on the device 'cpu' only")
            return torch.device(item)
        raise ValueError(f"unknown tagged value {_short(value)} in the ops data")
    if value is None or type(value) in (bool, int, float, str):
        return value
    raise ValueError(f"{_short(value)} is not a value of the ops data")


def _short(value: Any, limit: int = 60) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def resolve_overload(name: str, where: str = "the ops data") -> Any:
    """``torch.ops.aten.add.Tensor`` for ``"aten.add.Tensor"``, through the allowlist
    (`pytest_backendconf.allowlist.resolve_operator`): a rerun file names it."""
    return _allowlist.resolve_operator(name, where=where)


# --- discovery ------------------------------------------------------------------------


class _Recorder(_compat.dispatch_mode_base()):  # type: ignore[misc]
    """Every aten op an eager call runs, below autograd (where export's IR is)."""

    def __init__(self) -> None:
        super().__init__()
        self.calls: list[tuple[Any, tuple, dict, Any]] = []

    def __torch_dispatch__(self, func: Any, types: Any, args: tuple = (), kwargs: dict | None = None) -> Any:
        kwargs = kwargs or {}
        result = func(*args, **kwargs)
        self.calls.append((func, args, kwargs, result))
        return result


class _Call(torch.nn.Module):
    """The tiny module discovery exports to confirm an overload: one OpInfo call, its tensors as inputs."""

    def __init__(self, fn: Callable[..., Any], leaves: list[Any], spec: Any, positions: list[int]) -> None:
        super().__init__()
        self.fn, self.leaves, self.spec, self.positions = fn, leaves, spec, positions

    def forward(self, *tensors: torch.Tensor) -> Any:
        leaves = list(self.leaves)
        for position, tensor in zip(self.positions, tensors):
            leaves[position] = tensor
        sample_input, args, kwargs = _compat.tree_unflatten(leaves, self.spec)
        return self.fn(sample_input, *args, **kwargs)


def _single_op(program: Any) -> Any:
    """The one aten op node of an exported program, or ``None``."""
    signature = program.graph_signature
    if any(s.kind.name != "USER_INPUT" for s in signature.input_specs):
        return None
    if any(s.kind.name != "USER_OUTPUT" for s in signature.output_specs):
        return None
    graph = program.graph_module.graph
    ops = [n for n in graph.nodes if n.op == "call_function" and n.target is not operator.getitem]
    if len(ops) != 1 or any(n.op == "get_attr" for n in graph.nodes):
        return None
    return ops[0]


def _deterministic(overload: Any) -> bool:
    name = overload.name().split("::")[1].split(".")[0]
    if torch.Tag.nondeterministic_seeded in overload.tags or "empty" in name:
        return False  # random numbers, or uninitialized memory
    return True


def _same(a: Any, b: Any) -> bool:
    la, lb = _compat.tree_leaves(a), _compat.tree_leaves(b)
    if len(la) != len(lb):
        return False
    for x, y in zip(la, lb):
        if isinstance(x, torch.Tensor) != isinstance(y, torch.Tensor):
            return False
        if isinstance(x, torch.Tensor) and (
            x.shape != y.shape
            or x.dtype != y.dtype
            or not torch.equal(
                torch.nan_to_num(x.double() if x.is_floating_point() else x),
                torch.nan_to_num(y.double() if y.is_floating_point() else y),
            )
        ):
            return False
    return True


def _plain(t: Any) -> bool:
    return isinstance(t, torch.Tensor) and t.layout == torch.strided and not t.is_complex() and t.device.type == "cpu"


class _NotOneOp(Exception):
    pass


def sample_to_op(
    fn: Callable[..., Any], sample: Any
) -> tuple[Any, list, dict, list[int] | None, list[torch.Tensor]] | None:
    """Run one OpInfo sample; ``(overload, args, kwargs, outputs, inputs)`` if it is one aten op.

    The call runs eagerly under a dispatch mode that records the aten ops it
    reaches: one op, fed only with the sample's own tensors and returning
    what the call returns, is a single-op program (about 1 ms, where an
    export takes 50). `confirm` exports one sample per overload to be sure.
    """
    leaves, _ = _compat.tree_flatten((sample.input, tuple(sample.args), dict(sample.kwargs)))
    tensors = [leaf for leaf in leaves if isinstance(leaf, torch.Tensor)]
    if not tensors or not all(_plain(t) for t in tensors):
        return None
    recorder = _Recorder()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with recorder:
            result = fn(sample.input, *sample.args, **sample.kwargs)
    if len(recorder.calls) != 1:
        return None
    overload, call_args, call_kwargs, op_result = recorder.calls[0]
    if not _compat.is_op_overload(overload) or overload.namespace != "aten" or _compat.op_schema(overload).is_mutable:
        return None
    if not _deterministic(overload):
        return None
    ids = {id(t): t for t in tensors}
    used: list[torch.Tensor] = []

    def reference(value: Any) -> Any:
        if isinstance(value, torch.Tensor):
            if id(value) not in ids:
                raise _NotOneOp("a tensor the call made itself")
            if not any(value is u for u in used):
                used.append(value)
            return {"$input": next(i for i, u in enumerate(used) if u is value)}
        if isinstance(value, (list, tuple)):
            return [reference(v) for v in value]
        return encode_arg(value, {})

    try:
        args = reference(list(call_args))
        kwargs = {k: reference(v) for k, v in call_kwargs.items()}
    except (_NotOneOp, _Unencodable):
        return None
    op_outputs = list(op_result) if isinstance(op_result, (tuple, list)) else [op_result]
    returned = _compat.tree_leaves(result)
    if isinstance(result, torch.Tensor) and result is op_result:
        outputs = None
    else:
        try:
            outputs = [next(i for i, o in enumerate(op_outputs) if o is r) for r in returned]
        except StopIteration:
            return None
    if not returned or not all(_plain(t) for t in returned):
        return None
    inputs = [t.detach().clone() for t in used]
    again = overload(*decode_arg(args, inputs), **decode_arg_dict(kwargs, inputs))
    if not _same(op_result, again):
        return None
    return overload, args, kwargs, outputs, inputs


def confirm(fn: Callable[..., Any], sample: Any, expected: Any, decompositions: Any) -> bool:
    """Whether ``torch.export`` (and the default decomposition) makes the sample the ``expected`` op."""
    verdict = _export_one(fn, sample, expected, decompositions)
    if verdict is _DECOMPOSE:
        return confirm_batch([(fn, sample, expected)])[0]
    return verdict


#: `_export_one`'s answer when the op has a default decomposition: only `confirm_batch` can tell.
_DECOMPOSE = object()


def _export_one(fn: Callable[..., Any], sample: Any, expected: Any, decompositions: Any) -> Any:
    """``torch.export`` of one sample: ``False``, ``True``, or `_DECOMPOSE` when the single op it makes
    has a default decomposition, which `confirm_batch` runs for many samples at once."""
    module, tensors = _call_module(fn, sample)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            node = _single_op(_compat.export(module, tensors))
        except Exception:
            return False
    if node is None:
        return False
    # An op with a default decomposition is judged after it (aten.softmax.int becomes aten._softmax.default).
    return _DECOMPOSE if node.target in decompositions else node.target == expected


def _call_module(fn: Callable[..., Any], sample: Any) -> tuple[_Call, tuple[torch.Tensor, ...]]:
    leaves, spec = _compat.tree_flatten((sample.input, tuple(sample.args), dict(sample.kwargs)))
    positions = [i for i, leaf in enumerate(leaves) if isinstance(leaf, torch.Tensor)]
    return _Call(fn, leaves, spec, positions), tuple(leaves[i] for i in positions)


class _Batch(torch.nn.Module):
    """Many `_Call` modules side by side: one export and one decomposition for all of them."""

    def __init__(self, calls: list[_Call], counts: list[int]) -> None:
        super().__init__()
        self.calls, self.counts = torch.nn.ModuleList(calls), counts

    def forward(self, *tensors: torch.Tensor) -> Any:
        results, start = [], 0
        for call, count in zip(self.calls, self.counts):
            results.append(call(*tensors[start : start + count]))
            start += count
        return tuple(results)


def confirm_batch(items: list[tuple[Callable[..., Any], Any, Any]]) -> list[bool]:
    """`confirm` for many ``(fn, sample, expected)`` whose single op has a default decomposition.

    ``run_decompositions`` costs seconds however small the program (torch
    walks every CompositeImplicitAutograd op of every namespace each time),
    so the samples are exported side by side in one program and decomposed
    once. A sample is confirmed when its outputs come from one node, the
    ``expected`` op, reading program inputs only. Samples are independent,
    so each one's nodes are those its outputs depend on; a node no sample's
    outputs reach (or a lifted constant, or an export error) could belong to
    any of them, and the batch is halved until it is unambiguous. One
    sample alone is `confirm`'s own export and decomposition.
    """
    if not items:
        return []
    pairs = [_call_module(fn, sample) for fn, sample, _ in items]
    module = _Batch([call for call, _ in pairs], [len(tensors) for _, tensors in pairs])
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            program = _compat.export(module, tuple(t for _, tensors in pairs for t in tensors))
            program = program.run_decompositions()
            verdicts = _batch_verdicts(program, items)
        except Exception:
            verdicts = None
    if verdicts is not None:
        return verdicts
    if len(items) == 1:
        return [False]
    half = len(items) // 2
    return confirm_batch(items[:half]) + confirm_batch(items[half:])


def _batch_verdicts(program: Any, items: list[tuple[Any, Any, Any]]) -> list[bool] | None:
    """Per item of a decomposed batch program, whether its outputs are one ``expected`` node on inputs;
    ``None`` when the program cannot be split into the items' own nodes."""
    # The program returns a tuple with one result per item: its spec says how many leaves each has.
    counts = [child.num_leaves for child in _compat.spec_children(program.call_spec.out_spec)]
    if len(counts) != len(items):
        return None
    signature = program.graph_signature
    if any(s.kind.name != "USER_INPUT" for s in signature.input_specs):
        return None
    if any(s.kind.name != "USER_OUTPUT" for s in signature.output_specs):
        return None
    graph = program.graph_module.graph
    if any(n.op == "get_attr" for n in graph.nodes):
        return None
    outputs = list(graph.output_node().args[0])
    if len(outputs) != sum(counts):
        return None
    ops = {n for n in graph.nodes if n.op == "call_function" and n.target is not operator.getitem}
    reached: set[Any] = set()
    verdicts, start = [], 0
    for count, (_, _, expected) in zip(counts, items):
        cone = _op_cone(outputs[start : start + count])
        start += count
        reached |= cone
        verdicts.append(len(cone) == 1 and next(iter(cone)).target == expected)
    return verdicts if reached == ops else None


def _op_cone(outputs: list[Any]) -> set[Any]:
    """The op nodes (``getitem`` aside) the given output nodes depend on."""
    cone: set[Any] = set()
    stack = [o for o in outputs if isinstance(o, torch.fx.Node)]
    seen: set[Any] = set()
    while stack:
        node = stack.pop()
        if node in seen:
            continue
        seen.add(node)
        if node.op == "call_function" and node.target is not operator.getitem:
            cone.add(node)
        stack.extend(node.all_input_nodes)
    return cone


def decode_arg_dict(kwargs: dict[str, Any], inputs: list[Any]) -> dict[str, Any]:
    return {k: decode_arg(v, inputs) for k, v in kwargs.items()}


def overload_name(overload: Any) -> str:
    """``"aten.add.Tensor"`` for ``torch.ops.aten.add.Tensor`` (the name `Capabilities` uses)."""
    qualified = overload.name()  # "aten::add.Tensor"
    namespace, rest = qualified.split("::")
    return f"{namespace}.{rest}" if "." in rest else f"{namespace}.{rest}.default"


def discover(
    op_db: list[Any],
    *,
    max_samples: int | None = DEFAULT_SAMPLES,
    tries: int | None = DEFAULT_TRIES,
    progress: Callable[[str], None] | None = None,
) -> OpsData:
    """Every single-op (overload, dtype, sample) of ``op_db``; ``None`` limits mean every sample.

    Each overload is confirmed with ``torch.export`` on its first sample. When
    that op has a default decomposition, whether it survives decomposition is
    decided later, for all such overloads in one batch (`confirm_batch`), and
    the selection assumes it does meanwhile; an overload the batch refutes
    makes the selection run again (from the samples already run, no new
    eager call), as it would have gone had it been refuted at once.
    """
    decompositions = torch.export.default_decompositions()
    #: overload -> whether torch.export confirmed it (checked on its first sample).
    confirmed: dict[str, bool] = {}
    #: (entry number, dtype) -> the entry's samples in that dtype and what `sample_to_op` made of each.
    tried: dict[tuple[int, str], list[tuple[Any, Any]]] = {}
    #: overload -> the sample that awaits `confirm_batch`, in this round of selection.
    pending: dict[str, tuple[Callable[..., Any], Any, Any]] = {}

    def verdict(name: str, fn: Callable[..., Any], sample: Any, overload: Any) -> bool:
        if name not in confirmed and name not in pending:
            answer = _export_one(fn, sample, overload, decompositions)
            if answer is _DECOMPOSE:
                pending[name] = (fn, sample, overload)
            else:
                confirmed[name] = answer
        return confirmed.get(name, True)  # pending: assumed until its batch answers

    while True:
        pending.clear()
        kept, entries_kept = _select(op_db, verdict, tried, max_samples, tries, progress)
        if not pending:
            break
        if progress:
            progress(f"confirming {len(pending)} overloads through the default decompositions, in one batch")
        answers = confirm_batch(list(pending.values()))
        confirmed.update(zip(pending, answers))
        if all(answers):
            break
        if progress:
            progress(f"{answers.count(False)} of them do not stay one op: selecting again without them")
    samples = [s for bucket in kept.values() for s in bucket]
    samples.sort(key=lambda s: (s.overload, DISCOVERY_DTYPES.index(s.dtype), s.index))
    tolerances = opinfo_tolerances(op_db, {s.opinfo for s in samples})
    return OpsData(release(), samples, entries_seen=len(op_db), entries_kept=entries_kept, tolerances=tolerances)


def _select(
    op_db: list[Any],
    verdict: Callable[[str, Callable[..., Any], Any, Any], bool],
    tried: dict[tuple[int, str], list[tuple[Any, Any]]],
    max_samples: int | None,
    tries: int | None,
    progress: Callable[[str], None] | None,
) -> tuple[dict[tuple[str, str], list[OpSample]], int]:
    """The samples kept per (overload, dtype), and how many entries gave any; ``verdict`` confirms overloads."""
    kept: dict[tuple[str, str], list[OpSample]] = {}
    entries_kept = 0
    for number, info in enumerate(op_db):
        entry = info.name + (f".{info.variant_test_name}" if info.variant_test_name else "")
        if progress and number % 50 == 0:
            progress(f"{number}/{len(op_db)} {entry}: {sum(len(v) for v in kept.values())} samples so far")
        try:
            supported = info.supported_dtypes("cpu")
        except Exception:
            continue
        took_any = False
        for dtype in DISCOVERY_DTYPES:
            if getattr(torch, dtype) not in supported:
                continue
            if (number, dtype) not in tried:
                # Every try at once: sample functions draw from the global generator, reseeded per
                # (entry, dtype), so a later selection must reuse these samples, not draw again.
                tried[number, dtype] = list(_samples_of(info, dtype, tries))
            accepted = 0
            for sample, found in tried[number, dtype]:
                if max_samples is not None and accepted >= max_samples:
                    break
                if not found:
                    continue
                overload, args, kwargs, outputs, inputs = found
                name = overload_name(overload)
                if not verdict(name, info.op, sample, overload):
                    continue
                bucket = kept.setdefault((name, dtype), [])
                if max_samples is not None and len(bucket) >= max_samples:
                    continue
                bucket.append(OpSample(name, dtype, len(bucket), entry, args, kwargs, outputs, inputs))
                took_any = True
                accepted += 1
        entries_kept += took_any
    return kept, entries_kept


#: Test classes whose ``toleranceOverride`` says nothing of a CPU forward result (gradients,
#: forward-mode AD, MPS against CPU).
_NOT_FORWARD = ("TestConsistency", "TestOperators", "TestCompositeCompliance", "TestGradients", "TestMasked")


def opinfo_tolerances(op_db: list[Any], entries: set[str]) -> dict[str, dict[str, list[float]]]:
    """Per OpInfo entry, what its ``toleranceOverride`` decorators allow per dtype, as ``[rtol, atol]``.

    PyTorch's own tests loosen the tolerance of some ops in some dtypes
    (``addbmm`` in float16 on CPU: ``atol=6e-3, rtol=1e-2``). The overrides
    kept are those for CPU (or any device) in the tests of a forward result;
    the loosest of them per dtype is what PyTorch accepts of its own kernels.
    """
    override_type = _compat.opinfo_tolerance_override_type()
    found: dict[str, dict[str, list[float]]] = {}
    if override_type is None:
        return found
    for info in op_db:
        entry = info.name + (f".{info.variant_test_name}" if info.variant_test_name else "")
        if entry not in entries:
            continue
        for decorate in getattr(info, "decorators", ()) or ():
            if getattr(decorate, "device_type", None) not in (None, "cpu"):
                continue
            if getattr(decorate, "cls_name", None) in _NOT_FORWARD:
                continue
            test = getattr(decorate, "test_name", None) or ""
            if "grad" in test or "jvp" in test or "vjp" in test:
                continue
            for decorator in getattr(decorate, "decorators", ()) or ():
                if not isinstance(decorator, override_type):
                    continue
                for dtype, tol in decorator.d.items():
                    name = str(dtype).removeprefix("torch.")
                    if name not in DISCOVERY_DTYPES or not dtype.is_floating_point:
                        continue
                    pair = found.setdefault(entry, {}).setdefault(name, [0.0, 0.0])
                    pair[0], pair[1] = max(pair[0], float(tol.rtol)), max(pair[1], float(tol.atol))
    return found


def _samples_of(info: Any, dtype: str, tries: int | None) -> Iterator[tuple[Any, Any]]:
    torch.manual_seed(0)  # sample functions draw from the global generator: fixed samples
    try:
        samples = info.sample_inputs("cpu", getattr(torch, dtype), requires_grad=False)
        for number, sample in enumerate(samples):
            if tries is not None and number >= tries:
                return
            try:
                yield sample, sample_to_op(info.op, sample)
            except Exception:
                yield sample, None  # the call failed: skip the sample, keep trying the entry
    except Exception:
        return


# --- the data files ---------------------------------------------------------------------


def data_paths(directory: Path, version: str, mode: str = "default") -> tuple[Path, Path]:
    stem = f"torch-{version}" + ("" if mode == "default" else f"-{mode}")
    return directory / f"{stem}.json", directory / f"{stem}.safetensors"


def save(data: OpsData, directory: Path, mode: str = "default", *, index_only: bool = False) -> None:
    """Write the data files; ``index_only``: the JSON index alone (the tensors are unchanged)."""
    directory.mkdir(parents=True, exist_ok=True)
    index, tensors_path = data_paths(directory, data.torch_version, mode)
    if not index_only:
        tensors = {f"{n}.{i}": t for n, s in enumerate(data.samples) for i, t in enumerate(s.inputs)}
        write_tensors(tensors_path, tensors, {"format": FORMAT})
    document = {
        "format": FORMAT,
        "version": FORMAT_VERSION,
        "torch": data.torch_version,
        "opinfo_entries": data.entries_seen,
        "opinfo_entries_kept": data.entries_kept,
        "opinfo_tolerances": data.tolerances,
        "samples": [{k: v for k, v in s.as_json().items() if k != "opinfo_tolerance"} for s in data.samples],
    }
    # Atomic, through a fresh temporary file: a link planted in the cache folder is replaced, never written through.
    write_atomic(index, json.dumps(document, indent=0, sort_keys=True) + "\n", sync=False)


#: The largest index and tensor file `load` reads: the shipped ones are under 0.4 and 1.5 MB; ``all``
#: mode's discovery keeps every sample, about ten times as many.
MAX_INDEX_BYTES = 64 << 20
MAX_TENSOR_BYTES = 512 << 20
#: The most input tensors one sample may name (the widest OpInfo call takes a handful).
MAX_INPUTS = 64


class OpsDataError(ValueError):
    """A data file that is not what ``save`` writes: its text names the file, the field and the fix."""


def load(directory: Path, version: str, mode: str = "default") -> OpsData | None:
    """The data for a torch release, or ``None`` when there is none (or it is for another release).

    Every file is read as data from outside (a samples cache may be a restored CI cache): its size is
    bounded, its JSON nesting too, and every field is checked; a file that is not what `save` writes
    is an `OpsDataError` naming it. The OpInfo tolerance overrides are never taken from ``directory``
    unless it is the shipped data's: a cache holds samples, not how strict a check is
    (`shipped_tolerances`).
    """
    index, tensors_path = data_paths(directory, version, mode)
    if not os.path.lexists(index) or not os.path.lexists(tensors_path):
        return None
    shipped = directory.resolve() == DATA_DIR.resolve()
    # A cache's files are its own: a link, a FIFO or a device there is refused (the package's own may be links).
    document = _read_index(index, follow_symlinks=shipped)
    if document.get("format") != FORMAT or document.get("version") != FORMAT_VERSION:
        raise OpsDataError(
            f"{index}: not a {FORMAT} file of version {FORMAT_VERSION}; remove it (the samples are discovered again)"
        )
    if document.get("torch") != version:
        return None
    try:
        tensors, _ = read_tensors(tensors_path, max_bytes=MAX_TENSOR_BYTES, follow_symlinks=shipped)
    except ValueError as exc:  # the tensor file's reader names the file and what is wrong (its size too)
        raise OpsDataError(f"{exc}; remove it (the samples are discovered again)") from None
    tolerances = document.get("opinfo_tolerances") if shipped else shipped_tolerances(version)
    try:
        records = _sample_records(document, tensors)
        if shipped:
            _check_tolerances(tolerances)
    except ValueError as exc:
        raise OpsDataError(f"{index}: {exc}; remove it (the samples are discovered again)") from None
    assert isinstance(tolerances, dict)
    samples = [
        OpSample(
            r["overload"],
            r["dtype"],
            r["index"],
            r["opinfo"],
            r["args"],
            r["kwargs"],
            r["outputs"],
            # clone: a tensor of its own, not a view into the file's buffer (fake tensors of views are slow)
            [tensors[f"{n}.{i}"].clone() for i in range(r["inputs"])],
            opinfo_tolerance=_pair(tolerances.get(r["opinfo"], {}).get(r["dtype"])),
        )
        for n, r in enumerate(records)
    ]
    seen, kept = document.get("opinfo_entries"), document.get("opinfo_entries_kept")
    return OpsData(
        version,
        samples,
        seen if isinstance(seen, int) else 0,
        kept if isinstance(kept, int) else 0,
        tolerances,
        source="shipped" if shipped else str(directory),
    )


def with_shipped_tolerances(data: OpsData) -> OpsData:
    """``data`` (a discovery's) judged with the shipped OpInfo tolerance overrides, as a later run that
    reads it back from the cache will be: the first run and the next give the same verdicts."""
    tolerances = shipped_tolerances(data.torch_version)
    for sample in data.samples:
        sample.opinfo_tolerance = _pair(tolerances.get(sample.opinfo, {}).get(sample.dtype))
    return dataclasses.replace(data, tolerances=tolerances)


def _read_index(index: Path, *, follow_symlinks: bool = True) -> dict[str, Any]:
    from ...report import load_json

    try:
        text = read_regular_file(index, MAX_INDEX_BYTES, follow_symlinks=follow_symlinks).decode("utf-8")
    except FileTooLargeError:
        raise OpsDataError(f"{index}: larger than {MAX_INDEX_BYTES >> 20} MiB; remove it") from None
    except OSError as exc:  # a FIFO, a device, a link where none is followed: named, never opened for long
        raise OpsDataError(f"{index}: {exc.strerror or exc}; remove it (the samples are discovered again)") from None
    except UnicodeDecodeError:
        raise OpsDataError(f"{index}: not UTF-8 text; remove it") from None
    document = load_json(text, str(index), "remove it (the samples are discovered again)", OpsDataError)
    if not isinstance(document, dict):
        raise OpsDataError(f"{index}: holds {type(document).__name__}, not an object; remove it")
    return document


def _sample_records(document: dict[str, Any], tensors: dict[str, torch.Tensor]) -> list[dict[str, Any]]:
    """The index's ``samples``, each field checked, each input present in the tensor file."""
    from ...report import check_choice, check_type, field

    records: list[dict[str, Any]] = check_type(document.get("samples"), "list", "samples")
    for n, record in enumerate(records):
        where = f"samples[{n}]"
        check_type(record, "object", where)
        field(record, "overload", "string", where)
        check_choice(record.get("dtype"), DISCOVERY_DTYPES, f"{where}.dtype")
        field(record, "index", "count", where)
        field(record, "opinfo", "string", where)
        field(record, "kwargs", "object", where)
        outputs = field(record, "outputs", "list", where, optional=True)
        for i, output in enumerate(outputs or []):
            check_type(output, "count", f"{where}.outputs[{i}]")
        inputs = field(record, "inputs", "count", where)
        if inputs > MAX_INPUTS:
            raise ValueError(f"{where}.inputs is {inputs}; a sample takes at most {MAX_INPUTS} tensors")
        missing = [f"{n}.{i}" for i in range(inputs) if f"{n}.{i}" not in tensors]
        if missing:
            raise ValueError(f"{where} names input tensor {missing[0]!r}, which the tensor file does not hold")
    return records


def _check_tolerances(tolerances: object) -> None:
    from ...report import check_type

    check_type(tolerances, "object", "opinfo_tolerances")
    assert isinstance(tolerances, dict)
    for entry, by_dtype in tolerances.items():
        check_type(by_dtype, "object", f"opinfo_tolerances.{entry}")
        for dtype, pair in by_dtype.items():
            where = f"opinfo_tolerances.{entry}.{dtype}"
            if not (isinstance(pair, list) and len(pair) == 2):
                raise ValueError(f"{where} must be [rtol, atol]")
            for value in pair:
                check_type(value, "number", where)


@functools.cache
def shipped_tolerances(version: str) -> dict[str, dict[str, list[float]]]:
    """The OpInfo tolerance overrides of the shipped data: ``version``'s own first, then every other
    release's, the newest first.

    What samples that are not shipped (``all`` mode's, a torch without shipped ones) are judged with:
    they come from a discovery or a cache, and a cache may come from elsewhere, so how strict a check is
    comes from the project's own files. An override that only an unshipped torch has is not applied
    (its checks keep the default tolerance).
    """
    paths = sorted(DATA_DIR.glob("torch-*.json"), key=lambda p: (p.stem == f"torch-{version}", _release_key(p.stem)))
    found: dict[str, dict[str, list[float]]] = {}
    for path in reversed(paths):
        tolerances = _read_index(path).get("opinfo_tolerances")
        _check_tolerances(tolerances)
        assert isinstance(tolerances, dict)
        for entry, by_dtype in tolerances.items():
            for dtype, pair in by_dtype.items():
                found.setdefault(entry, {}).setdefault(dtype, pair)
    return found


def _release_key(stem: str) -> tuple[int, ...]:
    parts = stem.removeprefix("torch-").split("-")[0].split(".")
    return tuple(int(p) if p.isdigit() else -1 for p in parts)


def _pair(value: Any) -> tuple[float, float] | None:
    return None if value is None else (float(value[0]), float(value[1]))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Regenerate the ops category's data from PyTorch's OpInfo database.")
    parser.add_argument("--out", type=Path, default=DATA_DIR, help="directory of the data files (default: %(default)s)")
    parser.add_argument("--all", action="store_true", help="every sample of every entry (for --backendconf-ops=all)")
    parser.add_argument(
        "--tolerances-only",
        action="store_true",
        help="keep the samples of the existing data and rewrite only the OpInfo tolerance overrides in its index",
    )
    options = parser.parse_args(argv)
    torch.set_num_threads(1)
    op_db, reason = _compat.opinfo_database()
    if op_db is None:
        print(reason, file=sys.stderr)
        return 1
    mode = "all" if options.all else "default"
    if options.tolerances_only:
        existing = load(options.out, release(), mode)
        if existing is None:
            print(
                f"no {mode} ops data for torch {release()} in {options.out}: run without --tolerances-only",
                file=sys.stderr,
            )
            return 1
        existing.tolerances = opinfo_tolerances(op_db, {s.opinfo for s in existing.samples})
        save(existing, options.out, mode, index_only=True)
        print(
            f"torch {existing.torch_version}: OpInfo tolerance overrides of {len(existing.tolerances)} entries -> {options.out}"
        )
        return 0
    start = time.monotonic()
    data = discover(
        op_db,
        max_samples=None if options.all else DEFAULT_SAMPLES,
        tries=None if options.all else DEFAULT_TRIES,
        progress=lambda line: print(line, file=sys.stderr, flush=True),
    )
    save(data, options.out, "all" if options.all else "default")
    overloads = len({s.overload for s in data.samples})
    print(
        f"torch {data.torch_version}: {len(data.samples)} samples of {overloads} overloads from "
        f"{data.entries_kept} of {data.entries_seen} OpInfo entries in {time.monotonic() - start:.0f} s -> {options.out}"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
