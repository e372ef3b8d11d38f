"""State in the contract: buffers a method writes, lowered with real torch.export and run by the reference.

The lowering hands the backend a program whose state is explicit (inputs first,
new values first among the outputs) and the lowered module carries the state
from call to call: these tests compare whole sequences of calls with eager's.
"""

from __future__ import annotations

import threading

import pytest
import torch
from torch import nn

import lowering_models as models
import pytest_backendconf as bc
from backendconf_reference import ReferenceBackend
from pytest_backendconf.lowering import state_specs
from stateful_models import Accumulator, PrefillDecode, SliceAssignCache, TinyDecoder, greedy

aten = torch.ops.aten
TOKEN, POSITION = torch.tensor([[3]]), torch.tensor([0])


def lower(module, inputs, **kwargs):
    return bc.to_backend(module, kwargs.pop("backend", "reference"), {"forward": {}}, example_inputs=inputs, **kwargs)


def calls(module, inputs):
    return [module(x).clone() for x in inputs]


# --- the sequence of outputs is eager's ---------------------------------------------------


@pytest.mark.parametrize("partition", [None, "supported"], ids=["whole", "supported"])
def test_accumulator_gives_eagers_sequence(partition):
    inputs = [torch.randn(3) for _ in range(5)]
    lowered = lower(Accumulator(), (inputs[0],), partition=partition)
    expected = calls(Accumulator(), inputs)
    got = calls(lowered, inputs)
    for step, (e, g) in enumerate(zip(expected, got)):
        torch.testing.assert_close(g, e, msg=lambda m: f"call {step}: {m}")
    torch.testing.assert_close(bc.state(lowered)["acc"], sum(inputs))


@pytest.fixture(scope="module")
def decoder_program():
    """The decoder exported once (as bc.export_method does for to_backend); each test lowers it again."""
    from pytest_backendconf.lowering import export_method

    return export_method(TinyDecoder().eval(), "forward", (TOKEN, POSITION), {})


def _fallback_index_copy(node):
    return node.target is not aten.index_copy.default


def _only_index_copy(node):
    return node.target is aten.index_copy.default


@pytest.mark.parametrize(
    "partition",
    [
        None,
        pytest.param("supported", marks=pytest.mark.slow),
        _fallback_index_copy,
        pytest.param(_only_index_copy, marks=pytest.mark.slow),
    ],
    ids=["whole", "supported", "cache-writes-in-fallback", "only-cache-writes-delegated"],
)
def test_kv_cache_decoder_generates_eagers_tokens_for_12_steps(decoder_program, partition):
    eager = TinyDecoder().eval()
    lowered = bc.to_backend(decoder_program, "reference", {"forward": {}}, partition=partition)
    if callable(partition):
        # The cache writes run where the partition function put them: delegated, or on the CPU fallback.
        groups = bc.delegation(lowered)["forward"]
        writes = [n for n in groups.delegated + groups.fallback if n.startswith("index_copy")]
        where = groups.delegated if partition is _only_index_copy else groups.fallback
        assert writes and all(n in where for n in writes), groups
    logits = []

    def step(tokens, positions):
        out = lowered(tokens, positions)
        expected = eager(tokens, positions)
        torch.testing.assert_close(out, expected, rtol=1e-4, atol=1e-5)
        logits.append(out)
        return out

    tokens = greedy(step, TOKEN, 12)
    assert tokens == greedy(TinyDecoder().eval(), TOKEN, 12)
    assert len(logits) == 12
    # The cache holds the 12 positions written (the slots past them are still zero).
    cache = bc.state(lowered)["blocks.0.attn.k_cache"]
    assert cache[:, :, :12].abs().sum() > 0 and cache[:, :, 12:].abs().sum() == 0


@pytest.mark.parametrize("partition", [None, "supported"], ids=["whole", "supported"])
def test_a_cache_written_by_slice_assignment_gives_eagers_sequence(partition):
    example = (torch.randn(1, 2, 1, 4), torch.tensor([0]))
    lowered, eager = lower(SliceAssignCache(), example, partition=partition), SliceAssignCache()
    for position in range(4):
        x = torch.randn(1, 2, 1, 4)
        for got, expected in zip(lowered(x, torch.tensor([position])), eager(x, torch.tensor([position]))):
            torch.testing.assert_close(got, expected)


