"""The operator allowlist is explicit: pytest_backendconf/allowlist/operators.txt, nothing else.

A registered schema is no reason to admit an operator: the campaign that led
here built views with caller-chosen sizes, strides and offsets
(``aten._reshape_alias``, ``inductor._reinterpret_tensor``) and read the heap
through a fallback segment. These tests walk every registered schema and show
that in torch's namespaces only the listed names resolve, that those view
builders are refused at ``load()`` naming the operator and the archive entry,
and which names of the set each recorded torch release lacks.
"""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from partition_models import scale  # noqa: F401  (registers bcpartition::scale)
from test_archive import entries_of, repack

import pytest_backendconf as bc
from pytest_backendconf import allowlist
from pytest_backendconf.errors import ArchiveError
from pytest_backendconf.lowering import _saving
from pytest_backendconf.reference import bytecode, ops
from pytest_backendconf.reference.bytecode import Block, Instruction, Program, Reg

OPS_DATA = Path(__file__).parents[1] / "conformance" / "ops_data"

# Everything a process may register: torch's optional modules and its ecosystem's libraries.
_WALK = r"""
import importlib, json, sys
import torch
for name in sys.argv[1:]:
    try:
        importlib.import_module(name)
    except Exception:
        pass
from pytest_backendconf import allowlist
from pytest_backendconf.errors import OperatorRefusedError
names = set()
for schema in torch._C._jit_get_all_schemas():
    namespace, op = schema.name.split("::", 1)
    names.add(f"{namespace}.{op}.{schema.overload_name or 'default'}")
names |= {f"higher_order.{n}.default" for n in torch._ops._higher_order_ops}  # Python-only operators
resolved, refused = [], 0
for name in sorted(names):
    try:
        allowlist.resolve_operator(name, where="walk")
        resolved.append(name)
    except OperatorRefusedError:
        refused += 1
print(json.dumps({"names": sorted(names), "resolved": resolved, "refused": refused}))
"""
_MODULES = [
    "torch._inductor.lowering",
    "torch._prims.debug_prims",
    "torch._refs",
    "torch.ao.quantization.fx._decomposed",
    "torch.distributed._functional_collectives",
    "torch.distributed.tensor",
    "torch._higher_order_ops",
    "torch.nn.attention.flex_attention",
    "torch.testing._internal.custom_op_db",
    "torchvision.ops",
    "torchao.quantization",
]


@pytest.fixture(scope="module")
def walk():
    done = subprocess.run(
        [sys.executable, "-c", _WALK, *_MODULES], capture_output=True, text=True, timeout=600, check=True
    )
    return json.loads(done.stdout.splitlines()[-1])


def test_every_registered_schema_outside_the_set_is_refused(walk):
    namespaces = {n.split(".")[0] for n in walk["names"]}
    # Every namespace such a process registers is closed: a new one (a new torch) needs review.
    assert namespaces <= allowlist.CLOSED_NAMESPACES, sorted(namespaces - allowlist.CLOSED_NAMESPACES)
    assert walk["refused"] > 3000  # the walk saw the registry, not a handful of names
    resolved = set(walk["resolved"])
    assert resolved <= allowlist.ALLOWED, sorted(resolved - allowlist.ALLOWED)
    release = ".".join(torch.__version__.split(".")[:2])
    absent = allowlist.absent_in(release) or frozenset()
    assert allowlist.ALLOWED - absent <= resolved, sorted(allowlist.ALLOWED - absent - resolved)


def test_the_set_holds_no_view_builder_nor_any_refused_family():
    for name in allowlist.ALLOWED:
        namespace, op, _ = name.split(".")
        assert namespace in ("aten", "quantized_decomposed", "torchao"), name
        assert not op.startswith("set_") and "_unsafe" not in op, name
        assert op not in ("_reshape_alias", "as_strided_", "_reinterpret_tensor", "_alloc_from_pool"), name
        schema = allowlist.schema_named(name)
        assert schema is None or allowlist.refusal_reason(schema) is None, name


