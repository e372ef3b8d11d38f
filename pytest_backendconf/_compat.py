"""Every difference between the torch versions we support, isolated here.

Each shim says which versions need it. The rest of the package imports
torch APIs through this module when they differ across versions.

Supported: torch 2.10 to 2.14, the releases the whole suite ran under (2.10.0,
2.12.1 and 2.13.0 in CI). Shims for 2.4 to 2.9 are kept, untested. The floor,
what breaks below 2.4, and what was and was not tried are in docs/vendor-ci.md
("Which torch versions").
"""

from __future__ import annotations

import collections
from typing import TYPE_CHECKING, Any, Callable, Iterable, Mapping, overload

import torch

if TYPE_CHECKING:
    # Private torch types other modules annotate with, reached through here (2.4-2.14).
    from torch._C import JitType as JitType
    from torch._ops import OpOverload as OpOverload
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.export import ExportedProgram
    from torch.export.graph_signature import InputSpec, OutputSpec
    from torch.fx import Node
    from torch.fx.passes.shape_prop import TensorMetadata
    from torch.testing._internal.common_device_type import toleranceOverride
    from torch.testing._internal.opinfo.core import OpInfo
    from torch.utils._python_dispatch import TorchDispatchMode
    from torch.utils._sympy.value_ranges import ValueRanges as ValueRanges
    from typing_extensions import TypeIs

#: The oldest torch the package supports: the oldest release the whole suite has run green under
#: (docs/installing.md, "Which torch releases ran here"), with ops samples shipped for it. Releases
#: before it are refused rather than half-working: nothing has run under 2.9 or older, and below
#: 2.4 it cannot work at all (non-strict ``torch.export`` records no ``stack_trace``, so no source
#: line can be shown, and ``torch.library.custom_op``, which the suite's probes use, is missing).
#: The shims below for 2.4-2.9 stay: lowering the floor is a matter of running those releases.
MINIMUM_TORCH = (2, 10)


def torch_version() -> tuple[int, int]:
    major, minor = torch.__version__.split("+")[0].split(".")[:2]
    return int(major), int(minor)


def check_torch_version() -> None:
    """Fail early, with the fix, on a torch older than we support."""
    if torch_version() < MINIMUM_TORCH:
        raise RuntimeError(
            f"pytest-backendconf needs torch >= {MINIMUM_TORCH[0]}.{MINIMUM_TORCH[1]}, found "
            f"{torch.__version__} (older releases have not been tested); install a newer build, e.g. "
            "`pip install torch==2.13.0`"
        )


def export(
    module: torch.nn.Module,
    args: tuple[object, ...],
    kwargs: Mapping[str, object] | None = None,
    *,
    dynamic_shapes: dict[str, Any] | tuple[Any, ...] | list[Any] | None = None,
) -> ExportedProgram:
    """``torch.export.export`` in non-strict mode, on every supported version.

    Needed by torch 2.4 to 2.7, whose ``export`` defaults to ``strict=True``
    (TorchDynamo tracing); 2.8 made non-strict the default (pytorch#148790),
    so on 2.8 and later, 2.13 and 2.14 included, this is the plain call.
    Strict tracing records a different module hierarchy inside ``torch.cond``
    branches (an extra ``_export_root`` level) and a frame inside the branch,
    which changes the pinned texts of docs/backend-contract.md#debug-handles-and-texts: on 2.13 with
    ``strict=True`` forced, two symbolication checks of the suite fail. The
    ``strict`` keyword exists since 2.2, so passing it is safe everywhere.
    """
    return torch.export.export(module, args, kwargs, dynamic_shapes=dynamic_shapes, strict=False)


# --- private torch APIs ------------------------------------------------------------
#
# Every private torch name the package uses is reached through here, each
# with the versions it was checked on, so that a torch release that moves one
# breaks one place. Checked on 2.13 and 2.14 (tox.ini runs both); the
# docstrings say how far back each goes.

#: torch's pytree functions. ``torch.utils._pytree`` is private on every
#: supported version (2.4-2.14 ship no public ``torch.utils.pytree``); the
#: functions used here have kept their names and signatures since 2.2.
#: (The archive's stored structure strings are the archive module's business.)
from torch.utils import _pytree as _pytree  # noqa: E402

tree_flatten = _pytree.tree_flatten
tree_unflatten = _pytree.tree_unflatten
tree_leaves = _pytree.tree_leaves
tree_map = _pytree.tree_map
tree_structure = _pytree.tree_structure
TreeSpec = _pytree.TreeSpec

#: The only frame name ``torch.export`` keeps in a node's ``stack_trace``
#: (``torch.fx.proxy._filter_traceback_frames`` on 2.4-2.14 keeps frames of
#: functions called ``forward``): a method lowered under another name is
#: renamed to this so that its source lines survive.
EXPORT_FRAME_NAME = "forward"


