"""Compile a ``torch.export`` program to an IREE VM module (host only): the backend's ``preprocess``.

The program is decomposed with torch.export's default table, its weights
and constants frozen into the module (IREE's own FX importer,
``iree.compiler.extras.fx_importer.FxImporter.import_frozen_program``, what
iree-base-compiler ships), and compiled by ``iree-compile`` for the
``llvm-cpu`` target with the generic x86-64 CPU (no host-specific features:
the module runs on any x86-64 machine, as a CI fleet's are). The ``.vmfb``
is written without source map or debug symbols.

Node locations: each node of the decomposed program gets the location
``n<i>:<i>`` (``i`` indexing the node of the *given* program it came from,
through ``node.meta["from_node"]``), instead of its Python stack trace. The
compiler's diagnostics quote those locations, so an error maps back to the
user's node, and no source file name or line reaches the module.

What a compile error is (`compile_error`), the verdicts of
docs/backend-contract.md, "Compile errors":

- IREE has no lowering for the op (``failed to legalize operation
  'torch.aten.…'``), or its FX importer cannot import the node: the backend
  does not claim it, ``UnsupportedNodeError`` at the node;
- anything else (a verifier error, a linker error, a crash of the
  compiler) at a node the diagnostics name: IREE's compiler broke on
  something it claims, ``CompilerError`` at that node with IREE's
  diagnostic line (a failure of the check and a known-failure entry, never
  "unsupported");
- the same naming no node (no location, no missing symbol):
  `CompileFailure`, which the harness reports as undecided.

This module, ``iree.compiler`` and ``iree-compile`` are host-only: the target
runs the ``.vmfb`` with ``iree.runtime`` alone.
"""

from __future__ import annotations

import io
import re
import subprocess
from collections.abc import Mapping
from typing import Any

import torch
import torch.fx
from torch.export.graph_signature import ConstantArgument, InputKind, TensorArgument

from pytest_backendconf import CompilerError, UnsupportedNodeError, check_compile_spec_keys, check_functional_signature
from pytest_backendconf.vendor import clamp_scatter_indices
from pytest_backendconf.backend import FAULT_KEY, fault_node_name
from pytest_backendconf.provenance import ProgramNodes, graph_modules

from . import blob as blob_format

#: Every compile-spec key this backend understands.
KNOWN_KEYS = (FAULT_KEY,)
#: The function of the VM module that runs the method.
FUNCTION = "main"
#: The compiler's flags besides input and output: the llvm-cpu target on the generic x86-64
#: CPU; no debug symbols and no source map in the module (nothing of the user's source in a
#: blob, and the same bytes in every checkout); float64 kept as float64 (IREE demotes it to
#: float32 by default, which would pass float64 programs through float32 unannounced).
COMPILE_FLAGS = (
    "--iree-input-type=torch",
    "--iree-hal-target-backends=llvm-cpu",
    "--iree-llvmcpu-target-cpu=generic",
    "--iree-llvmcpu-debug-symbols=false",
    "--iree-vm-bytecode-module-strip-source-map=true",
    "--iree-input-demote-f64-to-f32=false",
    "--mlir-print-op-on-diagnostic=false",
)
#: Seconds one ``iree-compile`` may take (a one-node program takes about one; a zoo model a few).
COMPILE_TIMEOUT = 600

_SUPPORTED_DTYPES = blob_format.DTYPES


class CompileFailure(RuntimeError):
    """``iree-compile`` failed and its diagnostics name no node of the program (nor did it time out on one).

    Neither "unsupported" nor `CompilerError` at a node: the check fails and
    the harness says it cannot tell. The text is IREE's own diagnostic line.
    """


def parse_spec(compile_spec: Mapping[str, Any] | None) -> str | None:
    """Validate the compile spec; return the fault node name or None."""
    return fault_node_name(check_compile_spec_keys(compile_spec, KNOWN_KEYS, "iree"))


