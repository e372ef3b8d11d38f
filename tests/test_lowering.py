"""to_backend on real torch.export programs: parity, structures, errors, handles, availability."""

from __future__ import annotations

import copy
import inspect
import threading
import warnings

import pytest
import torch

import broken_backends
import lowering_models as models
import pytest_backendconf as bc
from pytest_backendconf.debuginfo._handles import DebugHandleRecorder, walk_nodes
from pytest_backendconf.lowering import to_bytes

MODELS_FILE = inspect.getsourcefile(models)
ZOO_FILE = inspect.getsourcefile(models.N)  # the nested trio lives in the zoo


def line_of(text: str, file: str = MODELS_FILE) -> int:
    """The line number of ``text`` in ``file`` (so tests survive edits above it)."""
    lines = open(file).read().splitlines()
    return next(i for i, line in enumerate(lines, 1) if line.strip() == text)


def lower(module, spec=None, inputs=None, **kwargs):
    spec = {"forward": {}} if spec is None else spec
    return bc.to_backend(module, kwargs.pop("backend", "reference"), spec, example_inputs=inputs, **kwargs)


X = torch.randn(2, 3)


# --- parity -------------------------------------------------------------------------


def test_nested_model_matches_eager():
    model = models.N()
    lowered = lower(model, inputs=(X,))
    torch.testing.assert_close(lowered(X), model(X))
    x2 = torch.randn(2, 3)
    torch.testing.assert_close(lowered(x2), model(x2))


def test_small_cnn_matches_eager():
    model = models.SmallCNN().eval()
    x = torch.randn(2, 3, 8, 8)
    lowered = lower(model, inputs=(x,))
    torch.testing.assert_close(lowered(x), model(x))


def test_every_output_structure_and_kwargs_with_defaults():
    model = models.Outputs()
    spec = {"forward": {}, "single": {}, "as_dict": {}, "double": {}}
    inputs = {"forward": (X, X + 1), "single": (X,), "as_dict": (X,), "double": (X,)}
    lowered = lower(model, spec, inputs)
    out = lowered(X, X + 1)
    assert isinstance(out, tuple) and len(out) == 2
    torch.testing.assert_close(out, model(X, X + 1))
    single = lowered.single(X)
    assert isinstance(single, tuple) and len(single) == 1
    torch.testing.assert_close(single, model.single(X))
    as_dict = lowered.as_dict(X)
    assert set(as_dict) == {"scaled", "pair"} and isinstance(as_dict["pair"], tuple)
    torch.testing.assert_close(as_dict, model.as_dict(X))
    torch.testing.assert_close(lowered.as_dict(X, scale=2.0), model.as_dict(X))
    # A method named like an nn.Module method is still the user's method.
    torch.testing.assert_close(lowered.double(X), X * 2)
    assert str(inspect.signature(lowered.as_dict)) == "(x, *, scale=2.0)"


def test_cond_takes_both_branches():
    model = models.Branchy()
    lowered = lower(model, inputs=(torch.ones(3),))
    for x in (torch.ones(3), -torch.ones(3)):
        torch.testing.assert_close(lowered(x), model(x))


def test_in_place_ops_on_intermediates_lower():
    model = models.InPlaceActivation()
    lowered = lower(model, inputs=(X,))
    torch.testing.assert_close(lowered(X), model(X))


def test_to_backend_never_mutates_the_module():
    model = models.SmallCNN().eval()
    before = copy.deepcopy(model.state_dict())
    lower(model, inputs=(torch.randn(1, 3, 8, 8),))
    after = model.state_dict()
    assert before.keys() == after.keys()
    assert all(torch.equal(before[k], after[k]) for k in before)
    assert type(model) is models.SmallCNN and not model.training


# --- bad input: each error names the input and the fix ----------------------------------


