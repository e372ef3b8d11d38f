"""The stateful category: the reference backend passes it, and each broken backend fails the checks that name its defect.

The runs select one model (the Llama-like decoder, or the accumulator) so that each lowers once or twice;
the whole category against the reference backend runs in `make suite`. The harness itself (ties, the state's
findings) is tested on tensors, with no lowering at all.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

import broken_backends_stateful
from suite_runs import failed_ids, run_with
from pytest_backendconf.conformance.stateful._generation import (
    Call,
    StepRecord,
    judge_outputs,
    judge_tokens,
)
from pytest_backendconf.conformance.stateful._state import describe
from pytest_backendconf.numerics import Tolerance


def run_suite(pytester, cls: str | None, select: list[str]):
    return run_with(pytester, broken_backends_stateful, cls, select)


LLAMA_ID = "backendconf::stateful::llama_decoder"
LLAMA = f"{LLAMA_ID}.*[[]float32*"


@pytest.mark.slow
def test_the_reference_backend_passes_the_decoders_checks(pytester):
    result = run_suite(pytester, None, [LLAMA])
    # greedy and outputs, whole and partitioned; isolation, reset, reload, past_cache, threads
    result.assert_outcomes(passed=9)


@pytest.mark.slow
def test_a_state_never_written_back_is_named(pytester):
    # The Llama-like decoder's greedy tokens survive it (its argmax hardly depends on the past); the
    # sliding window's do not: both checks are shown failing.
    select = [f"{LLAMA_ID}.outputs[[]float32-whole]", "backendconf::stateful::sliding_window.greedy[[]float32-whole]"]
    result = run_suite(pytester, "StateNeverWrittenBack", select)
    result.assert_outcomes(failed=2)
    result.stdout.fnmatch_lines(
        [
            "*llama_decoder in float32, lowered whole: the outputs first differ from eager PyTorch at step 1 "
            "(forward at position 1)*",
            "*The lowered module's state after step 0 (forward at position 0): state 'blocks.0.attention.k_cache' "
            "still holds its value from before the call, where eager's changed: the state was never written back*",
            "*sliding_window in float32, lowered whole: greedy generation departs from eager PyTorch at step * the "
            "backend's greedy token is *, eager's * (eager's logits: * a tie allows a gap of *",
            "*the state was never written back*",
        ]
    )


@pytest.mark.slow
def test_a_cache_written_one_position_off_is_named(pytester):
    result = run_suite(pytester, "CacheOneOff", [LLAMA])
    assert "backendconf::stateful::llama_decoder.outputs[float32-whole]" in failed_ids(result)
    result.stdout.fnmatch_lines(
        [
            "*The lowered module's state after step 0 (forward at position 0): the call wrote index 1 of state "
            "'blocks.0.attention.k_cache' along dimension 2, where eager wrote index 0: the cache was written "
            "one position off (+1)*",
            "*Diverges first at node 'index_copy*",
        ]
    )


@pytest.mark.slow
def test_state_shared_between_instances_is_named(pytester):
    accumulator = "backendconf::stateful::streaming_accumulator.*"
    result = run_suite(pytester, "SharesStateBetweenInstances", [LLAMA, accumulator])
    # One instance alone is right (the first lowering's generation); every later instance of the same
    # program continues from the device's copy. A decoder masks the cache past its position, so its reset
    # and a later generation from position 0 hide a stale cache; the accumulator's running sum does not.
    assert failed_ids(result) == {
        "backendconf::stateful::llama_decoder.isolation[float32]",
        "backendconf::stateful::llama_decoder.reload[float32]",
        # the partitioned lowering's one partition is the whole program: the same blob, the same device copy
        "backendconf::stateful::streaming_accumulator.outputs[float32-supported]",
        "backendconf::stateful::streaming_accumulator.isolation[float32]",
        "backendconf::stateful::streaming_accumulator.reset[float32]",
        "backendconf::stateful::streaming_accumulator.reload[float32]",
        "backendconf::stateful::streaming_accumulator.threads[float32]",
    }
    result.stdout.fnmatch_lines(
        [
            "*llama_decoder in float32: two instances lowered apart, called in turn (each with its own prompt), the "
            "* instance: the outputs first differ from eager PyTorch at step *",
            "*Each lowered instance must keep its own state*One instance alone generates as eager (the outputs "
            "check), so the instances share state.",
            "*streaming_accumulator in float32: after 4 calls and reset(), compared with a fresh eager model: the "
            "outputs first differ from eager PyTorch at step 0*",
            "*reset() must return the state to its initial value; the backend must keep no state of its own*",
        ]
    )


@pytest.mark.slow
def test_a_position_past_the_cache_that_gives_an_answer_is_named(pytester):
    result = run_suite(pytester, "ClampsPastTheCache", [LLAMA])
    assert failed_ids(result) == {"backendconf::stateful::llama_decoder.past_cache[float32]"}
    result.stdout.fnmatch_lines(
        [
            "*llama_decoder in float32: at position 16, past the cache of 16 positions, the lowered module returned "
            "a [[]1, 64] tensor where eager PyTorch raises IndexError: *",
        ]
    )


# --- threads: the lowered module serializes calls; without that the check fails --------------------------


@pytest.fixture
def stateful_backends(backends_of):
    """The broken backends of this file, as a conftest's would be, for load() to find."""
    return backends_of(broken_backends_stateful)