def compile_program(
    program: torch.export.ExportedProgram,
    compile_spec: Mapping[str, Any] | None,
    debug_handles: Mapping[torch.fx.Node, int],
) -> bytes:
    """Compile one method's program to a blob; the same arguments give the same bytes."""
    fault_name = parse_spec(compile_spec)
    originals = ProgramNodes(program)
    fault = _fault(originals, fault_name, debug_handles) if fault_name else None
    check_functional_signature(
        program, "iree", engine="IREE", dtypes=_SUPPORTED_DTYPES, nodes=originals.nodes, fallback_node=originals.output
    )
    decomposed = _decompose(program, originals)
    located = _locate(decomposed, originals)
    inputs, outputs = _signature(decomposed, originals)
    mlir = _import(decomposed, located, originals)
    vmfb = _compile(mlir, located, originals)
    return blob_format.encode(blob_format.Header(FUNCTION, inputs, outputs, fault), vmfb)


# --- the given program's nodes ------------------------------------------------------


def _fault(originals: ProgramNodes, name: str, debug_handles: Mapping[torch.fx.Node, int]) -> blob_format.Fault:
    node = originals.fault_node(name)
    return blob_format.Fault(name, _op_name(node), debug_handles[node])


def _op_name(node: torch.fx.Node) -> str:
    schema = getattr(node.target, "_schema", None)
    return schema.name if schema is not None else getattr(node.target, "__name__", str(node.target))


# --- the program as IREE's importer takes it -----------------------------------------


def _decompose(program: torch.export.ExportedProgram, originals: ProgramNodes) -> torch.export.ExportedProgram:
    """A decomposed copy (the importer rewrites the graph it imports: never the given program's)."""
    import warnings

    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # torch's own deprecation noise from run_decompositions
            decomposed = program.run_decompositions()
    except Exception as exc:
        raise UnsupportedNodeError(
            originals.output, f"torch.export's decomposition failed: {type(exc).__name__}: {_one_line(str(exc))}"
        ) from exc
    # IREE's scatter has no bounds check: a KV cache written one position past its end wrote past the
    # buffer and aborted the process (repro/scatter_past_end.py). Clamped, the write is wrong, not unsafe.
    clamp_scatter_indices(decomposed.graph_module)
    return decomposed


def _locate(decomposed: torch.export.ExportedProgram, originals: ProgramNodes) -> list[torch.fx.Node]:
    """Give every node of ``decomposed`` the location of its original node; return those, by index.

    The importer makes an MLIR location of a node's ``stack_trace``; a
    one-frame trace in file ``n<i>`` at line ``i`` becomes ``n<i>:<i>:0``,
    which the compiler quotes in its diagnostics. A node with no original
    (the decomposition's own) keeps the location of the node before it.
    """
    located: list[torch.fx.Node] = []
    index: dict[torch.fx.Node, int] = {}
    for _, module in graph_modules(decomposed.graph_module):
        for node in module.graph.nodes:
            origin = originals.origin(node) if node.op == "call_function" else None
            if origin is None:
                node.meta.pop("stack_trace", None)
                continue
            if origin not in index:
                index[origin] = len(located)
                located.append(origin)
            i = index[origin]
            node.meta["stack_trace"] = f'  File "n{i}", line {i}, in node\n'
    return located


def _signature(
    decomposed: torch.export.ExportedProgram, originals: ProgramNodes
) -> tuple[tuple[str | None, ...], tuple[tuple[str, Any], ...]]:
    """The blob's inputs and outputs; Python constants are taken out of the graph's inputs and outputs.

    A non-tensor user input (``torch.export`` bakes a Python number into the
    program and leaves an unused placeholder) is erased, and a constant
    output is returned by the runtime side from the header: IREE's functions
    take and return tensors only (``!torch.none`` is "unhandled").
    """
    graph = decomposed.graph_module.graph
    by_name = {node.name: node for node in graph.nodes}
    inputs: list[str | None] = []
    for spec in decomposed.graph_signature.input_specs:
        if spec.kind != InputKind.USER_INPUT:
            continue
        placeholder = by_name[spec.arg.name]
        if isinstance(spec.arg, ConstantArgument):
            if placeholder.users:
                raise UnsupportedNodeError(
                    originals.output, f"input {spec.arg.name!r} is a Python constant the program reads"
                )
            graph.erase_node(placeholder)
            inputs.append(None)
            continue
        inputs.append(_dtype_name(placeholder))
    output = graph.output_node()
    results = list(output.args[0])
    kept, outputs = [], []
    for spec, value in zip(decomposed.graph_signature.output_specs, results):
        if isinstance(spec.arg, TensorArgument):
            kept.append(value)
            outputs.append(("tensor", _dtype_name(value)))
        else:
            outputs.append(("constant", spec.arg.value))
    output.args = (tuple(kept),)
    return tuple(inputs), tuple(outputs)


