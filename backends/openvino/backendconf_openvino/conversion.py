"""Convert a ``torch.export`` program to an OpenVINO IR blob (host only): the backend's ``preprocess``.

The program is decomposed with OpenVINO's own table (what
``openvino.convert_model(exported_program)`` does first), unlifted, and
handed to OpenVINO's PyTorch frontend through its FX decoder with the
program's static input shapes (``convert_model`` on an ``ExportedProgram``
makes every dimension dynamic, ``[?,3,?,?]``; a symbolic size of a
``dynamic_shapes`` program stays dynamic). The IR is serialised with float32
weights kept (``compress_to_fp16=False``), and the layers OpenVINO names with
a process-wide counter (``Multiply_2514``, ``Result_48``) are renamed in
document order, so the same program gives the same bytes in every process.

Debug handles: the frontend names every layer it creates
``<FX node>/<ATen op>/<OpenVINO op>`` (``mul/aten.mul.Tensor/Multiply``); the
FX node is one of the decomposed program's, traced back to the node of the
*given* program through ``node.meta["from_node"]``. Layers that OpenVINO's
own conversion passes create (constant folding, fusions) carry no FX name
and no handle. A node the frontend has no translation for, or whose IR the
CPU plugin cannot compile, is rejected with ``UnsupportedNodeError`` at the
FX node, so the user sees their own source line.

This module, ``openvino.frontend.pytorch`` and ``openvino.tools.ovc`` are
host-only: the target reads and runs the IR with openvino's runtime alone.
"""

from __future__ import annotations

import functools
import operator
import re
import sys
import tempfile
import threading
import warnings
import weakref
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import torch
import torch.fx
from torch.export.graph_signature import ConstantArgument, InputKind, TensorArgument

from pytest_backendconf import (
    CompilerError,
    UnsupportedNodeError,
    check_compile_spec_keys,
    check_functional_signature,
)
from pytest_backendconf.backend import FAULT_KEY, fault_node_name
from pytest_backendconf.vendor import clamp_scatter_indices

from pytest_backendconf.provenance import ProgramNodes, graph_modules

from . import blob as blob_format
from . import runtime

PRECISION_KEY = "inference_precision"
#: Every compile-spec key this backend understands.
KNOWN_KEYS = (PRECISION_KEY, FAULT_KEY)

#: The CPU plugin's inference precision per floating dtype of the program,
#: explicit because its default follows the machine (bfloat16 where the CPU
#: has AVX-512 BF16 or AMX). The hint governs float32 layers only: a layer
#: typed bfloat16 in the IR runs in bfloat16 whatever the hint (a bfloat16
#: batch norm: 105 ulps off where eager is exact), and float16 programs
#: converted as such missed the float64 truth by more than eager too. So
#: float16 and bfloat16 programs are widened to float32 before conversion (`WIDENED`)
#: and computed in float32 throughout; their inputs are widened exactly and
#: their outputs rounded once, which is at least as accurate as eager's
#: per-op rounding. OpenVINO's CPU plugin has no float64 arithmetic: float64
#: layers are computed in float32 (README.md).
PRECISION_BY_DTYPE = {
    torch.float32: "f32",
    torch.float16: "f32",
    torch.bfloat16: "f32",
    torch.float64: "f32",
}
#: Program dtypes converted as float32 (see `PRECISION_BY_DTYPE`).
WIDENED = frozenset({torch.float16, torch.bfloat16})
DEFAULT_PRECISION = "f32"

_SUPPORTED_DTYPES = frozenset(blob_format.DTYPES)

# OpenVINO's PyTorch frontend and conversion passes keep module-level state.
_convert_lock = threading.Lock()
# Decomposing is a good part of a conversion, and the same program is often
# preprocessed again (another compile spec, fresh debug handles, the
# determinism check): keep the unlifted decomposed module while the given
# program lives with its graph and weights unchanged.
_decomposed: "weakref.WeakKeyDictionary[Any, tuple[tuple, Any]]" = weakref.WeakKeyDictionary()