def spec_children(spec: TreeSpec) -> list[TreeSpec]:
    """The child specs of a pytree ``TreeSpec`` (ops discovery splits a batch program's outputs by them).

    torch 2.10 added ``TreeSpec.children()`` and deprecated the
    ``children_specs`` field that 2.4-2.9 have (it still exists on 2.13 and
    2.14, with a warning).
    """
    children = getattr(spec, "children", None)
    return list(children() if callable(children) else spec.children_specs)


@overload
def op_schema(target: torch._ops.OpOverload) -> torch.FunctionSchema: ...
@overload
def op_schema(target: object) -> torch.FunctionSchema | None: ...
def op_schema(target: object) -> torch.FunctionSchema | None:
    """The ``torch.FunctionSchema`` of an op overload (``aten.mul.Tensor``), or None for anything else.

    ``OpOverload._schema`` is private on 2.4-2.14; ``torch._ops.OpOverload``
    is the class (no public alias exists).
    """
    if isinstance(target, torch._ops.OpOverload):
        return target._schema
    return None


def registered_schemas(qualified: str) -> list[torch.FunctionSchema]:
    """Every ``torch.FunctionSchema`` registered under ``"namespace::op"`` (one per overload), from the
    operator registry itself, without touching ``torch.ops``' attributes.

    ``torch._C._jit_get_schemas_for_operator`` is private on 2.4-2.14 (no public registry query).
    """
    return list(torch._C._jit_get_schemas_for_operator(qualified))


def torch_ops_attributes() -> set[str]:
    """The names ``torch.ops`` answers with something other than an operator namespace
    (``load_library``, ``import_module``, ``loaded_libraries`` …): its class ``torch._ops._Ops``
    (private, 2.4-2.14) and its instance's own attributes."""
    found = set(dir(type(torch.ops)))
    found.update(k for k, v in vars(torch.ops).items() if not isinstance(v, torch._ops._OpNamespace))
    return found


def op_overload(namespace: str, op: str, overload: str) -> torch._ops.OpOverload:
    """``torch.ops.<namespace>.<op>.<overload>``, for names `pytest_backendconf.allowlist` has checked
    against the registry (2.4-2.14: ``torch.ops`` resolves registered names through the dispatcher).
    Never call it with an unchecked name: ``torch.ops`` has attributes of its own."""
    return getattr(getattr(getattr(torch.ops, namespace), op), overload)


def is_op_overload(target: object) -> TypeIs[torch._ops.OpOverload]:
    """Whether a node's target is an operator overload (``torch._ops.OpOverload`` on 2.4-2.14)."""
    return isinstance(target, torch._ops.OpOverload)


def is_higher_order_op(target: object) -> TypeIs[torch._ops.HigherOrderOperator]:
    """Whether a node's target is a higher-order op such as ``torch.cond``
    (``torch._ops.HigherOrderOperator`` on 2.4-2.14)."""
    return isinstance(target, torch._ops.HigherOrderOperator)


#: nn.Module's global hook registries (``torch.nn.modules.module._global_{forward,forward_pre,
#: backward,backward_pre}_hooks``, private on 2.10-2.14): the dicts themselves, which torch's
#: ``register_module_*_hook`` functions fill in place, so a lowered call tests them without a lookup.
MODULE_GLOBAL_HOOKS: tuple[dict, dict, dict, dict] = (
    torch.nn.modules.module._global_forward_hooks,
    torch.nn.modules.module._global_forward_pre_hooks,
    torch.nn.modules.module._global_backward_hooks,
    torch.nn.modules.module._global_backward_pre_hooks,
)

#: Whether ``torch.jit.trace`` is tracing right now (``torch._C._get_tracing_state()``, private on
#: 2.10-2.14): the function itself, not a wrapper, as every call of a lowered module asks it.
tracing_state: Callable[[], torch._C.TracingState | None] = torch._C._get_tracing_state


def import_export_tracer() -> None:
    """Import ``torch.export``'s tracing machinery (``torch.export._trace``, 2.4-2.14), which its first use
    imports otherwise: a process that will export does it up front, outside any timed work."""
    import torch.export._trace  # noqa: F401