def _dtype_name(node: Any) -> str:
    value = node.meta.get("val") if isinstance(node, torch.fx.Node) else None
    if not isinstance(value, torch.Tensor):
        raise UnsupportedNodeError(node, f"{node} is not a tensor; the iree backend feeds and returns tensors")
    return str(value.dtype).removeprefix("torch.")


def _symbolic(decomposed: torch.export.ExportedProgram) -> bool:
    for node in decomposed.graph_module.graph.nodes:
        value = node.meta.get("val")
        if node.op == "placeholder" and isinstance(value, torch.Tensor):
            if any(not isinstance(size, int) for size in value.shape):
                return True
    return False


def _import(decomposed: torch.export.ExportedProgram, located: list[torch.fx.Node], originals: ProgramNodes) -> bytes:
    """The program as MLIR bytecode of IREE's torch dialect; the importer's failure at a node is "unsupported"."""
    from iree.compiler import ir
    from iree.compiler.extras.fx_importer import FxImporter, GraphNodeImporter

    current: list[torch.fx.Node] = []

    class _Importer(GraphNodeImporter):
        # The node being imported, for an exception the importer raises without naming it.
        def _import_torch_op_overload(self, loc: Any, node: torch.fx.Node, *args: Any, **kwargs: Any) -> Any:
            current[:] = [node]
            return super()._import_torch_op_overload(loc, node, *args, **kwargs)

        def _import_hop(self, loc: Any, node: torch.fx.Node, *args: Any, **kwargs: Any) -> Any:
            current[:] = [node]
            return super()._import_hop(loc, node, *args, **kwargs)

    symbolic = _symbolic(decomposed)
    try:
        importer = FxImporter(context=ir.Context(), graph_node_importer_cls=_Importer)
        importer.import_frozen_program(decomposed, func_name=FUNCTION, import_symbolic_shape_expressions=symbolic)
        buffer = io.BytesIO()
        importer.module.operation.write_bytecode(buffer)
    except UnsupportedNodeError:
        raise
    except Exception as exc:  # NotImplementedError, KeyError, NameError...: the importer's own
        node = originals.origin(current[0]) if current else None
        reason = f"IREE's FX importer cannot import it: {type(exc).__name__}: {_importer_text(exc)}"
        raise UnsupportedNodeError(node or originals.output, reason) from None
    return buffer.getvalue()


def _importer_text(exc: BaseException) -> str:
    # "FIX ME: Unimplemented call_function: target=..., {node.meta}": the meta holds source paths.
    return _one_line(str(exc).split(", {", 1)[0])


# --- iree-compile ------------------------------------------------------------------------


def command_line() -> list[str]:
    """``iree-compile`` reading MLIR on stdin and writing the ``.vmfb`` to stdout, with `COMPILE_FLAGS`."""
    from iree.compiler.tools.binaries import find_tool

    return [
        find_tool("iree-compile"),
        "-",
        "-o",
        "-",
        f"--iree-llvmcpu-embedded-linker-path={find_tool('iree-lld')}",
        *COMPILE_FLAGS,
    ]


def _compile(mlir: bytes, located: list[torch.fx.Node], originals: ProgramNodes) -> bytes:
    try:
        done = subprocess.run(command_line(), input=mlir, capture_output=True, timeout=COMPILE_TIMEOUT, check=False)
    except subprocess.TimeoutExpired:
        raise CompileFailure(
            f"iree-compile did not finish in {COMPILE_TIMEOUT} s (the harness cannot tell on which node)"
        ) from None
    if done.returncode == 0 and done.stdout:
        return done.stdout
    raise compile_error(done.stderr.decode("utf-8", "replace"), done.returncode, located, originals)