def parse_spec(compile_spec: Mapping[str, Any] | None) -> tuple[str | None, str | None]:
    """Validate the compile spec; return ``(inference precision or None, fault node name or None)``."""
    compile_spec = check_compile_spec_keys(compile_spec, KNOWN_KEYS, "openvino")
    precision = compile_spec.get(PRECISION_KEY)
    if precision is not None and precision not in blob_format.PRECISIONS:
        raise ValueError(
            f"compile-spec key {PRECISION_KEY!r} must be one of {sorted(blob_format.PRECISIONS)} "
            f"(the CPU plugin's INFERENCE_PRECISION_HINT), got {precision!r}"
        )
    return precision, fault_node_name(compile_spec)


def convert_program(
    program: torch.export.ExportedProgram,
    compile_spec: Mapping[str, Any] | None,
    debug_handles: Mapping[torch.fx.Node, int],
) -> bytes:
    """Convert one method's program to a blob; the same arguments give the same bytes."""
    precision, fault_name = parse_spec(compile_spec)
    originals = ProgramNodes(program)
    fault = _fault(originals, fault_name, debug_handles) if fault_name else None
    check_functional_signature(
        program,
        "openvino",
        engine="OpenVINO",
        dtypes=_SUPPORTED_DTYPES,
        nodes=originals.nodes,
        fallback_node=originals.output,
    )
    _check_safe_ops(originals)
    precision = precision or _precision_for(originals)
    with _convert_lock:
        module = _decompose(program, originals)
        model = _convert(module, originals)
        inputs = _inputs(program, module, model, originals)
        outputs = _outputs(program, model, originals)
        xml, weights = _serialise(model)
    nodes = _layer_handles(xml, module, originals, debug_handles)
    header = blob_format.Header(inputs=inputs, outputs=outputs, precision=precision, nodes=nodes, fault=fault)
    _check_compiles(xml, weights, precision, nodes, originals, debug_handles)
    return blob_format.encode(header, xml, weights)


# --- the given program's nodes ------------------------------------------------------


def _fault(originals: ProgramNodes, name: str, debug_handles: Mapping[torch.fx.Node, int]) -> blob_format.Fault:
    node = originals.fault_node(name)
    op = getattr(node.target, "_schema", None)
    return blob_format.Fault(name, op.name if op is not None else str(node.target), debug_handles[node])


#: Ops this backend declines although OpenVINO converts them, because running them harms the process.
UNSAFE_OPS = {
    # The frontend converts gcd to a Loop; with the program's static shapes the CPU plugin's Loop
    # leaves the output uninitialised (values like 140528802798816) and writes where it should not:
    # a later inference in the same process dies of SIGSEGV or hangs (README.md, Known failures).
    "aten.gcd.default": "OpenVINO's gcd (a Loop on the CPU plugin) returns uninitialised memory and corrupts "
    "the process's heap with static shapes: later inferences crash or hang",
}


def _check_safe_ops(originals: ProgramNodes) -> None:
    """Reject, before converting, every node whose op `UNSAFE_OPS` lists (all of them at once)."""
    found = [(node, UNSAFE_OPS[str(node.target)]) for node in originals.call_nodes() if str(node.target) in UNSAFE_OPS]
    if found:
        raise UnsupportedNodeError(rejections=found)


def _tensors(value: Any) -> Iterator[torch.Tensor]:
    if isinstance(value, torch.Tensor):
        yield value
    elif isinstance(value, (list, tuple)):
        for item in value:
            yield from _tensors(item)


def _precision_for(originals: ProgramNodes) -> str:
    """The explicit precision for the program's floating dtypes (all float32 today: `PRECISION_BY_DTYPE`)."""
    found = {
        PRECISION_BY_DTYPE[t.dtype]
        for node in originals.nodes
        for t in _tensors(node.meta.get("val"))
        if t.dtype in PRECISION_BY_DTYPE
    }
    return found.pop() if len(found) == 1 else DEFAULT_PRECISION


# --- OpenVINO's PyTorch frontend ------------------------------------------------------


def _decompose(program: torch.export.ExportedProgram, originals: ProgramNodes) -> torch.fx.GraphModule:
    """The program decomposed as ``openvino.convert_model`` decomposes it, unlifted (cached)."""
    key = originals.fingerprint()
    cached = _decomposed.get(program)
    if cached is not None and cached[0] == key:
        return cached[1]
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # torch's own deprecation noise from run_decompositions
            module = program.run_decompositions(_decomposition_table()).module()
        _widen(module)
        # ScatterUpdate has no bounds check: a KV cache written past its end corrupted the heap.
        clamp_scatter_indices(module)
    except Exception as exc:
        raise UnsupportedNodeError(
            originals.output, f"torch.export's decomposition for OpenVINO failed: {type(exc).__name__}: {_brief(exc)}"
        ) from exc
    _decomposed[program] = (key, module)
    return module