def test_calls_that_do_not_take_turns_fail_the_threads_check(monkeypatch, stateful_backends):
    """Two threads on one instance of a slow backend: with the lowering's lock gone, their state updates race."""
    from backendconf_reference import ReferenceBackend

    from pytest_backendconf.checks import CheckFailed
    from pytest_backendconf.conformance import stateful
    from pytest_backendconf.lowering import LoweredModule

    ctx = _context(broken_backends_stateful.SlowDevice())
    original = LoweredModule.__init__

    def without_turns(self, *args, **kwargs):
        original(self, *args, **kwargs)
        self._state_lock = _NoLock()

    monkeypatch.setattr(LoweredModule, "__init__", without_turns)
    with pytest.raises(
        CheckFailed, match=r"(?s)2 threads making the same calls on one lowered instance.*must take turns"
    ):
        stateful.check_threads(ctx, model_name="streaming_accumulator", dtype="float32", lowering="whole")
    monkeypatch.undo()
    # The same check, calls taking turns: it passes (the reference backend, and the slow one).
    for backend in (ReferenceBackend(), broken_backends_stateful.SlowDevice()):
        found = stateful.check_threads(
            _context(backend), model_name="streaming_accumulator", dtype="float32", lowering="whole"
        )
        assert found["stateful"]["calls"] == 16


class _NoLock:
    """A lock that never waits: calls run at once, as a lowered module without serialization would."""

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


def _context(backend):
    import tempfile

    from pytest_backendconf.registry import RegisteredBackend, Source
    from pytest_backendconf.suite import SuiteContext

    return SuiteContext(
        RegisteredBackend(backend, Source("a test")), [], tmp_dir=lambda name: Path(tempfile.mkdtemp(prefix=name))
    )


# --- the harness on tensors ---------------------------------------------------------------------------


def _record(index: int, eager: list[float], actual: list[float], *, chooses: bool = True) -> StepRecord:
    call = Call("forward", (), position=index, chooses=chooses)
    return StepRecord(index, call, torch.tensor([eager]), actual=torch.tensor([actual]))


def test_a_greedy_token_within_the_tolerance_of_eagers_is_a_tie():
    tol = Tolerance(1e-3, 1e-5)
    tie = _record(0, [1.0, 0.9995, 0.2], [0.999, 1.0, 0.2])  # eager prefers 0, by less than the tolerance
    verdict = judge_tokens([tie], tol, 2.0)
    assert verdict.passed and verdict.ties == (0,)


def test_a_greedy_token_further_from_eagers_fails_naming_the_gap():
    tol = Tolerance(1e-3, 1e-5)
    records = [_record(0, [1.0, 0.0], [1.0, 0.0]), _record(1, [1.0, 0.5, 0.2], [0.4, 0.6, 0.2])]
    verdict = judge_tokens(records, tol, 2.0)
    assert verdict.failing is records[1]
    best, theirs, allowed = verdict.gap
    assert (best, theirs) == (1.0, 0.5) and allowed == pytest.approx(2 * (1e-5 + 1e-3))


def test_a_prompt_call_chooses_no_token():
    verdict = judge_tokens([_record(0, [1.0, 0.0], [0.0, 1.0], chooses=False)], Tolerance(0, 0), 2.0)
    assert verdict.passed