def fake_tensor_mode(*, allow_non_fake_inputs: bool = False) -> FakeTensorMode:
    """A new ``FakeTensorMode`` (``torch._subclasses.fake_tensor``, private on 2.4-2.14): shapes without data."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    return FakeTensorMode(allow_non_fake_inputs=allow_non_fake_inputs)


def tensor_metadata(tensor: torch.Tensor) -> TensorMetadata:
    """The ``tensor_meta`` an exported node carries (``torch.fx.passes.shape_prop._extract_tensor_metadata``,
    private on 2.4-2.14)."""
    from torch.fx.passes.shape_prop import _extract_tensor_metadata

    return _extract_tensor_metadata(tensor)


def dispatch_mode_base() -> type[TorchDispatchMode]:
    """``torch.utils._python_dispatch.TorchDispatchMode`` (2.4-2.14): the base class of a mode that sees
    every aten call."""
    from torch.utils._python_dispatch import TorchDispatchMode

    return TorchDispatchMode


def propose_partitions(graph_module: torch.fx.GraphModule, is_selected: Callable[[Node], object]) -> list[list[Node]]:
    """The groups of selected op nodes torch's partitioner proposes, each a list of nodes.

    ``CapabilityBasedPartitioner`` (``torch.fx.passes.infra.partitioner``,
    there since 1.13, with the same constructor on 2.4 to 2.14) merges
    connected selected nodes into maximal groups without creating a cycle
    through unselected ones, and moves each ``getitem`` into the group of the
    node it reads. Single-node groups are kept: one delegated node is still
    delegated.
    """
    from torch.fx.passes.infra.partitioner import CapabilityBasedPartitioner
    from torch.fx.passes.operator_support import OperatorSupportBase

    class _Selected(OperatorSupportBase):
        def is_node_supported(self, submodules: Mapping[str, torch.nn.Module], node: Node) -> bool:
            return bool(is_selected(node))

    partitioner = CapabilityBasedPartitioner(graph_module, _Selected(), allows_single_node_partition=True)
    return [list(p.nodes) for p in partitioner.propose_partitions()]


def exported_program(
    graph_module: torch.fx.GraphModule,
    input_specs: list[InputSpec],
    output_specs: list[OutputSpec],
    *,
    state_dict: dict[str, torch.Tensor | torch.nn.Parameter],
    constants: dict,
    range_constraints: dict,
    n_inputs: int,
    n_outputs: int,
    verifiers: list | None = None,
) -> ExportedProgram:
    """An ``ExportedProgram`` around a graph cut out of another (a partition of a method).

    The constructor takes ``constants`` since 2.3 and ``verifiers`` (keyword)
    since 2.5; the positional arguments used here are the same on 2.4 to 2.14.
    The call signature says: ``n_inputs`` flat tensors in, a tuple of
    ``n_outputs`` out.
    """
    from torch.export.exported_program import ModuleCallEntry, ModuleCallSignature
    from torch.export.graph_signature import ExportGraphSignature
    from torch.utils import _pytree as pytree

    in_spec = pytree.tree_structure((tuple(range(n_inputs)), {}))
    out_spec = pytree.tree_structure(tuple(range(n_outputs)))
    call = ModuleCallEntry("", ModuleCallSignature(inputs=[], outputs=[], in_spec=in_spec, out_spec=out_spec))
    return torch.export.ExportedProgram(
        graph_module,
        graph_module.graph,
        ExportGraphSignature(input_specs=input_specs, output_specs=output_specs),
        state_dict,
        range_constraints,
        [call],
        None,
        constants,
        verifiers=verifiers,
    )


def graph_arguments(program: ExportedProgram, user_inputs: Iterable[object]) -> list[object]:
    """The positional arguments of an exported program's graph module, in its signature's order.

    The user inputs given, in order, and the program's own state for every other input: a
    parameter or a buffer from ``state_dict``, a lifted constant (or a non-persistent buffer, which
    ``state_dict`` leaves out) from ``constants``. Running the graph module on them runs the program.
    """
    from torch.export.graph_signature import InputKind

    given = iter(user_inputs)
    args: list[object] = []
    for spec in program.graph_signature.input_specs:
        if spec.kind == InputKind.USER_INPUT:
            args.append(next(given))
        elif spec.kind in (InputKind.PARAMETER, InputKind.BUFFER) and spec.target in program.state_dict:
            args.append(program.state_dict[spec.target])
        else:
            args.append(program.constants[spec.target])
    return args


def treespec_node(spec: TreeSpec) -> tuple[type | None, object, list[TreeSpec]]:
    """``(type, context, children)`` of a ``torch.utils._pytree.TreeSpec``; ``type`` is None for a leaf.

    The archive writes its own structure JSON from this (docs/archive-format.md,
    "Structures") instead of torch's private ``treespec_dumps`` strings.
    torch >= 2.10 has ``children()`` and deprecates the ``children_specs``
    field that 2.4 to 2.9 have.
    """
    if spec.is_leaf():
        return None, None, []
    children = spec.children() if hasattr(spec, "children") else spec.children_specs
    kind, context = spec.type, spec.context
    if kind is collections.namedtuple and isinstance(context, type):
        # Named tuples: torch 2.13 and 2.14 record the type as collections.namedtuple and
        # the class as the context; older versions record the class as the type.
        kind, context = context, None
    return kind, context, list(children)


def opinfo_database() -> tuple[list[OpInfo] | None, str]:
    """PyTorch's OpInfo list (``op_db``) and ``""``, or ``None`` and a one-line reason.

    ``torch.testing._internal.common_methods_invocations.op_db`` is private
    API: the same on 2.4 to 2.14, but it may move or break in any release, so
    the ops category degrades to a notice instead of failing the session. Its
    import needs the ``expecttest`` package (a PyTorch test dependency) and
    takes several seconds, which is why the suite ships what it needs from it
    as data (conformance/ops_data/) and imports it only to rebuild that data.
    """
    try:
        from torch.testing._internal.common_methods_invocations import op_db
    except ModuleNotFoundError as exc:
        return None, (
            f"PyTorch's OpInfo database needs the module {exc.name!r}, which is not installed "
            f"(pip install 'pytest-backendconf[ops]' installs it)"
        )
    except Exception as exc:  # a private module: anything may go wrong on import
        return None, (
            f"PyTorch's OpInfo database (torch.testing._internal.common_methods_invocations.op_db) "
            f"cannot be imported on torch {torch.__version__}: {type(exc).__name__}: {exc}"
        )
    return list(op_db), ""


def opinfo_tolerance_override_type() -> type[toleranceOverride] | None:
    """The class of OpInfo's ``toleranceOverride`` decorator (``.d``: dtype -> ``tol(atol, rtol)``), or ``None``.

    ``torch.testing._internal.common_device_type.toleranceOverride``: private,
    the same on 2.4 to 2.14; only the ops data's regeneration reads it.
    """
    try:
        from torch.testing._internal.common_device_type import toleranceOverride
    except Exception:  # a private module: anything may go wrong on import
        return None
    return toleranceOverride


# --- TorchScript's delegate API (the TorchScript flow, pytest_backendconf.torchscript) -------------
# Private since the API was added (torch 1.8) and unchanged through 2.14.


def jit_to_backend(
    name: str, scripted: torch.jit.ScriptModule, method_compile_spec: Mapping[str, Mapping[str, object]]
) -> torch.jit.ScriptModule:
    """``torch._C._jit_to_backend``: a scripted module lowered to the TorchScript backend ``name``."""
    return torch._C._jit_to_backend(name, scripted, method_compile_spec)  # type: ignore[attr-defined]


def torchscript_backend_class(name: str) -> Any:
    """The Python wrapper of the C++ backend class ``__torch__.torch.classes.__backends__.<name>``.

    A `RuntimeError` when no loaded library registers it. Its methods are the C++ class's, found at
    run time (hence ``Any``).
    """
    return torch._C._get_custom_class_python_wrapper("__backends__", name)


def save_for_lite_interpreter(module: torch.jit.ScriptModule, path: str, *, debug_info: bool) -> None:
    """``ScriptModule._save_for_lite_interpreter``; ``debug_info`` stores the debug handles' sources."""
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)  # "Lite Interpreter is deprecated"
        module._save_for_lite_interpreter(path, _save_mobile_debug_info=debug_info)