# "n3:3:0: error: failed to legalize operation 'torch.aten.foo'", "iree-lld: error: undefined symbol: log10f",
# "<unknown>:0: error: 'arith.constant' op failed to verify ..."
_ERROR = re.compile(r"^(?P<where>.*?): error: (?P<message>.*)$", re.M)
_LOCATION = re.compile(r"\bn(\d+):(\d+)\b")
_NOT_CLAIMED = re.compile(
    r"failed to legalize operation '(torch\.[\w.]+)'|unsupported|not supported|unimplemented", re.I
)
_UNDEFINED = re.compile(r"undefined symbol: (\w+)")
_TORCH_OP = re.compile(r"'torch\.(aten\.[\w.]+?)'")


def compile_error(stderr: str, returncode: int, located: list[torch.fx.Node], originals: ProgramNodes) -> Exception:
    """The exception for a failed ``iree-compile``: `UnsupportedNodeError`, `CompilerError` or `CompileFailure`."""
    first = _ERROR.search(stderr)
    diagnostic = normalised(first["message"]) if first else ""
    if not diagnostic:
        tail = [line for line in stderr.strip().splitlines() if line.strip()]
        diagnostic = normalised(tail[0]) if tail else f"iree-compile exited with status {returncode} and no message"
    tool = first["where"] if first else ""
    nodes = _named_nodes(first["where"] if first else "", stderr, located)
    symbol = _UNDEFINED.search(diagnostic)
    if symbol is not None:
        # A fused dispatch carries the location of its last op; the missing libm function names its own.
        op = _op_of_symbol(symbol[1], located)
        nodes = ([op] if op is not None else []) + [n for n in nodes if n is not op]
    if _NOT_CLAIMED.search(diagnostic):
        node = nodes[0] if nodes else _node_of_op(diagnostic, originals)
        return UnsupportedNodeError(node or originals.output, f"IREE cannot compile it: {diagnostic}")
    said = f"iree-lld: {diagnostic}" if tool.startswith("iree-lld") else diagnostic
    if nodes:
        # The node the diagnostic names first: in a fused dispatch the others only share its code.
        return CompilerError(nodes[0], said)
    return CompileFailure(f"IREE's compiler failed naming no node: {said}")


def _named_nodes(where: str, stderr: str, located: list[torch.fx.Node]) -> list[torch.fx.Node]:
    """The nodes the diagnostic's location names, then those the rest of the text names, each once."""
    found: list[torch.fx.Node] = []
    for text in (where, stderr):
        for index, line in _LOCATION.findall(text):
            i = int(index)
            if index == line and i < len(located) and located[i] not in found:
                found.append(located[i])
    return found


def _op_of_symbol(symbol: str, located: list[torch.fx.Node]) -> torch.fx.Node | None:
    """The node whose op is the libm function ``symbol`` (``log10f``, ``log10``) names."""
    for name in (symbol, symbol.removesuffix("f")):
        for node in located:
            if _op_name(node).split("::")[-1] == name:
                return node
    return None


def _node_of_op(diagnostic: str, originals: ProgramNodes) -> torch.fx.Node | None:
    match = _TORCH_OP.search(diagnostic)
    if match is None:
        return None
    name = match[1]
    for node in originals.call_nodes():
        target = str(node.target)
        if target == name or target.startswith(name + "."):
            return node
    return None


def normalised(text: str) -> str:
    """A diagnostic on one line, without what changes from run to run (temporary paths, SSA numbers)."""
    text = re.sub(r"/tmp/\S+", "<tmp>", text)
    text = re.sub(r"%[\w.]+", "%_", text)
    return _one_line(text)[:400]


def _one_line(text: str) -> str:
    return " ".join(line.strip() for line in text.strip().splitlines() if line.strip())
