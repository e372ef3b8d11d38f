"""Text rendered from debug info is capped per frame, per stack and in total (docs/archive-format.md,
"Bounded text"), whatever a small archive's tables say.

The amplification shapes: one long source line referenced K times by one stack, and K module
hierarchy pairs naming one long name. Both deflate to almost nothing; uncapped, a 30 KB archive
rendered to gigabytes. The tests check the sizes of what is produced (never the time it takes).
"""

from __future__ import annotations

import json
import random
import string

import pytest
import torch
from partition_models import WithCustomOp
from test_archive import entries_of, lower
from test_archive import registry  # noqa: F401  (the module-scoped fixture: that module's backends)
from test_archive_hostile import honest

import pytest_backendconf as bc
from pytest_backendconf.cli import _main as cli
from pytest_backendconf.debuginfo import (
    MAX_FRAMES,
    MAX_HIERARCHY,
    MAX_NAME_CHARS,
    MAX_SOURCE_CHARS,
    MAX_TEXT_CHARS,
    Frame,
    format_runtime,
)
from pytest_backendconf.lowering import _saving
from pytest_backendconf.reference import bytecode, ops
from pytest_backendconf.reference.bytecode import Block, Instruction, Program, Reg

K = 2000
#: Random letters: they deflate about 1.3 times, so the archive stays within the reader's ratio limit.
LONG = "".join(random.Random(0).choices(string.ascii_letters, k=20_000))
#: What one handle's text may take: the cap, plus its header line.
PER_HANDLE = MAX_TEXT_CHARS + 1_000


def amplified(entries: dict[str, bytes], shape: str) -> bytes:
    """The archive with every handle pointing at one amplified stack or hierarchy."""
    document = json.loads(entries["debug.json"])
    if shape == "line":
        document["lines"].append("x = " + LONG)
        document["frames"].append([0, 1, 0, len(document["lines"]) - 1, 4, 4 + len(LONG)])
        document["stacks"].append([len(document["frames"]) - 1] * K)
        for row in document["nodes"]:
            row[5] = len(document["stacks"]) - 1
    else:
        document["names"].append(LONG)
        long_name = len(document["names"]) - 1
        document["hierarchies"].append([long_name, long_name] * K)
        for row in document["nodes"]:
            row[4] = len(document["hierarchies"]) - 1
    return honest({**entries, "debug.json": json.dumps(document).encode()})


@pytest.fixture(scope="module")
def small_entries():
    return entries_of(_saving.to_bytes(lower()))


@pytest.mark.parametrize("shape", ["line", "hierarchy"])
def test_symbolicate_of_an_amplifying_archive_is_capped(small_entries, shape):
    data = amplified(small_entries, shape)
    assert len(data) < 40_000
    handles = sorted(bc.read_archive(data).debug)
    text = bc.symbolicate(data, handles)
    assert len(text) <= len(handles) * PER_HANDLE
    assert "more characters)" in text
    assert ("more frames)" if shape == "line" else "more)") in text
    one = bc.symbolicate(data, handles[:1])
    assert len(one) <= PER_HANDLE


@pytest.mark.parametrize("shape", ["line", "hierarchy"])
def test_the_symbolicate_command_prints_capped_text(small_entries, shape, tmp_path, capsys):
    path = tmp_path / "amplified.bcpt"
    path.write_bytes(amplified(small_entries, shape))
    handles = sorted(bc.read_archive(path).debug)
    assert cli.main(["symbolicate", str(path), *map(str, handles)]) == 0
    assert len(capsys.readouterr().out) <= len(handles) * PER_HANDLE


def test_a_frame_cuts_its_source_line_and_keeps_the_carets_under_the_expression():
    source = "y = " + "a" * 5_000 + " + target(x) + " + "b" * 5_000
    col = source.index("target")
    frame = Frame("f" * 1_000 + ".py", 3, "g" * 1_000, source, col, col + len("target(x)"))
    lines = frame.render().splitlines()
    assert len(lines[0]) < 2 * MAX_NAME_CHARS + 100 and "(800 more characters)" in lines[0]
    code, carets = lines[1], lines[2]
    assert len(code) < MAX_SOURCE_CHARS + 80
    assert code.startswith("    … (") and code.endswith("more characters)")
    start = carets.index("~")
    assert code[start : start + len("target(x)")] == "target(x)"
    assert carets.strip() == "~" * len("target(x)") + " <--- HERE"


def test_a_stack_keeps_its_outermost_and_innermost_frames():
    frames = tuple(Frame("m.py", i, f"f{i}", f"call_{i}()") for i in range(500))
    info = bc.DebugInfo(1, "aten::mul", "mul", "forward", (("top", "T"),) * 300, frames)
    text = str(info)
    assert len(text) <= MAX_TEXT_CHARS
    assert "in f0\n" in text and "in f499\n" in text and "in f250\n" not in text
    assert f"… ({500 - MAX_FRAMES} more frames)" in text
    assert f"… ({300 - MAX_HIERARCHY} more)" in text


def test_a_runtime_error_built_from_amplified_debug_info_is_capped(small_entries):
    debug = bc.read_archive(amplified(small_entries, "line")).debug
    text = format_runtime("boom " * 100_000, next(iter(debug.values())))
    assert len(text) <= 2 * MAX_TEXT_CHARS + 1_000


def test_loading_a_fallback_that_names_an_unregistered_op_raises_a_capped_error():
    lowered = bc.to_backend(
        WithCustomOp().eval(), "reference", {"forward": {}}, example_inputs=(torch.randn(2, 4),), partition="supported"
    )
    entries = entries_of(_saving.to_bytes(lowered))
    handle = sorted(bc.debug_info(lowered))[0]
    missing = Instruction(ops.DISPATCH_OPCODE, ["nosuchlib.op.default", Reg(0)], {}, handle, "n" * 100_000)
    entries["fallback/forward.fallback0.bin"] = bytecode.encode(Program([], [Block(1, [missing], [Reg(1)])]))
    data = amplified(entries, "line")
    with pytest.raises(bc.OperatorNotRegisteredError) as info:
        bc.load(data)
    assert "nosuchlib" in str(info.value)
    assert len(str(info.value)) <= 2 * PER_HANDLE