def _widen(module: torch.fx.GraphModule) -> None:
    """Make every float16/bfloat16 tensor of the unlifted module float32 (`WIDENED`), in place.

    Weights and buffers are converted (exactly), dtype arguments
    (``_to_copy(dtype=torch.bfloat16)``, ``full(..., dtype=torch.float16)``)
    name float32, and the recorded tensor metadata that the frontend reads
    for input types says float32; OpenVINO infers the rest.
    """
    for owner in module.modules():
        for name, tensor in list(owner.named_parameters(recurse=False)) + list(owner.named_buffers(recurse=False)):
            if tensor.dtype in WIDENED:
                widened = tensor.detach().to(torch.float32)
                if name in owner._parameters:
                    owner._parameters[name] = torch.nn.Parameter(widened, requires_grad=False)
                else:
                    owner._buffers[name] = widened
        for name, value in list(vars(owner).items()):
            if isinstance(value, torch.Tensor) and value.dtype in WIDENED and name not in ("_parameters", "_buffers"):
                setattr(owner, name, value.to(torch.float32))
    for _, gm in graph_modules(module):
        for node in gm.graph.nodes:
            node.args = _widened_dtypes(node.args)
            node.kwargs = _widened_dtypes(node.kwargs)
            if "tensor_meta" in node.meta:
                node.meta["tensor_meta"] = _widened_meta(node.meta["tensor_meta"])
        gm.recompile()


def _widened_dtypes(value: Any) -> Any:
    if isinstance(value, torch.dtype):
        return torch.float32 if value in WIDENED else value
    if isinstance(value, tuple):
        return tuple(_widened_dtypes(v) for v in value)
    if isinstance(value, list):
        return [_widened_dtypes(v) for v in value]
    if isinstance(value, dict):
        return {k: _widened_dtypes(v) for k, v in value.items()}
    return value


def _widened_meta(meta: Any) -> Any:
    if isinstance(meta, (list, tuple)) and not hasattr(meta, "_replace"):
        return type(meta)(_widened_meta(m) for m in meta)
    if hasattr(meta, "_replace") and getattr(meta, "dtype", None) in WIDENED:
        return meta._replace(dtype=torch.float32)
    return meta


_table: Any = None


def _decomposition_table() -> Any:
    """torch.export's default table less the ops OpenVINO translates itself (as ``convert_model`` builds it)."""
    global _table
    if _table is None:
        from openvino.frontend.pytorch.torchdynamo.export_decompositions import ops_to_not_decompose
        from torch.export.decomp_utils import CustomDecompTable

        table = CustomDecompTable()
        for op in ops_to_not_decompose():
            table.pop(op, None)
        _table = table
    return _table


def _convert(module: torch.fx.GraphModule, originals: ProgramNodes) -> Any:
    """The ``openvino.Model`` of the unlifted module, static sizes pinned."""
    from openvino.frontend.pytorch.fx_decoder import TorchFXPythonDecoder

    # Not `openvino.convert_model`: `import openvino` leaves it out when it
    # ran with openvino.tools.ovc blocked (a process that loaded archives as a
    # target first, then lowers).
    from openvino.tools.ovc import convert_model

    _without_telemetry()
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            # dynamic_shapes=False: each input keeps the program's sizes, and
            # only a symbolic size (a dynamic_shapes program) becomes dynamic.
            decoder = TorchFXPythonDecoder(module, dynamic_shapes=False)
            return convert_model(decoder)
    except Exception as exc:  # OpConversionFailure, GeneralFailure, RuntimeError...
        raise _rejection(exc, module, originals) from None


#: The conversion API's modules that send usage telemetry through ``openvino_telemetry`` (as ``tm``);
#: ``from openvino.tools.ovc import convert_model`` has imported all of them.
_TELEMETRY_USERS = (
    "openvino.tools.ovc.convert_impl",
    "openvino.tools.ovc.telemetry_utils",
    "openvino.tools.ovc.utils",
)