def test_outputs_are_judged_call_by_call_and_the_first_failing_is_named():
    tol = Tolerance(1e-6, 1e-6)
    records = [_record(0, [1.0, 2.0], [1.0, 2.0]), _record(1, [1.0, 2.0], [1.0, 2.5]), _record(2, [0.0], [9.0])]
    verdict = judge_outputs(records, tol, 2.0)
    assert verdict.failing is records[1]
    assert "max abs error 0.5" in verdict.results[0].text()


def _low_precision_record(actual: list[float]) -> StepRecord:
    """A bfloat16 call whose eager logits are one rounding (0.0078) off the float64 model at 1.5."""
    truth = torch.tensor([[0.0003, 0.5, 1.5]], dtype=torch.float64).to(torch.bfloat16)  # cast back, as the session does
    eager = torch.tensor([[0.0003, 0.5, 1.5078125]]).to(torch.bfloat16)
    call = Call("forward", (), position=3, chooses=True)
    return StepRecord(3, call, eager, actual=torch.tensor([actual]).to(torch.bfloat16), truth=truth)


def test_a_carried_rounding_on_a_near_zero_logit_passes_when_no_larger_than_eagers_error():
    # Element by element the backend's 0.004 on a logit of 0.0003 is far outside bfloat16's tolerance,
    # but it is half of eager's own largest error: a state carries roundings from call to call.
    tol = Tolerance(0.016, 1e-5)
    assert judge_outputs([_low_precision_record([0.0043, 0.5, 1.5])], tol, 2.0).passed
    # Three times eager's largest error is no rounding: it fails, naming the element.
    verdict = judge_outputs([_low_precision_record([0.05, 0.5, 1.5])], tol, 2.0)
    assert not verdict.passed and "at index [0, 0]" in verdict.results[0].text()


def test_a_call_that_raised_is_named_by_the_outputs_verdict():
    record = _record(0, [1.0], [1.0])
    record.actual, record.error = None, RuntimeError("device lost")
    verdict = judge_outputs([record], Tolerance(0, 0), 2.0)
    assert verdict.failing is record and verdict.broken == "it raised RuntimeError: device lost"


def test_the_state_findings_name_each_defect():
    before = torch.zeros(1, 2, 6, 4)
    eager = before.clone()
    eager[:, :, 3] = 1.0
    assert describe("k", before, before.clone(), before, eager).endswith(
        "the state was never written back (execute must return each state's new value, first among its outputs; "
        'docs/backend-contract.md, "State")'
    )
    shifted = before.clone()
    shifted[:, :, 4] = 1.0
    assert (
        "wrote index 4 of state 'k' along dimension 2, where eager wrote index 3: the cache was written one "
        "position off (+1)" in describe("k", before, shifted, before, eager)
    )
    other = eager.clone()
    other[0, 0, 3, 0] = 5.0
    assert (
        describe("k", before, other, before, eager)
        == "state 'k' differs from eager's (max abs error 4 at index [0, 0, 3, 0])"
    )
    assert describe("k", before, eager.clone(), before, eager) == ""


# --- the real LLM: transformers' export recipe ----------------------------------------------------------


@pytest.mark.slow
def test_transformers_tiny_llama_lowers_as_a_program_and_generates_as_eager(tmp_path):
    """The recipe's own exported program (keyword inputs, a static cache in buffers), lowered whole and in
    partitions: 12 greedy tokens after a prompt of 4 are eager's, and every step's logits pass the verdict."""
    pytest.importorskip("transformers", reason="the [llm] extra (transformers==5.23.0)")
    from backendconf_reference import ReferenceBackend

    from pytest_backendconf.conformance import stateful
    from pytest_backendconf.registry import RegisteredBackend, Source
    from pytest_backendconf.suite import SuiteContext, SuiteOptions

    ctx = SuiteContext(
        RegisteredBackend(ReferenceBackend(), Source("a test")),
        [],
        tmp_dir=lambda name: tmp_path,
        options=SuiteOptions(backend="reference", zoo="real"),
    )
    names = {check.name for check in stateful.checks(ctx)}
    assert "tiny_llama_hf.greedy[float32-whole]" in names and "tiny_llama_hf.reload[float32]" in names
    for lowering in ("whole", "supported"):
        found = stateful.check_greedy(ctx, model_name="tiny_llama_hf", dtype="float32", lowering=lowering)
        assert len(found["stateful"]["tokens"]) == 12 and found["stateful"]["ties"] == []
        stateful.check_outputs(ctx, model_name="tiny_llama_hf", dtype="float32", lowering=lowering)
    stateful.check_reload(ctx, model_name="tiny_llama_hf", dtype="float32", lowering="whole")