@pytest.mark.slow  # two exports and their functionalization: seconds
def test_prefill_of_a_dynamic_prompt_and_decode_share_one_cache():
    from torch.export import Dim

    length = Dim("length", min=2, max=8)
    lowered = bc.to_backend(
        PrefillDecode().eval(),
        "reference",
        {"prefill": {}, "decode": {}},
        example_inputs={"prefill": (torch.tensor([[3, 5, 7]]), torch.arange(3)), "decode": (TOKEN, POSITION)},
        dynamic_shapes={"prefill": {"tokens": {1: length}, "positions": {0: length}}},
    )
    decode_state = lowered.lowered.methods["decode"].state
    assert {s.fqn for s in decode_state} == {s.fqn for s in lowered.lowered.methods["prefill"].state}

    def generate(module):
        prompt = torch.tensor([[3, 5, 7, 9, 2]])  # not the example's length
        tokens = [int(module.prefill(prompt, torch.arange(5)).argmax())]
        for position in range(5, 12):
            tokens.append(int(module.decode(torch.tensor([[tokens[-1]]]), torch.tensor([position])).argmax()))
        return tokens

    assert generate(lowered) == generate(PrefillDecode().eval())


# --- what the backend sees ---------------------------------------------------------------


class Recording(ReferenceBackend):
    """The reference backend, recording the state of each program it gets and each execute's inputs."""

    name = "recording_state"

    def __init__(self) -> None:
        super().__init__()
        self.specs: list[tuple] = []
        self.programs: list = []
        self.calls: list[list] = []

    def preprocess(self, program, compile_spec, debug_handles):
        self.specs.append(state_specs(program))
        self.programs.append(program)
        return super().preprocess(program, compile_spec, debug_handles)

    def execute(self, handle, inputs):
        self.calls.append([t.clone() if isinstance(t, torch.Tensor) else t for t in inputs])
        return super().execute(handle, inputs)


def test_preprocess_gets_the_state_as_inputs_and_outputs_named_by_spec():
    backend = Recording()
    lowered = lower(Accumulator(), (torch.ones(3),), backend=backend)
    (specs,) = backend.specs
    assert specs == (bc.StateSpec(fqn="acc", dtype="float32", shape=(3,), input=0, output=0),)
    program = backend.programs[0]
    kinds = [s.kind.name for s in program.graph_signature.input_specs]
    assert kinds == ["USER_INPUT", "USER_INPUT"]  # the state, then x: nothing left to mutate
    assert all(s.kind.name == "USER_OUTPUT" for s in program.graph_signature.output_specs)
    assert not program.state_dict and "acc" not in program.constants
    lowered(torch.ones(3))
    lowered(torch.full((3,), 2.0))
    # execute got the current state first, then the caller's input.
    torch.testing.assert_close(backend.calls[1][0], torch.ones(3))
    torch.testing.assert_close(backend.calls[1][1], torch.full((3,), 2.0))
    assert lowered.lowered.methods["forward"].state == specs


def test_a_partition_gets_the_states_it_reads_and_writes():
    backend = Recording()
    lower(Accumulator(), (torch.ones(3),), backend=backend, partition=lambda n: n.target is aten.add.Tensor)
    # Two partitions: the state's update (acc + x) and the output's (acc * 2 + 1, which reads the new
    # value computed by the first, not the state).
    described = {tuple((s.fqn, s.input, s.output) for s in specs) for specs in backend.specs}
    assert described == {(("acc", 0, 0),), ()}


class Writer(nn.Module):
    """``forward`` writes the buffer, ``peek`` only reads it: both see its current value."""

    def __init__(self) -> None:
        super().__init__()
        self.register_buffer("total", torch.zeros(2))

    def forward(self, x):
        self.total.add_(x)
        return x + 0

    def peek(self, scale):
        return self.total * scale


