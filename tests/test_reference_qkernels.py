"""The reference backend's integer kernels: fixed-point requantization, the pattern pass, old blobs.

The arithmetic is checked against float64 (and exact Python integers
where float64 is not enough); the pattern pass by compiling real PT2E
programs and reading the blob's instructions back; attribution by a real
error inside a fused kernel and a real profile.
"""

from __future__ import annotations

import json
import math
import random
from pathlib import Path

import pytest
import torch

import pytest_backendconf as bc
from pytest_backendconf.reference import bytecode, interpreter, ops
from pytest_backendconf.reference.qkernels import (
    INT32_MAX,
    INT32_MIN,
    multiply_by_quantized_multiplier,
    quantize_multiplier,
    requantize,
    saturating_rounding_doubling_high_mul,
)

DATA = Path(__file__).parent / "data"


def _half_away(value: float) -> int:
    return int(math.copysign(math.floor(abs(value) + 0.5), value))


# --- the fixed-point arithmetic against float64 ----------------------------------------------------


@pytest.mark.parametrize("real", [1.0, 0.5, 0.75, 2.5e-3, 1 / 3, 7.1e-9, 3.9, 123.25, 0.9999999999])
def test_a_multiplier_holds_the_real_to_31_bits(real):
    multiplier, shift = quantize_multiplier(real)
    assert 2**30 <= multiplier < 2**31
    assert multiplier * 2.0 ** (shift - 31) == pytest.approx(real, rel=2**-31)


@pytest.mark.parametrize("real", [0.0, -0.5, math.inf, math.nan, 2.0**40, 2.0**-70])
def test_a_multiplier_that_cannot_be_held_is_a_value_error(real):
    with pytest.raises(ValueError, match="multiplier"):
        quantize_multiplier(real)


def test_requantization_rounds_to_nearest_against_float64():
    rng = random.Random(7)
    for _ in range(200):
        real = math.exp(rng.uniform(math.log(1e-5), math.log(8.0)))
        multiplier, shift = quantize_multiplier(real)
        x = torch.tensor([rng.randrange(-(2**27), 2**27) for _ in range(64)], dtype=torch.int64)
        got = multiply_by_quantized_multiplier(x, multiplier, shift)
        exact = x.double() * (multiplier * 2.0 ** (shift - 31))  # float64: |x| < 2**27, 31-bit multiplier
        # gemmlowp rounds twice: the high half (half a unit before the right shift), then the shift.
        bound = 0.5 + 0.5 * 2.0 ** min(shift, 0) + 2**-20
        error = (got.double() - exact).abs()
        assert (error <= bound).all(), (real, x[error > bound])
        if shift <= -8:  # an NPU's usual multipliers: the first rounding is lost in the shift
            assert (error <= 0.5 + 2**-8).all()


def test_ties_round_half_away_from_zero_where_torch_rounds_half_to_even():
    multiplier, shift = quantize_multiplier(2.0**-10)
    assert (multiplier, shift) == (2**30, -9)
    x = torch.tensor([512, 1536, 2560, -512, -1536, -2560, 2048, -2048])
    got = multiply_by_quantized_multiplier(x, multiplier, shift)
    assert got.tolist() == [1, 2, 3, -1, -2, -3, 2, -2]
    assert torch.round(x * 2.0**-10).tolist() == [0, 2, 2, 0, -2, -2, 2, -2]  # what eager's quantize does


def test_negative_values_mirror_positive_ones():
    rng = random.Random(3)
    for _ in range(50):
        multiplier, shift = quantize_multiplier(rng.uniform(1e-4, 1.0))
        x = torch.tensor([rng.randrange(1, 2**30) for _ in range(32)])
        assert torch.equal(
            multiply_by_quantized_multiplier(-x, multiplier, shift),
            -multiply_by_quantized_multiplier(x, multiplier, shift),
        )


def test_saturation_of_the_high_mul_the_left_shift_and_the_output_range():
    a = torch.tensor([INT32_MIN, INT32_MIN, INT32_MAX])
    assert saturating_rounding_doubling_high_mul(a, INT32_MIN).tolist()[0] == INT32_MAX
    # A multiplier above one shifts left first; an int32 that overflows saturates instead of wrapping.
    multiplier, shift = quantize_multiplier(4.0)
    assert shift > 0
    assert (multiplier, shift) == (2**30, 3)  # 4 = 0.5 * 2**3
    big = torch.tensor([2**30, -(2**30), 2**20])
    # 2**30 * 2**3 saturates to INT32_MAX (INT32_MIN) before the multiplier halves it: 2**30, not 2**32.
    assert multiply_by_quantized_multiplier(big, multiplier, shift).tolist() == [2**30, -(2**30), 2**22]
    # The accumulator saturates at int32, and the output clamps to [quant_min, quant_max].
    out = requantize(torch.tensor([2**40, -(2**40), 0, 1000]), *quantize_multiplier(0.01), 5, -128, 127, torch.int8)
    assert out.tolist() == [127, -128, 5, 15] and out.dtype == torch.int8