@functools.cache
def _without_telemetry() -> None:
    """Point the conversion API at OpenVINO's own no-op telemetry (what it uses without ``openvino_telemetry``).

    Unless a consent file in the home directory declines it, or ``CI=true``,
    every ``convert_model`` call sends several usage events, each from a
    process that ``openvino_telemetry`` forks off a thread of this one, and
    writes statistics under ``~/intel``. On a machine without network those
    processes never end (they deadlock on a lock the fork copied; a suite
    run left them behind by the dozen), and the forks doubled the CPU time
    of the ops category's int64 checks. A conformance run must neither phone
    home nor write to the home directory, so the conversions here send
    nothing. Once per process. (``import openvino`` itself still sends one
    event: OpenVINO's ``opt_in_out --opt_out`` turns that off for good.)
    """
    from openvino.tools.ovc import telemetry_stub

    for name in _TELEMETRY_USERS:
        module = sys.modules.get(name)  # absent in another OpenVINO release: nothing of this name sends
        if getattr(module, "tm", None) is not None:
            module.tm = telemetry_stub  # type: ignore[union-attr]


# "-- No conversion rule found for operations: bctest.mystery.default, aten.foo.default"
_OP_NAME = re.compile(r"\b([A-Za-z_][A-Za-z0-9_]*\.[A-Za-z_][A-Za-z0-9_]*(?:\.[A-Za-z_][A-Za-z0-9_]*)?)\b")
# "<FX node>/<ATen op>/<OpenVINO op>", as the frontend names layers and quotes them in errors.
_LAYER_NODE = re.compile(r"['\"]?([A-Za-z_][A-Za-z0-9_]*)/[a-z_]+\.[A-Za-z0-9_.]+")


def _rejection(exc: BaseException, module: torch.fx.GraphModule, originals: ProgramNodes) -> UnsupportedNodeError:
    """A conversion failure as an ``UnsupportedNodeError`` at every FX node it names (else the output).

    The frontend reports every op of the model that failed, each with its own
    message, and lists the ops it has no rule for: each such node is
    rejected with its own text, so that a node's reason reads the same
    whatever else the program holds (the suite's batched ops checks rely on
    it). A message that names no node rejects the node of the first op it
    quotes.
    """
    text = str(exc)
    nodes = [n for _, gm in graph_modules(module) for n in gm.graph.nodes if n.op == "call_function"]
    by_name = {node.name: node for node in nodes}
    found: dict[torch.fx.Node, str] = {}
    rules = _NO_RULE.search(text)
    for target in (t.strip() for t in (rules[1].split(",") if rules else [])):
        for node in nodes:
            if str(node.target) == target:
                found.setdefault(node, f"OpenVINO's PyTorch frontend has no conversion rule for {target}")
    failed = [(by_name[name], message) for name, message in _FAILED_OP.findall(text) if name in by_name]
    for node, message in failed:
        if node.target is not operator.getitem:
            found.setdefault(node, f"OpenVINO's PyTorch frontend cannot convert it: {_brief_text(message)}")
    # A getitem fails when the op it reads from did (a multi-output op the frontend half converts):
    # that op is the node to name, unless its own entry named it already.
    for node, message in failed:
        source = node.args[0] if node.target is operator.getitem and node.args else None
        if isinstance(source, torch.fx.Node) and source.op == "call_function":
            found.setdefault(
                source,
                f"OpenVINO's PyTorch frontend cannot convert its output {node.args[1]}: {_brief_text(message)}",
            )
    rejections: dict[torch.fx.Node, str] = {}
    for node, reason in found.items():
        rejections.setdefault(originals.origin(node) or originals.output, reason)
    if rejections:
        return UnsupportedNodeError(rejections=list(rejections.items()))
    by_target: dict[str, torch.fx.Node] = {}
    for node in nodes:
        by_target.setdefault(str(node.target), node)
    culprit = None
    for name in _OP_NAME.findall(text):
        culprit = by_target.get(name) or by_target.get(f"{name}.default")
        if culprit is not None:
            break
    if culprit is None:
        culprit = next((by_name[m] for m in _LAYER_NODE.findall(text) if m in by_name), None)
    reason = f"OpenVINO's PyTorch frontend cannot convert it: {type(exc).__name__}: {_brief(exc)}"
    return UnsupportedNodeError(originals.origin(culprit) or originals.output, reason)


