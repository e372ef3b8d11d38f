"""A backend that keeps the state itself (``Capabilities(keeps_state=True)``): lowered, called, reset, saved.

The backends are tests/keeps_state_backends.py: the eager backend on torch.export's functional form,
keeping each compile() call's state in its handles, and two that break the contract. The stateful
category against them runs through pytester (slow).
"""

from __future__ import annotations

import json
import zipfile

import pytest
import torch

import keeps_state_backends
from suite_runs import failed_ids, run_with
import pytest_backendconf as bc
from keeps_state_backends import KeepsState, KeepsStateAcrossCompiles
from stateful_models import Accumulator, PrefillDecode, TinyDecoder, greedy

TOKEN, POSITION = torch.tensor([[3]]), torch.tensor([0])
INPUTS = [torch.full((3,), float(i + 1)) for i in range(4)]


def lower(module, inputs, backend=None, **kwargs):
    backend = backend or KeepsState()
    return bc.to_backend(module, backend, {"forward": {}}, example_inputs=inputs, **kwargs)


def sums(module):
    return [module(x).clone() for x in INPUTS]


def test_the_backend_gets_torch_exports_form_and_execute_the_callers_values_only():
    seen = []

    class Recording(KeepsState):
        def preprocess(self, program, compile_spec, debug_handles):
            seen.append(program)
            return super().preprocess(program, compile_spec, debug_handles)

        def execute(self, handle, inputs):
            seen.append(len(inputs))
            return super().execute(handle, inputs)

    lowered = lower(Accumulator(), (torch.ones(3),), backend=Recording())
    lowered(torch.ones(3))
    program, given = seen
    kinds = {spec.kind.name for spec in program.graph_signature.output_specs}
    assert kinds == {"BUFFER_MUTATION", "USER_OUTPUT"}
    assert [s.target for s in program.graph_signature.input_specs if s.kind.name == "BUFFER"] == ["acc"]
    assert given == 1  # the caller's x, no state
    spec = lowered.lowered.methods["forward"]
    assert spec.state == () and spec.state_kept_by_backend
    assert lowered.lowered.initial_state == {}


def test_calls_reset_and_instances_behave_as_eager():
    first, second = lower(Accumulator(), (torch.ones(3),)), lower(Accumulator(), (torch.ones(3),))
    expected = sums(Accumulator())
    assert all(torch.equal(a, b) for a, b in zip(sums(first), expected))
    # The second instance starts from the initial state although the first has run.
    assert all(torch.equal(a, b) for a, b in zip(sums(second), expected))
    first.reset()
    assert all(torch.equal(a, b) for a, b in zip(sums(first), expected))


def test_state_cannot_be_read_and_says_why():
    lowered = lower(Accumulator(), (torch.ones(3),))
    with pytest.raises(TypeError, match=r"backend 'keeps_state' keeps it itself \(it declares keeps_state=True\)"):
        bc.state(lowered)


@pytest.fixture
def registered(backends_of):
    return backends_of(keeps_state_backends)


def test_an_archive_starts_from_the_initial_state_and_records_who_keeps_it(tmp_path, registered):
    lowered = lower(Accumulator(), (torch.ones(3),))
    sums(lowered)
    path = tmp_path / "acc.bcarchive"
    bc.save(lowered, path)
    loaded = bc.load(path)
    assert loaded.lowered.methods["forward"].state_kept_by_backend
    assert all(torch.equal(a, b) for a, b in zip(sums(loaded), sums(Accumulator())))
    manifest = json.loads(zipfile.ZipFile(path).read("manifest.json"))
    assert manifest["schema_version"] == [2, 0]  # a reader without state support refuses it
    assert manifest["methods"][0]["state_kept_by_backend"] is True and "state" not in manifest


def test_methods_compiled_together_share_the_state():
    lowered = bc.to_backend(
        PrefillDecode().eval(),
        KeepsState(),
        {"prefill": {}, "decode": {}},
        example_inputs={"prefill": (torch.tensor([[3, 5, 7]]), torch.arange(3)), "decode": (TOKEN, POSITION)},
    )

    def generate(module):
        tokens = [int(module.prefill(torch.tensor([[3, 5, 7]]), torch.arange(3))[0, -1].argmax())]
        for position in range(3, 9):
            tokens.append(int(module.decode(torch.tensor([[tokens[-1]]]), torch.tensor([position]))[0, -1].argmax()))
        return tokens

    assert generate(lowered) == generate(PrefillDecode().eval())


