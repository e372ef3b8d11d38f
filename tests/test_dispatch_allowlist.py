"""Nothing in a file chooses what runs: every operator a blob, a fallback segment or a rerun file
names goes through one allowlist (pytest_backendconf.allowlist), and is refused with its name.

The hostile names are the ones an attacker used: torch.ops' own attributes
(``import_module.__call__.__call__`` imports a module, ``load_library`` loads native
code) and ``aten.from_file`` mapping a file for ``aten.copy_`` to write into. Each test
checks the error names the operator and that nothing was imported, loaded or written.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
import torch
from partition_models import WithCustomOp
from test_archive import entries_of, repack

import pytest_backendconf as bc
from pytest_backendconf import allowlist as _allowlist
from pytest_backendconf.archive import write_tensors
from pytest_backendconf.cli import _rerun
from pytest_backendconf.lowering import _saving
from pytest_backendconf.reference import bytecode, interpreter, ops
from pytest_backendconf.reference.bytecode import Block, Instruction, Program, Reg

EVIL_MODULE = "bc_evil_module_that_must_not_import"


@pytest.fixture
def bait(tmp_path, monkeypatch):
    """A module beside the archive that would leave a mark if imported, a library path, and a file to protect."""
    mark = tmp_path / "imported.mark"
    (tmp_path / f"{EVIL_MODULE}.py").write_text(f"open({str(mark)!r}, 'w').write('ran')\n")
    monkeypatch.syspath_prepend(str(tmp_path))  # as the working folder is when a user runs a command
    victim = tmp_path / "victim.txt"
    victim.write_bytes(b"untouched\n")
    libraries = set(torch.ops.loaded_libraries)
    yield {"mark": mark, "victim": victim, "library": str(tmp_path / "libevil.so")}
    assert EVIL_MODULE not in sys.modules
    assert not mark.exists()
    assert victim.read_bytes() == b"untouched\n"
    assert set(torch.ops.loaded_libraries) == libraries


def hostile_programs(bait) -> dict[str, tuple[str, Program]]:
    """name -> (the operator the error must name, a one-input program calling it through DISPATCH)."""

    def program(*instructions: Instruction) -> Program:
        return Program([], [Block(1, list(instructions), [Reg(len(instructions))])])

    def dispatch(name, *args, **kwargs) -> Instruction:
        return Instruction(ops.DISPATCH_OPCODE, [name, *args], kwargs, 7, "n")

    return {
        "import_module": (
            "import_module.__call__.__call__",
            program(dispatch("import_module.__call__.__call__", EVIL_MODULE)),
        ),
        "load_library": (
            "load_library.__call__.__call__",
            program(dispatch("load_library.__call__.__call__", bait["library"])),
        ),
        "load_library_dotted": ("load_library.default.default", program(dispatch("load_library.default.default"))),
        "from_file_then_copy": (
            "aten.from_file.default",
            program(
                dispatch("aten.from_file.default", str(bait["victim"]), True, 10, dtype=torch.uint8),
                dispatch("aten.copy_.default", Reg(1), Reg(0)),
            ),
        ),
        "copy_into_input": ("aten.copy_.default", program(dispatch("aten.copy_.default", Reg(0), Reg(0)))),
        "save": ("aten.save.default", program(dispatch("aten.save.default", Reg(0), str(bait["victim"])))),
        "print": ("prim.Print.default", program(dispatch("prim.Print.default", Reg(0)))),
    }


CASES = [
    "import_module",
    "load_library",
    "load_library_dotted",
    "from_file_then_copy",
    "copy_into_input",
    "save",
    "print",
]


def fallback_archive() -> dict[str, bytes]:
    lowered = bc.to_backend(
        WithCustomOp().eval(), "reference", {"forward": {}}, example_inputs=(torch.randn(2, 4),), partition="supported"
    )
    return entries_of(_saving.to_bytes(lowered))


@pytest.fixture(scope="module")
def partitioned():
    return fallback_archive()


@pytest.fixture(scope="module")
def whole():
    lowered = bc.to_backend(
        torch.nn.Linear(4, 4).eval(), "reference", {"forward": {}}, example_inputs=(torch.randn(2, 4),)
    )
    return entries_of(_saving.to_bytes(lowered))


@pytest.mark.parametrize("case", CASES)
def test_a_fallback_segment_naming_a_hostile_operator_is_refused_at_load(partitioned, bait, case):
    operator, program = hostile_programs(bait)[case]
    entries = {**partitioned, "fallback/forward.fallback0.bin": bytecode.encode(program)}
    with pytest.raises(bc.OperatorRefusedError) as info:
        bc.load(repack(entries))
    text = str(info.value)
    assert f"operator {operator!r}" in text
    assert "fallback segment 'forward.fallback0'" in text and "node 'n'" in text


@pytest.mark.parametrize("case", CASES)
def test_a_whole_method_blob_never_dispatches(whole, bait, case):
    operator, program = hostile_programs(bait)[case]
    entries = {**whole, "blobs/forward.bin": bytecode.encode(program)}
    with pytest.raises(bc.OperatorRefusedError, match="whole-method reference-backend blob never calls") as info:
        bc.load(repack(entries))
    assert f"operator {operator!r}" in str(info.value)
    assert "method 'forward'" in str(info.value)


@pytest.mark.parametrize("case", CASES)
def test_a_rerun_file_naming_a_hostile_operator_is_refused(tmp_path, bait, capsys, case):
    operator, _ = hostile_programs(bait)[case]
    sample = {
        "overload": operator,
        "dtype": "float32",
        "index": 0,
        "opinfo": "x",
        "args": [{"$input": 0}, str(bait["victim"])],
        "kwargs": {},
        "outputs": None,
        "inputs": 1,
    }
    path = tmp_path / "rerun.safetensors"
    write_tensors(path, {"input0": torch.ones(2)}, {"kind": "ops", "sample": json.dumps(sample)})
    assert _rerun.main([str(path), "--backend=reference"]) == 2
    err = capsys.readouterr().err
    assert f"operator {operator!r}" in err and "refused" in err
    assert "Traceback" not in err


def test_a_table_op_writing_to_the_callers_input_is_refused_at_load(whole):
    add_ = ops.BY_NAME["aten.add_.Tensor"].opcode
    program = Program([], [Block(1, [Instruction(add_, [Reg(0), Reg(0)], {}, 3, "add_")], [Reg(1)])])
    with pytest.raises(bc.OperatorRefusedError, match=r"writes to its argument 'self', which holds input 0"):
        interpreter.load(bytecode.encode(program))
    # On a tensor the program made (and on a view of it), the same op is fine.
    clone, view = ops.BY_NAME["aten.clone.default"].opcode, ops.BY_NAME["aten.view.default"].opcode
    program = Program(
        [],
        [
            Block(
                1,
                [
                    Instruction(clone, [Reg(0)], {}, 1, "c"),
                    Instruction(view, [Reg(1), [-1]], {}, 2, "v"),
                    Instruction(add_, [Reg(2), Reg(2)], {}, 3, "a"),
                ],
                [Reg(3)],
            )
        ],
    )
    x = torch.ones(2, 2)
    assert torch.equal(interpreter.load(bytecode.encode(program)).run([x])[0], torch.full((4,), 2.0))
    assert torch.equal(x, torch.ones(2, 2))
    # A view of the input is the input.
    program.blocks[0].instructions[0] = Instruction(view, [Reg(0), [2, 2]], {}, 1, "c")
    with pytest.raises(bc.OperatorRefusedError, match="register 2, which may share memory"):
        interpreter.load(bytecode.encode(program))


@pytest.mark.slow
def test_run_target_reports_the_refusal_and_never_prints_ok(tmp_path, partitioned, bait):
    operator, program = hostile_programs(bait)["from_file_then_copy"]
    path = tmp_path / "hostile.bcpt"
    path.write_bytes(repack({**partitioned, "fallback/forward.fallback0.bin": bytecode.encode(program)}))
    done = subprocess.run(
        [sys.executable, "-m", "pytest_backendconf.cli", "run-target", str(path), "--example-inputs"],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        timeout=120,
    )
    assert done.returncode != 0
    assert "target: ok" not in done.stdout
    assert "OperatorRefusedError" in done.stderr and operator in done.stderr


def test_the_allowlist_accepts_registered_functional_and_in_place_operators():
    assert _allowlist.resolve_operator("aten.add.Tensor", where="t") is torch.ops.aten.add.Tensor
    assert _allowlist.resolve_operator("aten.add_.Tensor", where="t") is torch.ops.aten.add_.Tensor
    for name, why in [
        ("aten.set_.source_Storage", "not in the operator allowlist"),
        ("aten.set_.source_Storage_storage_offset", "not in the operator allowlist"),
        ("aten.record_stream.default", "not in the operator allowlist"),
        ("aten._print.default", "not in the operator allowlist"),
        ("inductor._reinterpret_tensor.default", "not in the operator allowlist"),
        ("prim.Print.default", "not in the operator allowlist"),
        ("aten.add.__call__", "'__'"),
        ("torch.ops.aten", "no operator schema"),
        ("a.b", "namespace.op.overload"),
        ("x" * 10_000, "namespace.op.overload"),
    ]:
        with pytest.raises(bc.OperatorRefusedError, match=why):
            _allowlist.resolve_operator(name, where="t")


def test_a_custom_operator_still_passes_the_schema_rules():
    """Outside torch's namespaces (an operator the process registered itself) the rules still apply."""
    from partition_models import scale  # noqa: F401  (registers bcpartition::scale)

    assert _allowlist.resolve_operator("bcpartition.scale.default", where="t") is torch.ops.bcpartition.scale.default
    for schema, why in [
        ("set_thing(Tensor x) -> Tensor", "set_"),
        ("zero_unsafe(Tensor x) -> Tensor", "_unsafe"),
        ("read(str path) -> Tensor", "names a file"),
    ]:
        name = schema.split("(")[0]
        if not torch._C._jit_get_schemas_for_operator(f"bcallowrules::{name}"):
            _RULES_LIBRARY.define(schema)
        with pytest.raises(bc.OperatorRefusedError, match=why):
            _allowlist.resolve_operator(f"bcallowrules.{name}.default", where="t")


_RULES_LIBRARY = torch.library.Library("bcallowrules", "DEF")


def test_dtype_names_come_from_a_fixed_table():
    assert _allowlist.dtype_named("float16", where="w") is torch.float16
    for name in ["__class__", "ops", "load", "Tensor", "half", 3]:
        with pytest.raises(ValueError, match="is not a dtype name"):
            _allowlist.dtype_named(name, where="w")