# "-- No conversion rule found for operations: aten._linalg_det.default, aten._linalg_svd.default"
_NO_RULE = re.compile(r"No conversion rule found for operations: ([^\n]+)")
# "-- aten.amax.default with a message:\nException happened during conversion of operation
# amax/aten.amax.default with schema NONE\n<why>\n\n" (one entry per failed op)
_FAILED_OP = re.compile(
    r"Exception happened during conversion of operation ([A-Za-z_][A-Za-z0-9_]*)/[^\n]*\n(.*?)(?:\n\n|\n-- |\nSummary:|$)",
    re.S,
)
# OpenVINO's generated friendly names count across the process ("TopK_14670"): the same
# program gets another number after other conversions, so the text keeps the name only.
_COUNTED_NAME = re.compile(r"\b([A-Z][A-Za-z0-9]*)_\d+\b")


def _brief_text(text: str) -> str:
    """An OpenVINO message without its "Check 'false' failed at src/..." preambles, on one line."""
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    kept = [line for line in lines if not line.startswith(("Check '", "Exception from src"))] or lines
    return _COUNTED_NAME.sub(r"\1_#", " ".join(kept))[:500]


def _brief(exc: BaseException) -> str:
    """OpenVINO's message without its "Check 'false' failed at src/..." preamble, on one line."""
    return _brief_text(str(exc)) or type(exc).__name__


# --- the IR ----------------------------------------------------------------------------

# A layer named by OpenVINO's process-wide counter: a type name, "_", a number.
_MODEL_NAME = re.compile(r'(<net name=")[^"]*(" version=")')
_COUNTED = re.compile(r'(<layer id="\d+" name=")([A-Z][A-Za-z0-9]*)_\d+(" type=")')


def _serialise(model: Any) -> tuple[bytes, bytes]:
    """``(xml, weights)`` of the model, float32 weights kept, counter names replaced in document order."""
    import openvino

    with tempfile.TemporaryDirectory(prefix="backendconf-openvino-") as folder:
        path = Path(folder) / "model.xml"
        openvino.save_model(model, str(path), compress_to_fp16=False)
        xml = path.read_text(encoding="utf-8")
        weights = path.with_suffix(".bin").read_bytes()
    counters: dict[str, int] = {}

    def renamed(match: re.Match) -> str:
        kind = match.group(2)
        counters[kind] = counters.get(kind, -1) + 1
        return f"{match.group(1)}{kind}#{counters[kind]}{match.group(3)}"

    xml = _MODEL_NAME.sub(r"\1method\2", xml, count=1)  # "Model6": another process-wide counter
    return _COUNTED.sub(renamed, xml).encode("utf-8"), weights


_LAYER_NAME = re.compile(r'<layer id="\d+" name="([^"]*)" type="')


def _layer_handles(
    xml: bytes, module: torch.fx.GraphModule, originals: ProgramNodes, debug_handles: Mapping[torch.fx.Node, int]
) -> dict[str, int]:
    """IR layer name -> debug handle, for every layer named after an FX node (``torch.cond`` bodies included).

    The FX node is looked up in the main graph first, then in the subgraphs
    (a ``torch.cond`` branch's layers live in the ``If`` layer's bodies).
    """
    import html

    by_name: dict[str, torch.fx.Node] = {}
    for _, gm in graph_modules(module):
        for node in gm.graph.nodes:
            by_name.setdefault(node.name, node)
    table = {}
    for raw in _LAYER_NAME.findall(xml.decode("utf-8")):
        name = html.unescape(raw)
        node = by_name.get(name.split("/", 1)[0]) if "/" in name else None
        original = originals.origin(node)
        if original is not None and original in debug_handles:
            table[name] = debug_handles[original]
    return table