def test_a_decoder_generates_as_eager():
    lowered = lower(TinyDecoder().eval(), (TOKEN, POSITION))
    prompt = torch.tensor([[3]])
    assert greedy(lowered, prompt, 10) == greedy(TinyDecoder().eval(), prompt, 10)


def test_partial_delegation_is_refused_with_the_fix():
    with pytest.raises(
        bc.LoweringError, match=r"Lower these methods whole \(partition=None\), or declare keeps_state=False"
    ):
        lower(Accumulator(), (torch.ones(3),), partition="supported")


def test_a_program_without_state_runs_as_any_other():
    lowered = lower(torch.nn.Linear(3, 2), (torch.ones(3),))
    assert not lowered.lowered.methods["forward"].state_kept_by_backend
    assert bc.state(lowered) == {}


def test_state_kept_across_compiles_is_shared_by_instances():
    # The broken backend's defect, shown directly: the category's isolation check names it (below).
    keeps_state_backends._PROCESS_STATES.clear()
    first, second = (
        lower(Accumulator(), (torch.ones(3),), KeepsStateAcrossCompiles()),
        lower(Accumulator(), (torch.ones(3),), KeepsStateAcrossCompiles()),
    )
    first(torch.ones(3))
    # A fresh instance's first call returns 2 * 1 + 1; this one continues from the first's sum.
    assert torch.equal(second(torch.ones(3)), torch.full((3,), 5.0))


# --- the stateful category against them ---------------------------------------------------

SELECT = ["backendconf::stateful::streaming_accumulator.*", "backendconf::stateful::prefill_decode.*[[]float32*"]


def run_category(pytester, cls):
    return run_with(pytester, keeps_state_backends, cls, SELECT)


@pytest.mark.slow
def test_the_category_passes_a_backend_that_keeps_state_right(pytester):
    result = run_category(pytester, "KeepsState")
    # Every check of the whole lowerings passes; partition="supported" is unsupported with the reason.
    result.assert_outcomes(passed=12, skipped=3)
    result.stdout.fnmatch_lines(["*cannot give a backend that keeps state the part of it that its partitions*"])


@pytest.mark.slow
def test_the_category_names_state_kept_across_compiles(pytester):
    keeps_state_backends._PROCESS_STATES.clear()
    result = run_category(pytester, "KeepsStateAcrossCompiles")
    failed = failed_ids(result)
    assert {
        "backendconf::stateful::streaming_accumulator.isolation[float32]",
        "backendconf::stateful::streaming_accumulator.reset[float32]",
    } <= failed
    result.stdout.fnmatch_lines(
        [
            "*Each lowered instance must keep its own state*",
            "*the backend keeps the state (keeps_state=True), and reset() compiles the blobs again*",
        ]
    )


@pytest.mark.slow
def test_the_category_names_a_state_never_written(pytester):
    result = run_category(pytester, "KeepsStateNeverWritten")
    failed = failed_ids(result)
    assert "backendconf::stateful::streaming_accumulator.outputs[float32-whole]" in failed
    assert "backendconf::stateful::prefill_decode.greedy[float32-whole]" in failed


@pytest.mark.parametrize(
    "value, message",
    [
        ("yes", r"state_kept_by_backend is 'yes', not true or false"),
        (1, r"state_kept_by_backend is 1, not true or false"),
    ],
)
def test_a_bad_state_kept_by_backend_field_is_refused_by_name(registered, value, message):
    from test_archive import edit_manifest

    lowered = lower(Accumulator(), (torch.ones(3),))

    def edit(manifest):
        manifest["methods"][0]["state_kept_by_backend"] = value

    with pytest.raises(bc.ArchiveError, match=message):
        bc.load(edit_manifest(bc.lowering.to_bytes(lowered), edit))


def test_a_method_with_both_kinds_of_state_is_refused(registered):
    from test_archive import edit_manifest

    from pytest_backendconf.archive import StateSpec

    lowered = lower(Accumulator(), (torch.ones(3),))
    spec = StateSpec("acc", "float32", (3,), 0, 0).to_json()

    def edit(manifest):
        manifest["methods"][0]["state"] = [spec]

    with pytest.raises(bc.ArchiveError, match="a method whose backend keeps its state has no state specs of its own"):
        bc.load(edit_manifest(bc.lowering.to_bytes(lowered), edit))