def test_the_set_covers_the_op_table_the_ops_data_and_quantized_decomposed():

    table = {n for n in ops.BY_NAME if n.split(".")[0] in ("aten", "quantized_decomposed", "torchao")}
    assert table - allowlist.ALLOWED == allowlist.TABLE_ONLY
    for path in sorted(OPS_DATA.glob("torch-*.json")):
        data = {s["overload"] for s in json.loads(path.read_text())["samples"]}
        assert data <= allowlist.ALLOWED, (path.name, sorted(data - allowlist.ALLOWED))
    # torch's own quantized_decomposed library, in a fresh interpreter: ExecuTorch and torchao, once
    # imported by another test of this process, register more overloads in that namespace.
    code = (
        "import torch, torch.ao.quantization.fx._decomposed\n"
        "for s in torch._C._jit_get_all_schemas():\n"
        "    if s.name.startswith('quantized_decomposed::'):\n"
        "        print(f\"quantized_decomposed.{s.name.split('::')[1]}.{s.overload_name or 'default'}\")\n"
    )
    decomposed = set(
        subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.split()
    )
    assert decomposed and decomposed <= allowlist.ALLOWED, sorted(decomposed - allowlist.ALLOWED)


def test_the_names_a_torch_release_lacks_are_recorded():
    import torch.ao.quantization.fx._decomposed

    # torchao's operators exist where torchao (the [quant] extra) is installed and imported.
    with_torchao = importlib.util.find_spec("torchao") is not None
    if with_torchao:
        import torchao.quantization  # noqa: F401
    release = ".".join(torch.__version__.split(".")[:2])
    lacking = sorted(
        n
        for n in allowlist.ALLOWED
        if allowlist.schema_named(n) is None and (with_torchao or not n.startswith("torchao."))
    )
    recorded = allowlist.absent_in(release)
    assert recorded is not None, (
        f"torch {release} is not recorded in pytest_backendconf/allowlist/operators.txt: add it to "
        f"@releases and mark these names '@absent {release}': {lacking}"
    )
    assert lacking == sorted(recorded)
    # What the data says per release, for a reader of this test's output.
    print({r: sorted(allowlist.absent_in(r) or ()) for r in allowlist.RECORDED_RELEASES})


def test_the_admitted_as_strided_operators_are_checked_against_the_storage():
    x = torch.zeros(1)
    for call in [
        lambda: torch.ops.aten.as_strided.default(x, [1024], [1]),
        lambda: torch.ops.aten.as_strided.default(x, [1], [1], 5),
        lambda: torch.ops.aten.as_strided_copy.default(x, [1024], [1]),
        lambda: torch.ops.aten.as_strided_scatter.default(torch.zeros(4), torch.zeros(1024), [1024], [1]),
    ]:
        with pytest.raises(RuntimeError, match="out of bounds"):
            call()
    with pytest.raises(RuntimeError, match="Negative strides"):
        torch.ops.aten.as_strided.default(x, [2], [-1])


# --- hostile fallback segments -------------------------------------------------------------------


@pytest.fixture(scope="module")
def partitioned():
    from partition_models import WithCustomOp

    lowered = bc.to_backend(
        WithCustomOp().eval(), "reference", {"forward": {}}, example_inputs=(torch.randn(2, 4),), partition="supported"
    )
    return entries_of(_saving.to_bytes(lowered))


def _dispatch(name, *args, **kwargs) -> Instruction:
    return Instruction(ops.DISPATCH_OPCODE, [name, *args], kwargs, 7, "n")


VIEW_BUILDERS = {
    "aten._reshape_alias.default": _dispatch("aten._reshape_alias.default", Reg(0), [1024], [1]),
    "inductor._alloc_from_pool.default": _dispatch(
        "inductor._alloc_from_pool.default", Reg(0), -64, torch.float32, [1024], [1]
    ),
    "inductor._reinterpret_tensor.default": _dispatch("inductor._reinterpret_tensor.default", Reg(0), [1024], [1], -64),
    "debugprims.load_tensor.default": _dispatch(
        "debugprims.load_tensor.default", "t", [1024], [1], dtype=torch.float32, device="cpu"
    ),
}