def _inputs(program: Any, module: torch.fx.GraphModule, model: Any, originals: ProgramNodes) -> tuple:
    """Per flat user input, the IR parameter that takes it (``None``: a constant, baked in).

    The frontend makes one parameter per placeholder of the unlifted module,
    in order, and names it after the user's ``forward`` argument (not the
    placeholder), so they are matched by position; a parameter left unfed
    would run on whatever memory it holds, so a mismatch is refused here.
    A non-tensor input (``torch.export`` bakes a Python number into the
    program) becomes an unused parameter of unknown rank, which the CPU
    plugin refuses to compile: it is removed from the model.
    """
    placeholders = [node for node in module.graph.nodes if node.op == "placeholder"]
    user = [spec for spec in program.graph_signature.input_specs if spec.kind == InputKind.USER_INPUT]
    ports = list(model.inputs)
    if not len(placeholders) == len(user) == len(ports):
        raise UnsupportedNodeError(
            originals.output,
            f"OpenVINO's model has {len(ports)} parameters where the program has {len(user)} user inputs "
            f"({len(placeholders)} placeholders unlifted)",
        )
    slots: list[blob_format.TensorSlot | None] = []
    for spec, placeholder, port in zip(user, placeholders, ports):
        value = placeholder.meta.get("val")
        if isinstance(spec.arg, ConstantArgument) and not port.get_target_inputs():
            model.remove_parameter(port.get_node())
            slots.append(None)
            continue
        if not (isinstance(spec.arg, TensorArgument) and isinstance(value, torch.Tensor)):
            raise UnsupportedNodeError(
                placeholder, f"input {placeholder.name!r} is not a tensor; the openvino backend feeds tensors only"
            )
        dtype = str(value.dtype).removeprefix("torch.")
        slots.append(blob_format.TensorSlot(port.get_any_name(), dtype, widened=value.dtype in WIDENED))
    return tuple(slots)


def _outputs(program: Any, model: Any, originals: ProgramNodes) -> tuple:
    by_name = {node.name: node for node in program.graph_module.graph.nodes}
    outputs: list[tuple[str, Any]] = []
    for spec in program.graph_signature.output_specs:
        if isinstance(spec.arg, ConstantArgument):
            outputs.append(("constant", spec.arg.value))
            continue
        value = by_name[spec.arg.name].meta.get("val")
        if not isinstance(value, torch.Tensor):
            raise UnsupportedNodeError(by_name[spec.arg.name], f"output {spec.arg.name!r} is not a tensor")
        dtype = str(value.dtype).removeprefix("torch.")
        outputs.append(("tensor", blob_format.TensorSlot(spec.arg.name, dtype, widened=value.dtype in WIDENED)))
    tensors = sum(1 for kind, _ in outputs if kind == "tensor")
    if tensors != len(model.outputs):
        raise UnsupportedNodeError(
            originals.output,
            f"OpenVINO's model has {len(model.outputs)} outputs where the program has {tensors} tensor outputs",
        )
    return tuple(outputs)


def _check_compiles(
    xml: bytes,
    weights: bytes,
    precision: str,
    nodes: dict[str, int],
    originals: ProgramNodes,
    debug_handles: Mapping[torch.fx.Node, int],
) -> None:
    """Raise `CompilerError`, at its FX node, for an IR the CPU plugin cannot compile.

    ``compile`` must not fail where the backend is available
    (docs/backend-contract.md of pytest-backendconf, "Availability"), so the
    check happens here, where the user's source line can be shown.
    """
    try:
        runtime.compile_ir(xml, weights, precision)
    except Exception as exc:  # openvino's exception types are not all public API
        layer = next((name for name in _QUOTED.findall(str(exc)) if name in nodes), None)
        culprit = None
        if layer is not None:
            culprit = next((node for node in originals.nodes if debug_handles.get(node) == nodes[layer]), None)
        ops = [node for node in originals.nodes if node.op == "call_function"]
        if culprit is None and len(ops) == 1:
            culprit = ops[0]  # the IR of a one-op program is that op's, whatever the message names
        # The frontend converted the node (OpenVINO claims it), and its CPU plugin broke on the result:
        # a compiler failure, not "unsupported" (docs/backend-contract.md of pytest-backendconf,
        # "Compile errors").
        raise CompilerError(
            culprit or originals.output, f"OpenVINO's CPU plugin cannot compile the IR: {_brief(exc)}"
        ) from None


_QUOTED = re.compile(r"""['"]([^'"]+)['"]""")