def test_a_method_that_only_reads_the_state_sees_the_other_methods_writes():
    lowered = bc.to_backend(
        Writer(),
        "reference",
        {"forward": {}, "peek": {}},
        example_inputs={"forward": (torch.ones(2),), "peek": (torch.ones(2),)},
    )
    peek = lowered.lowered.methods["peek"].state
    assert [(s.fqn, s.output) for s in peek] == [("total", None)]
    lowered(torch.ones(2))
    lowered(torch.full((2,), 3.0))
    torch.testing.assert_close(lowered.peek(torch.full((2,), 2.0)), torch.full((2,), 8.0))


# --- instances, reset, threads ----------------------------------------------------------


def test_two_lowerings_of_one_module_never_share_state():
    module = Accumulator()
    first, second = lower(module, (torch.ones(3),)), lower(module, (torch.ones(3),))
    for _ in range(3):
        first(torch.ones(3))
        second(torch.full((3,), 10.0))  # interleaved
    torch.testing.assert_close(bc.state(first)["acc"], torch.full((3,), 3.0))
    torch.testing.assert_close(bc.state(second)["acc"], torch.full((3,), 30.0))
    torch.testing.assert_close(module.acc, torch.zeros(3))  # the caller's module never ran


def test_reset_returns_to_the_initial_state():
    module = Accumulator()
    module.acc.fill_(5.0)  # the state as exported: what reset returns to
    lowered = lower(module, (torch.ones(3),))
    first = lowered(torch.ones(3))
    lowered(torch.ones(3))
    lowered.reset()
    torch.testing.assert_close(bc.state(lowered)["acc"], torch.full((3,), 5.0))
    torch.testing.assert_close(lowered(torch.ones(3)), first)
    bc.reset(lowered)  # the function form, for a module with a lowered method named reset
    torch.testing.assert_close(bc.state(lowered)["acc"], torch.full((3,), 5.0))


def test_state_returned_by_bc_state_is_a_copy():
    lowered = lower(Accumulator(), (torch.ones(3),))
    bc.state(lowered)["acc"].fill_(100.0)
    torch.testing.assert_close(lowered(torch.ones(3)), torch.full((3,), 3.0))


def test_calls_from_two_threads_take_turns_and_lose_no_update():
    lowered = lower(Accumulator(), (torch.ones(3),))
    n = 40

    def run(value: float) -> None:
        for _ in range(n):
            lowered(torch.full((3,), value))

    threads = [threading.Thread(target=run, args=(v,)) for v in (1.0, 100.0)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    torch.testing.assert_close(bc.state(lowered)["acc"], torch.full((3,), n * 101.0))


# --- ExportedProgram and keyword inputs ----------------------------------------------------


class KeywordDecoder(nn.Module):
    """The calling convention of an on-device LLM wrapper: keyword inputs only."""

    def __init__(self) -> None:
        super().__init__()
        self.decoder = TinyDecoder()

    def forward(self, *, input_ids, cache_position):
        return self.decoder(input_ids, cache_position)


@pytest.fixture(scope="module")
def keyword_program():
    return torch.export.export(
        KeywordDecoder().eval(), (), {"input_ids": TOKEN, "cache_position": POSITION}, strict=False
    )


@pytest.mark.parametrize(
    "partition", [None, pytest.param("supported", marks=pytest.mark.slow)], ids=["whole", "supported"]
)
def test_an_exported_program_with_keyword_inputs_lowers_and_generates_as_eager(keyword_program, partition):
    program = keyword_program
    lowered = bc.to_backend(program, "reference", {"forward": {}}, partition=partition)
    assert str(lowered.forward.__signature__) == "(*, input_ids, cache_position)"
    generated = greedy(lambda t, p: lowered(input_ids=t, cache_position=p), TOKEN, 12)
    eager = program.module()
    assert generated == greedy(lambda t, p: eager(input_ids=t, cache_position=p), TOKEN, 12)
    with pytest.raises(bc.InputSpecError, match=r"too many positional arguments; its signature is \(\*, input_ids"):
        lowered(TOKEN, POSITION)


def test_an_exported_program_with_positional_inputs_is_left_as_it_was():
    program = torch.export.export(Accumulator(), (torch.ones(3),), strict=False)
    lowered = bc.to_backend(program, "reference", {"forward": {}})
    assert str(lowered.forward.__signature__) == "(x, /)"
    lowered(torch.ones(3))
    torch.testing.assert_close(lowered(torch.ones(3)), torch.full((3,), 5.0))
    # The caller's program still starts from its own buffer, untouched by the lowering.
    torch.testing.assert_close(program.module()(torch.ones(3)), torch.full((3,), 3.0))


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"example_inputs": (torch.ones(3),)}, "to_backend() of an ExportedProgram takes no example_inputs"),
        ({"dynamic_shapes": {"x": {0: 2}}}, "takes no dynamic_shapes"),
    ],
)
def test_bad_arguments_with_a_program_name_the_argument_and_the_fix(kwargs, message):
    program = torch.export.export(Accumulator(), (torch.ones(3),), strict=False)
    with pytest.raises(bc.LoweringError) as info:
        bc.to_backend(program, "reference", {"forward": {}}, **kwargs)
    assert message in str(info.value) and "export again with torch.export.export" in str(info.value)