def load_for_lite_interpreter(path: str) -> torch.jit.mobile.LiteScriptModule:
    """``torch.jit.mobile._load_for_lite_interpreter`` (torch.jit.mobile is not imported by ``import torch``)."""
    import torch.jit.mobile

    return torch.jit.mobile._load_for_lite_interpreter(path)


def add_string_attribute(module: torch.jit.ScriptModule, name: str, value: str) -> None:
    """A new ``str`` attribute on a ScriptModule (``torch.utils.bundled_inputs`` adds its own this way)."""
    module._c._register_attribute(name, torch._C.StringType.get(), value)


def is_tensor_subclass(value: object) -> bool:
    """Whether ``value`` is a traceable wrapper tensor subclass (torchao's quantized weights are).

    ``torch.utils._python_dispatch.is_traceable_wrapper_subclass``: the protocol
    (``__tensor_flatten__``/``__tensor_unflatten__``) torch.export unwraps.
    """
    from torch.utils._python_dispatch import is_traceable_wrapper_subclass

    return bool(is_traceable_wrapper_subclass(value))


def register_quantized_decomposed() -> None:
    """Register the ``quantized_decomposed`` quantize/dequantize operators of PT2E programs.

    torch defines them in a private module (torchao imports it too); importing
    it registers them with the dispatcher and imports nothing host-only.
    """
    import torch.ao.quantization.fx._decomposed  # noqa: F401