def test_per_channel_multipliers_apply_along_the_channel_dimension():
    reals = [0.01, 0.2, 0.003]
    pairs = [quantize_multiplier(r) for r in reals]
    multipliers = torch.tensor([m for m, _ in pairs], dtype=torch.int32)
    shifts = torch.tensor([s for _, s in pairs], dtype=torch.int32)
    acc = torch.randint(-50000, 50000, (2, 3, 4, 4))
    got = requantize(acc, multipliers, shifts, -3, -128, 127, torch.int8, channel_dim=1)
    for c, real in enumerate(reals):
        want = torch.clamp(torch.tensor([_half_away(v * real) for v in acc[:, c].flatten().tolist()]) - 3, -128, 127)
        # Each channel with its own multiplier: float64 rounding agrees but on a near-tie.
        assert (got[:, c].flatten().to(torch.int64) - want).abs().max() <= 1
        assert (got[:, c].flatten().to(torch.int64) == want).float().mean() > 0.99


# --- the pattern pass on real PT2E programs ----------------------------------------------------------


class ConvLinear(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv = torch.nn.Conv2d(3, 6, 3, padding=1)
        self.linear = torch.nn.Linear(6, 4)

    def forward(self, x):
        return self.linear(self.conv(x).mean((2, 3)))


def _quantized(scheme: str):
    pytest.importorskip("torchao", reason="quantizing needs the [quant] extra (torchao)")
    from pytest_backendconf.quant import quantize, reference_quantizer

    torch.manual_seed(0)
    model = ConvLinear().eval()
    x = torch.randn(2, 3, 8, 8)
    calibration = [((torch.randn(2, 3, 8, 8),), {}) for _ in range(4)]
    converted = quantize(torch.export.export(model, (x,)).module(), reference_quantizer(scheme), calibration)
    return converted, torch.export.export(converted, (x,)), x


def _blob(program, compile_spec=None, handles=None) -> bytes:
    from backendconf_reference import ReferenceBackend

    from pytest_backendconf.debuginfo import DebugHandleRecorder

    handles = handles if handles is not None else DebugHandleRecorder().assign(program.graph_module)
    return ReferenceBackend().preprocess(program, compile_spec or {}, handles)


def _listing(blob: bytes) -> list[tuple[str, str, tuple[int, ...]]]:
    """(op name, node, handle range) of each instruction of the blob's main block."""
    return [(ops.BY_OPCODE[i.opcode].name, i.node, i.handles) for i in bytecode.decode(blob).blocks[0].instructions]


@pytest.mark.parametrize("scheme", ["int8-static-per-tensor", "int8-static-per-channel"])
def test_a_quantized_conv_and_linear_compile_to_integer_kernels(scheme):
    from pytest_backendconf.debuginfo import DebugHandleRecorder

    converted, program, x = _quantized(scheme)
    handles = DebugHandleRecorder().assign(program.graph_module)
    blob = _blob(program, handles=handles)
    listing = _listing(blob)
    names = [name for name, _, _ in listing]
    assert "reference.quantized_convolution" in names and "reference.quantized_linear" in names, names
    assert "aten.conv2d.default" not in names and "aten.linear.default" not in names, names
    assert "quantized_decomposed.dequantize_per_channel.default" not in names  # the weights' dequantizes are absorbed
    assert int.from_bytes(blob[8:12], "little") == 2  # handle ranges need format 2
    by_name = {n.name: n for n in program.graph_module.graph.nodes}
    for name, node, covered in listing:
        if name.startswith("reference."):
            covered_nodes = {n.name for n, h in handles.items() if h in covered}
            anchor = by_name[node]
            quantize = next(iter(anchor.users))
            assert {anchor.name, quantize.name} <= covered_nodes, covered_nodes
            assert any("dequantize" in n for n in covered_nodes)
    lowered = bc.to_backend(converted, "reference", {"forward": {}}, example_inputs={"forward": (x,)})
    # Against eager running the Q/DQ program: the same integers but for rare neighbouring steps.
    torch.manual_seed(1)
    inputs = torch.randn(2, 3, 8, 8)
    got, want = lowered(inputs), converted(inputs)
    step = program.graph_module.graph.output_node().args[0][0].args[1]
    steps = ((got - want).abs() / step).round()
    assert steps.max() <= 1 and (steps > 0).sum() <= 1


def test_dynamic_quantization_and_fault_nodes_keep_the_literal_ops():
    _, dynamic, _ = _quantized("int8-dynamic")
    names = [name for name, _, _ in _listing(_blob(dynamic))]
    assert "quantized_decomposed.choose_qparams.tensor" in names and "aten.conv2d.default" in names
    assert not any(name.startswith("reference.") for name in names)
    _, static, _ = _quantized("int8-static-per-tensor")
    faulty = _listing(_blob(static, {"__backendconf_fault__": {"node": "conv2d"}}))
    names = [name for name, _, _ in faulty]
    assert "aten.conv2d.default" in names and "reference.quantized_linear" in names


def test_a_float_program_is_still_blob_format_1():
    program = torch.export.export(ConvLinear().eval(), (torch.randn(1, 3, 8, 8),))
    blob = _blob(program)
    assert int.from_bytes(blob[8:12], "little") == 1
    assert not any(h for _, _, h in _listing(blob))


def test_an_error_inside_a_fused_kernel_names_its_whole_range():
    _, program, _ = _quantized("int8-static-per-channel")
    blob = _blob(program)
    loaded = interpreter.load(blob)
    fused = next(i for i in bytecode.decode(blob).blocks[0].instructions if i.opcode in ops.INTEGER_OPCODES)
    with pytest.raises(bc.BackendError) as caught:
        loaded.run([torch.randn(2, 5, 8, 8)])  # five channels where the convolution takes three
    assert caught.value.debug_handles == fused.handles and len(fused.handles) >= 3
    assert "reference::quantized_convolution at node 'conv2d' failed" in str(caught.value)


def test_the_profile_shares_a_fused_kernels_time_among_its_nodes():
    converted, program, x = _quantized("int8-static-per-channel")
    lowered = bc.to_backend(converted, "reference", {"forward": {}}, example_inputs={"forward": (x,)})
    profile = bc.profile(lowered, x, repeat=2)
    ops_seen = {r["op"] for r in profile.rows}
    assert {"aten::conv2d", "aten::linear", "quantized_decomposed::quantize_per_tensor"} <= ops_seen, ops_seen
    assert "quantized_decomposed::dequantize_per_channel" in ops_seen  # absorbed, yet it has its share


# --- blobs written before the integer kernels ----------------------------------------------------------


def test_the_0_3_0_opcodes_keep_their_meaning():
    table = json.loads((DATA / "reference-opcodes-v2.json").read_text())
    changed = {c: n for c, n in table.items() if int(c) not in ops.BY_OPCODE or ops.BY_OPCODE[int(c)].name != n}
    assert not changed, f"opcodes renumbered or reused: {changed}"
    assert not ops.INTEGER_OPCODES & {int(c) for c in table}


def test_an_archive_of_0_3_0_quantized_blobs_loads_and_gives_the_same_outputs():
    pytest.importorskip("torchao", reason="the archive's program holds quantized_decomposed ops")
    lowered = bc.load(DATA / "reference-blobs-v2.bcpt")
    got = lowered(*lowered.fixture_args)
    assert len(got) == len(lowered.fixture_expected) == 2
    for g, w in zip(got, lowered.fixture_expected):
        torch.testing.assert_close(g, w, rtol=0, atol=0)


# --- the handle range in the blob -------------------------------------------------------------------


def _ranged(handles: tuple[int, ...]) -> bytes:
    instruction = bytecode.Instruction(
        ops.BY_NAME["aten.relu.default"].opcode, [bytecode.Reg(0)], {}, 7, "relu", False, handles
    )
    return bytecode.encode(bytecode.Program([], [bytecode.Block(1, [instruction], [bytecode.Reg(1)])]))


def test_a_handle_range_round_trips_and_a_format_1_blob_cannot_carry_one():
    blob = _ranged((5, 7, 9))
    assert bytecode.decode(blob).blocks[0].instructions[0].handles == (5, 7, 9)
    assert int.from_bytes(blob[8:12], "little") == 2
    as_format_1 = blob[:8] + (1).to_bytes(4, "little") + blob[12:]
    with pytest.raises(ValueError, match="unknown flags 0x02 for format 1"):
        bytecode.decode(as_format_1)
    plain = _ranged(())
    assert int.from_bytes(plain[8:12], "little") == 1 and bytecode.decode(plain).blocks[0].instructions[0].handles == ()


def test_an_empty_or_truncated_handle_range_is_refused():
    import struct
    import zlib

    blob = _ranged((5,))
    payload = bytearray(blob[24:])
    at = payload.index(b"relu") + 4  # the range's u16 count follows the node name
    assert struct.unpack_from("<H", payload, at)[0] == 1
    empty = payload[:at] + struct.pack("<H", 0) + payload[at + 2 + 8 :]
    huge = payload[:at] + struct.pack("<H", 999) + payload[at + 2 :]
    for bad, message in ((empty, "empty handle range"), (huge, "handle count .* is 999, more than the rest")):
        header = struct.pack("<8sIIQ", bytecode.MAGIC, 2, zlib.crc32(bytes(bad)), len(bad))
        with pytest.raises(ValueError, match=message):
            bytecode.decode(header + bytes(bad))