def test_a_program_lowers_as_one_method():
    program = torch.export.export(Accumulator(), (torch.ones(3),), strict=False)
    with pytest.raises(bc.LoweringError, match="names its one method, e.g. {'forward': {}}"):
        bc.to_backend(program, "reference", {"forward": {}, "other": {}})


def test_a_module_without_example_inputs_is_told_to_give_them():
    with pytest.raises(bc.LoweringError, match=r"needs example_inputs: one tuple of example arguments"):
        bc.to_backend(Accumulator(), "reference", {"forward": {}})


# --- what is not state ---------------------------------------------------------------------


class WritesInput(nn.Module):
    def forward(self, x):
        x.mul_(2)
        return x + 1


class WritesInputView(nn.Module):
    def forward(self, x):
        x[0].add_(1)
        return x * 2


class WritesParameter(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.w = nn.Parameter(torch.ones(3), requires_grad=False)

    def forward(self, x):
        self.w.add_(x)
        return x * 2


@pytest.mark.parametrize(
    "module, message",
    [
        (WritesInput(), "method 'forward' writes to its input 'x' (node 'mul_', aten::mul_, in place)"),
        (WritesInputView(), "method 'forward' writes to its input 'x' (node 'add_', aten::add_, in place)"),
        (WritesParameter(), "writes to parameter 'w'"),
    ],
    ids=["input", "input-view", "parameter"],
)
def test_writes_that_are_not_state_are_refused_naming_the_node_and_the_tensor(module, message):
    with pytest.raises(bc.LoweringError) as info:
        lower(module, (torch.ones(3),))
    text = str(info.value)
    assert message in text
    assert "training mode" not in text  # no training-mode op here: the hint would mislead


def test_the_training_mode_hint_appears_with_a_training_mode_op():
    with pytest.raises(bc.LoweringError) as info:
        lower(models.SmallCNN().train(), (torch.randn(2, 3, 8, 8),))
    assert "Is the module in training mode? Call .eval() before lowering." in str(info.value)
    assert "training-mode op node 'batch_norm'" in str(info.value)


def test_a_new_state_of_the_wrong_shape_is_an_output_spec_error_naming_the_state():
    class WrongState(ReferenceBackend):
        name = "wrong_state"

        def execute(self, handle, inputs):
            outputs = list(super().execute(handle, inputs))
            return [outputs[0][:2], *outputs[1:]]

    lowered = lower(Accumulator(), (torch.ones(3),), backend=WrongState())
    with pytest.raises(bc.OutputSpecError, match=r"the new value of state 'acc' \(a float32\[3\] tensor\)"):
        lowered(torch.ones(3))
    torch.testing.assert_close(bc.state(lowered)["acc"], torch.zeros(3))  # a failed call moves nothing on


# --- archives ------------------------------------------------------------------------------


def _manifest(data: bytes) -> dict:
    import io
    import json
    import zipfile

    return json.loads(zipfile.ZipFile(io.BytesIO(data)).read("manifest.json"))


@pytest.mark.parametrize("partition", [None, "supported"], ids=["whole", "supported"])
def test_an_archive_stores_the_initial_state_and_a_loaded_module_starts_from_it(tmp_path, partition):
    module = Accumulator()
    module.acc.fill_(1.0)
    lowered = lower(module, (torch.ones(3),), partition=partition)
    inputs = [torch.randn(3) for _ in range(3)]
    expected = calls(lowered, inputs)  # the module has run: its live state is not the initial one
    path = tmp_path / "acc.pte"
    bc.save(lowered, path)
    manifest = _manifest(path.read_bytes())
    assert manifest["schema_version"] == [2, 0]
    assert manifest["state"] == [{"fqn": "acc", "dtype": "float32", "shape": [3]}]
    assert manifest["methods"][0]["state"] == [
        {"fqn": "acc", "dtype": "float32", "shape": [3], "input": 0, "output": 0}
    ]
    first, second = bc.load(path), bc.load(path)
    torch.testing.assert_close(bc.state(first)["acc"], torch.ones(3))
    got = calls(first, inputs)
    for e, g in zip(expected, got):
        torch.testing.assert_close(g, e)
    torch.testing.assert_close(bc.state(second)["acc"], torch.ones(3))  # two loads never share state
    first.reset()
    torch.testing.assert_close(calls(first, inputs)[0], expected[0])
    # Saved again after running, the archive is the same bytes: still the initial state.
    again = tmp_path / "again.pte"
    bc.save(first, again)
    assert again.read_bytes() == path.read_bytes()


def test_a_module_without_state_still_writes_schema_1_and_its_archives_load(tmp_path):
    lowered = lower(models.N(), (torch.randn(2, 3),))
    data = bc.lowering.to_bytes(lowered)
    manifest = _manifest(data)
    assert manifest["schema_version"] == [1, 2] and "state" not in manifest
    x = torch.randn(2, 3)
    torch.testing.assert_close(bc.load(data)(x), models.N()(x))


def test_state_in_an_archive_of_schema_1_is_refused(tmp_path):
    from test_archive import edit_manifest

    lowered = lower(Accumulator(), (torch.ones(3),))

    def edit(m):
        m["schema_version"] = [1, 4]

    with pytest.raises(bc.ArchiveError, match=r"has state, which schema 1\.4 does not have"):
        bc.load(edit_manifest(bc.lowering.to_bytes(lowered), edit))


@pytest.mark.parametrize(
    "edit, message",
    [
        (lambda m: m.pop("state"), "keeps state 'acc', but the manifest has no state"),
        (lambda m: m["state"][0].update(shape=[4]), "state/0.bin'.*needs 16"),
        (lambda m: m["state"][0].update(fqn="other"), "keeps state 'acc', which state does not store"),
        (lambda m: m["methods"][0]["state"][0].update(input=1), "the state inputs must be inputs 0 to 0"),
    ],
    ids=["no-state", "wrong-shape", "wrong-name", "bad-position"],
)
def test_a_damaged_state_record_is_refused_naming_it(edit, message):
    from test_archive import edit_manifest

    data = bc.lowering.to_bytes(lower(Accumulator(), (torch.ones(3),)))
    with pytest.raises(bc.ArchiveError, match=message):
        bc.load(edit_manifest(data, edit))


# --- on the target: a fresh process that loads the archive ---------------------------------------


@pytest.fixture(scope="module")
def accumulator_archive(tmp_path_factory):
    """An accumulator archive with a call sequence bundled (eager's outputs, in order, from the initial state)."""
    path = tmp_path_factory.mktemp("state") / "acc.bcpt"
    lowered = lower(Accumulator(), (torch.ones(3),))
    lowered(torch.full((3,), 50.0))  # it ran before saving: the archive still holds the initial state
    inputs = [(torch.full((3,), float(i)),) for i in range(1, 5)]
    bc.save(lowered, path, bundled_inputs={"forward": inputs}, eager=Accumulator())
    return path, inputs


def test_a_loaded_archive_runs_its_call_sequence_on_the_target_from_the_initial_state(accumulator_archive):
    from pytest_backendconf.target import run_on_target

    path, inputs = accumulator_archive
    result = run_on_target(path, {"forward": inputs}, plugins=[], timeout=300)
    assert result["ok"], result["error"] or result["errors"]
    eager = Accumulator()
    for got, (x,) in zip(result["outputs"]["forward"], inputs):
        torch.testing.assert_close(got, eager(x))


@pytest.mark.slow  # a device process: seconds
def test_a_replay_through_a_device_leaves_the_process_target_as_it_was(accumulator_archive, capsys):
    """``cli.main`` in a process that goes on: the device of one command is not the target of the next."""
    import shlex
    import sys

    from pytest_backendconf.cli import main
    from pytest_backendconf.target import target_command

    path, _ = accumulator_archive
    assert target_command() is None
    assert main(["replay", str(path), "--target-command", shlex.quote(sys.executable)]) == 0
    assert "target: device" in capsys.readouterr().out
    assert target_command() is None


@pytest.mark.slow
def test_replay_runs_the_bundled_call_sequence_on_the_device(accumulator_archive):
    import shlex
    import subprocess
    import sys

    path, _ = accumulator_archive
    # In its own process, as a user runs it: a replay through a device leaves the process's target
    # settings to the device, which later in-process runs of this worker must not inherit.
    command = [sys.executable, "-m", "pytest_backendconf.cli", "replay", str(path)]
    done = subprocess.run(
        [*command, "--target-command", shlex.quote(sys.executable)], capture_output=True, text=True, timeout=600
    )
    out = done.stdout + done.stderr
    status = done.returncode
    assert status == 0, out
    assert "replay: 4/4 bundles match their expected outputs" in out, out
    assert "target: device" in out


def test_a_copy_of_a_lowered_module_has_its_own_state():
    import copy

    lowered = lower(Accumulator(), (torch.ones(3),))
    lowered(torch.ones(3))
    twin = copy.deepcopy(lowered)
    twin(torch.ones(3))
    torch.testing.assert_close(bc.state(lowered)["acc"], torch.ones(3))
    torch.testing.assert_close(bc.state(twin)["acc"], torch.full((3,), 2.0))


class ReturnsItsState(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.register_buffer("acc", torch.zeros(3))

    def forward(self, x):
        self.acc.add_(x)
        return self.acc


def test_a_returned_state_is_the_callers_copy():
    lowered = lower(ReturnsItsState(), (torch.ones(3),))
    out = lowered(torch.ones(3))
    out.fill_(100.0)  # the caller's tensor: the module's state must not change with it
    torch.testing.assert_close(lowered(torch.ones(3)), torch.full((3,), 2.0))


class _StateWrites(nn.Module):
    """The other forms a state write and a mask export to: copy_, a slice assigned, where with scalars."""

    def __init__(self) -> None:
        super().__init__()
        self.register_buffer("buf", torch.zeros(3))
        self.register_buffer("cache", torch.zeros(2, 3))

    def forward(self, x, mask):
        self.buf.copy_(x)
        self.cache[:, 1] = x[:2]
        mixed = torch.where(mask, x, 0.0) + torch.where(mask, 0.0, x) + torch.where(mask, 1.0, 0.0)
        return mixed + self.cache.sum(0) + self.buf * torch.scalar_tensor(2.0)


def test_the_reference_backend_runs_every_form_of_state_write_as_eager_does():
    from pytest_backendconf.reference import bytecode, ops

    mask = torch.tensor([True, False, True])
    lowered = bc.to_backend(_StateWrites().eval(), "reference", {"forward": {}}, example_inputs=(torch.ones(3), mask))
    eager = _StateWrites().eval()
    for seed in range(3):
        x = torch.randn(3, generator=torch.Generator().manual_seed(seed))
        torch.testing.assert_close(lowered(x, mask), eager(x, mask), rtol=0, atol=0)
    torch.testing.assert_close(bc.state(lowered)["cache"], eager.cache, rtol=0, atol=0)
    used = {
        ins.opcode
        for blob in lowered.lowered.blobs.values()
        for block in bytecode.decode(blob).blocks
        for ins in block.instructions
    }
    names = {op.name for op in ops.OPS if op.opcode in used}
    # tests/test_reference_backend.py's zoo-coverage test counts on this test for these kernels
    assert {"aten.copy.default", "aten.select_scatter.default", "aten.where.ScalarOther"} <= names
    assert {"aten.where.ScalarSelf", "aten.where.Scalar", "aten.scalar_tensor.default"} <= names