@pytest.mark.parametrize(
    "call, message",
    [
        (
            lambda: lower(models.N(), {"fwd": {}}, {"fwd": (X,)}),
            "compile-spec key 'fwd' is not a method of N; its methods: forward",
        ),
        (
            lambda: lower(models.Outputs(), {"forward": {}, "single": {}}, {"forward": (X, X)}),
            "no example inputs for method 'single'",
        ),
        (
            lambda: lower(models.N(), {"forward": {"w": torch.ones(1)}}, (X,)),
            "compile spec of method 'forward' has a value of type Tensor at ['w']",
        ),
        (lambda: lower(models.N(), {"forward": {"w": float("nan")}}, (X,)), "has a value of type float at ['w']"),
        (lambda: lower(models.N(), {"forward": {1: 2}}, (X,)), "has key 1 at top level; keys must be strings"),
        (lambda: lower(models.N(), {}, (X,)), "the method compile spec must be a non-empty dict"),
        (
            lambda: lower(models.N(), {"forward": []}, (X,)),
            "the compile spec of method 'forward' must be a dict of options, got list",
        ),
        (
            lambda: lower(models.N(), inputs={"forward": X}),
            "example inputs of method 'forward' must be a tuple, got Tensor; write (x,)",
        ),
        (lambda: lower(models.N(), inputs=(X, X)), "example inputs do not fit method 'forward'"),
        (
            lambda: lower(lambda x: x, inputs=(X,)),
            "to_backend() needs a torch.nn.Module or a torch.export.ExportedProgram, got function",
        ),
        (
            lambda: lower(models.SmallCNN().train(), inputs=(torch.randn(2, 3, 8, 8),)),
            "mutates state (node 'add_' (aten::add_ on 'b_bn_num_batches_tracked', in place)) with training-mode "
            "op node 'batch_norm' (aten::batch_norm, training=True) in the graph. Is the module in training mode? "
            "Call .eval() before lowering.",
        ),
    ],
)
def test_bad_arguments_raise_lowering_error_naming_the_fix(call, message):
    with pytest.raises(bc.LoweringError) as info:
        call()
    assert message in str(info.value)


def test_export_failure_carries_torchs_message():
    class DataDependent(torch.nn.Module):
        def forward(self, x):
            if x.sum() > 0:  # Python control flow on a tensor value cannot be exported
                return x + 1
            return x - 1

    with pytest.raises(bc.LoweringError, match=r"torch.export could not export method 'forward' of DataDependent: \w+"):
        lower(DataDependent(), inputs=(X,))


def test_inputs_differing_from_the_export_are_named():
    lowered = lower(models.Outputs(), {"forward": {}, "as_dict": {}}, {"forward": (X, X), "as_dict": (X,)})
    with pytest.raises(
        bc.InputSpecError,
        match=r"method 'forward' input 1 \('y'\) must be a float32\[2, 3\] tensor as when it was exported, got a float32\[4\] tensor",
    ):
        lowered(X, torch.ones(4))
    with pytest.raises(bc.InputSpecError, match=r"lowered with scale=2.0 .* called with scale=3.0"):
        lowered.as_dict(X, scale=3.0)
    with pytest.raises(bc.InputSpecError, match=r"method 'forward': missing a required argument: 'y'"):
        lowered(X)


# --- the pinned texts --------------------------------------------------------------------


def test_unsupported_node_text_shows_file_line_and_carets():
    with pytest.raises(bc.UnsupportedNodeError) as info:
        lower(models.Unsupported(), inputs=(X,))
    text = str(info.value)
    line = line_of("return torch.logit(h) + 1")
    assert text.startswith(
        "The node of aten::logit is not supported in this compiler. Source code:\n"
        f'  File "{MODELS_FILE}", line {line}, in forward\n'
        "    return torch.logit(h) + 1\n"
        "           ~~~~~~~~~~~~~~ <--- HERE\n"
    )
    assert "  Module hierarchy:top(Unsupported)::forward.aten::logit" in text
    assert info.value.node.name == "logit"