@pytest.mark.parametrize("operator", sorted(VIEW_BUILDERS))
def test_a_view_builder_in_a_fallback_segment_is_refused_at_load(partitioned, operator):
    program = Program([], [Block(1, [VIEW_BUILDERS[operator]], [Reg(1)])])
    archive = repack({**partitioned, "fallback/forward.fallback0.bin": bytecode.encode(program)})
    dynamo = "torch._dynamo" in sys.modules
    with pytest.raises(bc.OperatorRefusedError) as info:
        bc.load(archive)
    assert isinstance(info.value, ArchiveError)  # existing `except ArchiveError` callers catch it
    text = str(info.value)
    assert f"operator {operator!r}" in text
    assert "archive entry 'fallback/forward.fallback0.bin'" in text and "node 'n'" in text
    assert "not in the operator allowlist" in text
    assert ("torch._dynamo" in sys.modules) == dynamo  # nothing was imported on its behalf


@pytest.mark.slow
@pytest.mark.parametrize("command", ["run-target", "profile"])
def test_the_cli_refuses_such_an_archive_without_dying_by_a_signal(tmp_path, partitioned, command):
    """What the campaign ended with SIGSEGV (a 4 KiB fill_ past a 1-element tensor) is a refusal now."""
    program = Program(
        [],
        [
            Block(
                1,
                [
                    VIEW_BUILDERS["aten._reshape_alias.default"],
                    Instruction(ops.DISPATCH_OPCODE, ["aten.fill_.Scalar", Reg(1), -777.0], {}, 8, "fill"),
                ],
                [Reg(2)],
            )
        ],
    )
    path = tmp_path / "hostile.bcpt"
    path.write_bytes(repack({**partitioned, "fallback/forward.fallback0.bin": bytecode.encode(program)}))
    done = subprocess.run(
        [sys.executable, "-m", "pytest_backendconf.cli", command, str(path), "--example-inputs"],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        timeout=300,
    )
    assert done.returncode > 0, (done.returncode, done.stderr[-2000:])  # an error exit, not a signal
    assert "operator 'aten._reshape_alias.default'" in done.stderr and "is refused" in done.stderr
    assert "target: ok" not in done.stdout


# --- admitted operators whose kernels trust their index arguments -------------------------------


@pytest.mark.parametrize("route", ["table", "dispatcher"])
@pytest.mark.parametrize(
    ("kwargs", "why"),
    [
        ({"offsets": torch.tensor([0, 64])}, "offsets must be non-decreasing and within"),
        ({"lengths": torch.tensor([100000]), "unsafe": True}, "unsafe=True"),
    ],
)
def test_segment_reduce_never_reads_past_its_data(route, kwargs, why):
    """torch's kernel sums heap words for offsets past the data; the interpreter checks them per call."""
    from pytest_backendconf.reference import interpreter
    from pytest_backendconf.reference.bytecode import Const

    tensors = [k for k, v in kwargs.items() if isinstance(v, torch.Tensor)]
    names = {k: Const(i) for i, k in enumerate(tensors)}
    constants = [kwargs[k] for k in tensors]
    if route == "table":
        opcode, args = ops.BY_NAME["aten.segment_reduce.default"].opcode, [Reg(0), "sum"]
    else:
        opcode, args = ops.DISPATCH_OPCODE, ["aten.segment_reduce.default", Reg(0), "sum"]
    kw = {k: (v if isinstance(v, bool) else names[k]) for k, v in kwargs.items()}
    program = Program(constants, [Block(1, [Instruction(opcode, args, kw, 3, "seg")], [Reg(1)])])
    loaded = interpreter.load(bytecode.encode(program), dispatch=True)
    with pytest.raises(bc.BackendError, match=why):
        loaded.run([torch.zeros(4)])
    # Offsets that stay inside the data run as before.
    program.constants[0] = torch.tensor([0, 2, 4])
    if route == "table" and "unsafe" not in kwargs:
        assert torch.equal(interpreter.load(bytecode.encode(program)).run([torch.ones(4)])[0], torch.tensor([2.0, 2.0]))