def test_runtime_error_is_symbolicated_with_hierarchy_and_frames():
    spec = {"forward": {"__backendconf_fault__": {"node": "mul"}}}
    lowered = lower(models.N(), spec, (X,))
    with pytest.raises(bc.BackendRuntimeError) as info:
        lowered(X)
    text = str(info.value)
    expected = (
        "injected fault at node 'mul' (aten::mul)\n"
        "  Module hierarchy:top(N)::forward.m(M)::forward.l(L)::forward.aten::mul\n"
        "Traceback of model source (most recent call last):\n"
        f'  File "{ZOO_FILE}", line {line_of("return self.m(x) + 3", ZOO_FILE)}, in forward\n'
        "    return self.m(x) + 3\n"
        "           ~~~~~~~~~ <--- HERE\n"
        f'  File "{ZOO_FILE}", line {line_of("return self.l(x) - 2", ZOO_FILE)}, in forward\n'
        "    return self.l(x) - 2\n"
        "           ~~~~~~~~~ <--- HERE\n"
        f'  File "{ZOO_FILE}", line {line_of("return x * 5", ZOO_FILE)}, in forward\n'
        "    return x * 5\n"
        "           ~~~~~ <--- HERE\n"
    )
    assert text.startswith(expected)
    assert info.value.debug_handle in bc.debug_info(lowered)


def test_fault_inside_a_cond_branch_keeps_the_users_cond_frame():
    lowered = lower(models.Branchy(), {"forward": {"__backendconf_fault__": {"node": "sin"}}}, (torch.ones(3),))
    with pytest.raises(bc.BackendRuntimeError) as info:
        lowered(torch.ones(3))
    text = str(info.value)
    assert "Module hierarchy:top(Branchy)::forward.aten::sin" in text
    assert "return torch.cond(x.sum() > 0, positive, negative, (x,))" in text
    assert "<eval_with_key>" not in text


def test_an_unknown_handle_gives_the_pinned_not_found_text():
    lowered = lower(models.N(), inputs=(X,), backend=broken_backends.UnknownHandle())
    with pytest.raises(bc.BackendRuntimeError) as info:
        lowered(X)
    assert str(info.value) == "kernel trap\nDebug info for handle(s): debug_handles:{-1}, was not found."


# --- debug handles ------------------------------------------------------------------------


def test_debug_info_covers_every_node_including_cond_branches():
    model = models.Branchy()
    lowered = lower(model, inputs=(torch.ones(3),))
    program = torch.export.export(model, (torch.ones(3),))
    infos = bc.debug_info(lowered)
    assert len(infos) == len(list(walk_nodes(program.graph_module)))
    sin = next(i for i in infos.values() if i.op == "aten::sin")
    assert sin.method == "forward" and sin.node == "sin"
    assert sin.file == MODELS_FILE and sin.line == line_of("return torch.cond(x.sum() > 0, positive, negative, (x,))")
    mul = next(i for i in bc.debug_info(lower(models.N(), inputs=(X,))).values() if i.op == "aten::mul")
    assert (mul.line, mul.col, mul.end_col) == (line_of("return x * 5", ZOO_FILE), 15, 20)
    assert mul.module_hierarchy == (("top", "N"), ("m", "M"), ("l", "L"))


def test_a_non_forward_method_shows_its_own_name():
    lowered = lower(models.Outputs(), {"double": {}}, {"double": (X,)})
    info = next(i for i in bc.debug_info(lowered).values() if i.op == "aten::mul")
    assert info.frames[-1].name == "double" and info.method == "double"
    assert info.hierarchy_text() == "top(Outputs)::double.aten::mul"


def test_lowerings_from_eight_threads_each_number_their_nodes_from_zero_and_agree_byte_for_byte():
    results, errors = [], []

    def work():
        try:
            lowered = lower(models.N(), inputs=(X,))
            results.append((sorted(bc.debug_info(lowered)), to_bytes(lowered)))
        except Exception as exc:  # surfaced below: a thread's failure must fail the test
            errors.append(exc)

    threads = [threading.Thread(target=work) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    assert len(results) == 8
    nodes = len(list(walk_nodes(torch.export.export(models.N(), (X,)).graph_module)))
    # Handles depend on the program only, not on what the process lowered before or beside it.
    assert all(r == results[0] for r in results)
    assert results[0][0] == list(range(nodes))


def test_the_methods_of_one_lowering_share_its_numbering_and_never_a_handle():
    spec = {"forward": {}, "single": {}, "double": {}}
    lowered = lower(models.Outputs(), spec, {"forward": (X, X), "single": (X,), "double": (X,)})
    infos = bc.debug_info(lowered)
    by_method = {m: sorted(h for h, i in infos.items() if i.method == m) for m in spec}
    assert sorted(infos) == list(range(len(infos)))  # one numbering, every handle once
    # In the compile spec's order, each method's block after the one before.
    assert by_method["forward"][-1] + 1 == by_method["single"][0]
    assert by_method["single"][-1] + 1 == by_method["double"][0]
    again = lower(models.Outputs(), spec, {"forward": (X, X), "single": (X,), "double": (X,)})
    assert to_bytes(again) == to_bytes(lowered)


def test_a_lowering_has_the_same_handles_and_blobs_whatever_was_lowered_before():
    alone = lower(models.N(), inputs=(X,))
    for _ in range(3):
        lower(models.Outputs(), {"forward": {}}, (X, X))  # other lowerings in between
    after_others = lower(models.N(), inputs=(X,))
    assert bc.debug_info(after_others).keys() == bc.debug_info(alone).keys()
    assert to_bytes(after_others) == to_bytes(alone)


def test_the_recorder_issues_disjoint_blocks_to_concurrent_threads():
    recorder = DebugHandleRecorder()
    blocks: list[range] = []

    def work():
        for _ in range(500):
            blocks.append(recorder.reserve(3))

    threads = [threading.Thread(target=work) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    handles = [h for block in blocks for h in block]
    assert len(handles) == len(set(handles)) == 8 * 500 * 3
    assert sorted(handles) == list(range(8 * 500 * 3))


def test_the_recorder_is_monotonic_and_checks_int64_overflow():
    recorder = DebugHandleRecorder(first=2**63 - 4)
    first = recorder.reserve(2)
    second = recorder.reserve(1)
    assert first.stop <= second.start
    with pytest.raises(OverflowError, match="debug handles exhausted"):
        recorder.reserve(2)
    assert recorder.reserve(1) == range(2**63 - 1, 2**63)


# --- availability (§3.4) ----------------------------------------------------------------------


def test_unavailable_backend_warns_at_lowering_then_errors_at_call():
    backend = broken_backends.Unavailable()
    with pytest.warns(bc.BackendUnavailableWarning) as caught:
        lowered = lower(models.N(), inputs=(X,), backend=backend)
    assert (
        "Backend [unavailable] is not available. Execution of this Module is still possible by "
        "saving and loading on a device where the backend is available."
    ) in str(caught[0].message)
    with pytest.raises(bc.BackendUnavailableError) as info:
        lowered(X)
    assert str(info.value).startswith("Backend is not available. Backend 'unavailable' reports")
    assert "no device in this test" in str(info.value)
    assert backend.compiled == 0 and backend.executed == 0


def test_available_backend_compiles_once_at_lowering_without_warning():
    class Counting(broken_backends.ReferenceBackend):
        compiled = 0

        def compile(self, processed, spec):
            Counting.compiled += 1
            return super().compile(processed, spec)

    with warnings.catch_warnings():
        warnings.simplefilter("error", bc.BackendUnavailableWarning)
        lowered = lower(models.N(), inputs=(X,), backend=Counting())
    lowered(X)
    lowered(X)
    assert Counting.compiled == 1


@pytest.mark.parametrize(
    "backend, error, message",
    [
        (
            broken_backends.CompileFailsWhileAvailable(),
            bc.BackendContractError,
            "reports is_available() == True, but compile() failed at lowering: RuntimeError: device driver refused the blob",
        ),
        (
            broken_backends.PreprocessReturnsStr(),
            bc.BackendContractError,
            "preprocess() of backend 'preprocess_str' returned str for method 'forward'; it must return bytes",
        ),
    ],
)
def test_contract_violations_at_lowering(backend, error, message):
    with pytest.raises(error) as info:
        lower(models.N(), inputs=(X,), backend=backend)
    assert message in str(info.value)


def test_missing_handle_from_compile_is_a_contract_error():
    with pytest.raises(
        bc.BackendContractError,
        match=r"must return a dict with a handle for every method; got dict without \['single'\]",
    ):
        lower(
            models.Outputs(),
            {"forward": {}, "single": {}},
            {"forward": (X, X), "single": (X,)},
            backend=broken_backends.MissingHandle(),
        )


@pytest.mark.parametrize(
    "backend, message",
    [
        (
            broken_backends.WrongOutputDtype(),
            "method 'forward' output 0: expected a float32[2, 3] tensor, got a float64[2, 3] tensor from backend 'wrong_dtype'",
        ),
        (
            broken_backends.WrongOutputCount(),
            "method 'forward': execute() of backend 'wrong_count' must return a list of 2 outputs, got 1 output",
        ),
    ],
)
def test_outputs_are_checked_against_the_program(backend, message):
    lowered = lower(models.Outputs(), inputs=(X, X), backend=backend)
    with pytest.raises(bc.OutputSpecError) as info:
        lowered(X, X)
    assert message in str(info.value)


# --- API misuse: a clear error naming the input, never an internal traceback ----------


class _Double(torch.nn.Module):
    def forward(self, x):
        return x * 2


def test_example_kwargs_that_is_not_a_dict_is_named():
    with pytest.raises(
        bc.LoweringError, match=r"example_kwargs must be a dict \{method_name: \{argument: value\}\}, got list"
    ):
        bc.to_backend(_Double(), "reference", {"forward": {}}, example_inputs=(torch.ones(2),), example_kwargs=[1])


def test_a_compile_spec_that_contains_itself_is_named():
    options: dict = {"a": 1}
    options["self"] = options
    with pytest.raises(bc.LoweringError, match=r"compile spec of method 'forward' contains itself at \['self'\]"):
        bc.to_backend(_Double(), "reference", {"forward": options}, example_inputs=(torch.ones(2),))
    deep: dict = {}
    for _ in range(100):
        deep = {"d": deep}
    with pytest.raises(bc.LoweringError, match=r"nests deeper than 32 levels"):
        bc.to_backend(_Double(), "reference", {"forward": deep}, example_inputs=(torch.ones(2),))


def test_a_compile_spec_integer_beyond_64_bits_is_named():
    with pytest.raises(
        bc.LoweringError, match=r"compile spec of method 'forward' has an integer of 16610 bits at \['n'\]"
    ):
        bc.to_backend(_Double(), "reference", {"forward": {"n": 10**5000}}, example_inputs=(torch.ones(2),))


def test_unsupported_node_error_of_a_non_node_still_has_a_text():
    text = str(bc.UnsupportedNodeError(object(), "no such op"))
    assert text.startswith("UnsupportedNodeError was raised with object <object object at")
    assert "not a torch.fx.Node (no such op); pass the node of the program given to preprocess()" in text


def test_exceptions_from_is_available_and_preprocess_name_the_backend():
    from backendconf_reference import ReferenceBackend

    class Flaky(ReferenceBackend):
        name = "flaky"

        def is_available(self):
            raise OSError("driver not loaded")

    with pytest.raises(
        bc.BackendContractError, match=r"is_available\(\) of backend 'flaky' raised OSError: driver not loaded"
    ):
        bc.to_backend(_Double(), Flaky(), {"forward": {}}, example_inputs=(torch.ones(2),))

    class Crashy(ReferenceBackend):
        name = "crashy"

        def preprocess(self, program, compile_spec, debug_handles):
            raise KeyError("register file")

    with pytest.raises(
        bc.LoweringError,
        match=r"preprocess\(\) of backend 'crashy' failed for method 'forward': KeyError: 'register file'",
    ) as caught:
        bc.to_backend(_Double(), Crashy(), {"forward": {}}, example_inputs=(torch.ones(2),))
    assert isinstance(caught.value.__cause__, KeyError)
