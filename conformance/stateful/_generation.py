"""Greedy generation, eager and lowered side by side: the call sequence, its records and their verdicts.

A `Session` drives one model through its calls (a prompt, then one decode
call per generated token; for a stream, seeded inputs), running each call on
eager PyTorch, on the module under test and, in low precision, on the model
in float64 (the numerics verdict's truth). Every call is fed *eager's*
token: where the backend's greedy choice differs, the generation continues
from eager's, so that one near-tie does not make every later step differ.
`judge_tokens` then says whether each of the backend's choices is eager's or
a tie (eager's logits at both tokens within ``tie_multiple`` times the
tolerance, or the token the float64 model chooses), and `judge_outputs` judges
the outputs of every call with the project's numerics verdict.
"""

from __future__ import annotations

import copy
import dataclasses
import math
import functools
import zlib
from typing import Any, Callable

import torch

from pytest_backendconf import _compat
from pytest_backendconf.numerics import Closeness, StructureMismatch, Tolerance, compare_outputs

from . import _models

#: The drivers: how a model is called (the ``driver`` of each ``[[stateful.models]]`` entry).
DRIVERS = ("decoder", "prefill_decode", "stream", "hf_decoder")
#: The classes a ``[[stateful.models]]`` entry may name: nothing read from a file is resolved by getattr.
CLASSES: dict[str, type[torch.nn.Module]] = {
    "LlamaDecoder": _models.LlamaDecoder,
    "SlidingWindowDecoder": _models.SlidingWindowDecoder,
    "PrefillDecode": _models.PrefillDecode,
    "StreamingAccumulator": _models.StreamingAccumulator,
}


@dataclasses.dataclass(frozen=True)
class StatefulModel:
    """One model of the category and how it is driven (``[[stateful.models]]`` in ``suite.toml``)."""

    name: str
    build: Callable[[], torch.nn.Module]
    driver: str
    steps: int
    dtypes: tuple[str, ...]
    prompt: int = 0
    cache: int | None = None
    #: What eager does at a position past the cache: ``"raises"``, ``"wraps"``, or ``""`` (no positions).
    past_cache: str = ""
    input_shape: tuple[int, ...] = ()
    #: The vocabulary, for prompts (decoders only).
    vocab: int = _models.VOCAB
    #: The largest prompt ``prefill`` takes (its dynamic dimension's maximum).
    max_prompt: int = 8
    description: str = ""
    #: A real model's exported program in a dtype (its own export recipe), lowered as a program; None: the
    #: module's methods are exported by the lowering.
    program: Callable[[str], Any] | None = None

    @property
    def keywords(self) -> bool:
        """Whether calls pass keywords (``input_ids=``, ``cache_position=``: transformers' export recipe)."""
        return self.driver == "hf_decoder"

    @property
    def methods(self) -> tuple[str, ...]:
        return ("prefill", "decode_one") if self.driver == "prefill_decode" else ("forward",)

    @property
    def tokens(self) -> bool:
        """Whether the model's outputs are logits chosen from (the greedy check applies)."""
        return self.driver != "stream"

    def module(self, dtype: str) -> torch.nn.Module:
        """A fresh eager model in ``dtype`` (its initial state), the same weights every call."""
        return self.build().to(getattr(torch, dtype)).eval()

    def example_inputs(self, dtype: str) -> dict[str, tuple]:
        """What each method is exported with."""
        if self.driver == "stream":
            return {"forward": (torch.zeros(self.input_shape, dtype=getattr(torch, dtype)),)}
        one = (torch.zeros(1, 1, dtype=torch.int64), torch.zeros(1, dtype=torch.int64))
        if self.driver == "prefill_decode":
            return {"prefill": (torch.zeros(1, self.prompt, dtype=torch.int64),), "decode_one": one}
        return {"forward": one}

    def dynamic_shapes(self) -> dict[str, Any] | None:
        """``prefill``'s prompt length varies from 2 to `max_prompt` tokens; nothing else does."""
        if self.driver != "prefill_decode":
            return None
        prompt = torch.export.Dim("prompt", min=2, max=self.max_prompt)
        return {"prefill": ({1: prompt},), "decode_one": None}

    def prompt_tokens(self, seed: int, length: int | None = None) -> list[int]:
        generator = torch.Generator().manual_seed(zlib.crc32(f"{self.name}/{seed}".encode()))
        return torch.randint(0, self.vocab, (length or self.prompt,), generator=generator).tolist()


@dataclasses.dataclass(frozen=True)
class Call:
    """One call of the sequence: ``method(*args)``; ``position`` the first cache position it writes."""

    method: str
    args: tuple
    position: int | None = None
    #: Whether its greedy token is the generation's next (a decoder's prompt calls but the last choose none).
    chooses: bool = False
    kwargs: dict = dataclasses.field(default_factory=dict)

    def describe(self) -> str:
        if self.method == "prefill":
            return f"prefill of {self.args[0].shape[1]} tokens (positions 0-{self.args[0].shape[1] - 1})"
        if self.position is not None:
            return f"{self.method} at position {self.position}"
        return self.method


@dataclasses.dataclass
class StepRecord:
    """One call's outputs: eager's, the module under test's (or the exception it raised), and the truth's."""

    index: int
    call: Call
    eager: Any
    actual: Any = None
    #: What eager PyTorch raised for this call (past the end of a static cache).
    eager_error: BaseException | None = None
    error: BaseException | None = None
    truth: torch.Tensor | None = None

    @property
    def eager_token(self) -> int:
        return int(self.eager.reshape(-1).argmax())

    @property
    def actual_token(self) -> int | None:
        if not isinstance(self.actual, torch.Tensor) or self.actual.shape != self.eager.shape:
            return None
        return int(self.actual.reshape(-1).float().argmax())

    def where(self) -> str:
        return f"step {self.index} ({self.call.describe()})"


class Calls:
    """The call sequence of one generation: the next call, given eager's outputs of the previous one."""

    def __init__(
        self,
        model: StatefulModel,
        dtype: str,
        seed: int,
        *,
        prompt: int | None = None,
        last_position: int | None = None,
    ):
        self.model = model
        self.dtype_name = dtype
        self.dtype = getattr(torch, dtype)
        self.seed = seed
        self.prompt = model.prompt_tokens(seed, prompt) if model.tokens else []
        #: ``last_position``: go on until a call at that cache position (the past-the-cache check).
        self.total = self._count() if last_position is None else self._until(last_position)
        self.made = 0
        self._generator = torch.Generator().manual_seed(zlib.crc32(f"{model.name}/inputs/{seed}".encode()))

    def _count(self) -> int:
        if self.model.driver in ("decoder", "hf_decoder"):
            return len(self.prompt) + self.model.steps - 1  # the last prompt call chooses the first token
        if self.model.driver == "prefill_decode":
            return 1 + self.model.steps - 1
        return self.model.steps

    def _until(self, position: int) -> int:
        if self.model.driver == "prefill_decode":
            return position - len(self.prompt) + 2
        return position + 1

    def next(self, previous: torch.Tensor | None) -> Call | None:
        if self.made >= self.total:
            return None
        index, self.made = self.made, self.made + 1
        driver = self.model.driver
        if driver == "stream":
            x = torch.rand(self.model.input_shape, generator=self._generator) * 2.0 - 1.0
            return Call("forward", (x.to(self.dtype),))
        if driver == "prefill_decode" and index == 0:
            return Call("prefill", (torch.tensor([self.prompt]),), position=0, chooses=True)
        if driver == "prefill_decode":
            position = len(self.prompt) + index - 1
        else:
            position = index
        if index < len(self.prompt) and driver in ("decoder", "hf_decoder"):
            token = self.prompt[index]
        else:
            assert previous is not None
            token = int(previous.reshape(-1).argmax())  # eager's greedy choice
        chooses = driver == "prefill_decode" or index >= len(self.prompt) - 1
        token_ids, positions = torch.tensor([[token]]), torch.tensor([position])
        if driver == "hf_decoder":
            return Call("forward", (), position, chooses, kwargs={"input_ids": token_ids, "cache_position": positions})
        method = "forward" if driver == "decoder" else "decode_one"
        return Call(method, (token_ids, positions), position, chooses)


def _clone(value: Any) -> Any:
    return _compat.tree_map(lambda v: v.clone() if isinstance(v, torch.Tensor) else v, value)


class Session:
    """One generation: each `step` makes the next call on eager, on the module under test and on the truth.

    :param run: calls the module under test, ``run(method, *args)``.
    :param truth: the model in float64 (low precision only): each call's reference is its output cast back.
    """

    def __init__(
        self,
        calls: Calls,
        eager: torch.nn.Module,
        run: Callable[..., Any],
        *,
        truth: torch.nn.Module | None = None,
    ) -> None:
        self.calls = calls
        self.eager = eager
        self.run = run
        self.truth = truth
        self.records: list[StepRecord] = []
        #: Compares the lowered module's state with eager's buffers after each call (`_state.StateWatch`).
        self.watch: Any = None

    def step(self) -> StepRecord | None:
        previous = self.records[-1].eager if self.records else None
        call = self.calls.next(previous)
        if call is None:
            return None
        if self.watch is not None:
            self.watch.before()
        eager_error = None
        try:
            with torch.no_grad():
                eager = getattr(self.eager, call.method)(*_clone(call.args), **_clone(call.kwargs))
        except Exception as exc:  # past the end of a static cache: the reference raises
            eager, eager_error = None, exc
        record = StepRecord(len(self.records), call, eager, eager_error=eager_error)
        try:
            record.actual = self.run(call.method, *_clone(call.args), **_clone(call.kwargs))
        except Exception as exc:  # the verdicts name the step that raised
            record.error = exc
        if self.truth is not None and eager_error is None:
            widen = functools.partial(_compat.tree_map, lambda v: v.double() if v.is_floating_point() else v)
            with torch.no_grad():
                wide = getattr(self.truth, call.method)(*widen(call.args), **widen(call.kwargs))
            record.truth = wide.to(eager.dtype)
        if self.watch is not None and eager_error is None:
            self.watch.after(record)
        self.records.append(record)
        return record

    def run_all(self) -> list[StepRecord]:
        while self.step() is not None:
            pass
        return self.records


def truth_module(eager: torch.nn.Module) -> torch.nn.Module | None:
    """The float64 copy of a low-precision eager model (its weights widened, none rounded again); else ``None``."""
    low = next((p.dtype for p in eager.parameters() if p.is_floating_point()), torch.float32)
    if low not in (torch.float16, torch.bfloat16):
        return None
    return copy.deepcopy(eager).to(torch.float64)


# --- verdicts ------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class OutputVerdict:
    """The first call whose outputs the numerics verdict fails (``None``: every call passes)."""

    failing: StepRecord | None
    results: tuple[Closeness, ...] = ()
    #: Why no comparison was possible (the call raised, or returned another structure).
    broken: str = ""
    #: The worst passing comparison, for the report.
    worst: tuple[Closeness, ...] = ()

    @property
    def passed(self) -> bool:
        return self.failing is None


def judge_outputs(records: list[StepRecord], tol: Tolerance, multiple: float) -> OutputVerdict:
    """Every call's outputs against eager's (low precision: the truth, and eager's own error)."""
    worst: tuple[Closeness, ...] = ()
    for record in records:
        if record.error is not None:
            return OutputVerdict(record, broken=f"it raised {type(record.error).__name__}: {record.error}")
        try:
            if record.truth is not None:
                results = compare_outputs(record.actual, record.truth, tol, record.eager, multiple)
            else:
                results = compare_outputs(record.actual, record.eager, tol)
        except StructureMismatch as exc:
            return OutputVerdict(record, broken=str(exc))
        if not all(r.passed or _within_carried_error(r, multiple) for r in results):
            return OutputVerdict(record, tuple(results))
        if not worst or max(r.closeness for r in results) > max(r.closeness for r in worst):
            worst = tuple(results)
    return OutputVerdict(None, worst=worst)


def _within_carried_error(result: Closeness, multiple: float) -> bool:
    """Low precision: the backend's largest error no more than ``multiple`` times eager's largest.

    Element by element, the numerics verdict allows each value an error relative to itself. A state
    carries each call's rounding into the next, so after a few steps two correct implementations
    (eager, and a backend that accumulates in float32) differ at every element by about one rounding
    of the values the logits are made from: where a logit is near zero that is many times its own
    allowance, for eager as for the backend. Past the first such step what is comparable is the size
    of the error over the whole output, so the backend passes when its largest error is no larger
    than ``multiple`` times eager's own (both against the float64 model).
    """
    eager = result.eager
    if eager is None or not math.isfinite(result.max_abs) or not math.isfinite(eager.max_abs):
        return False
    return result.max_abs <= multiple * eager.max_abs


@dataclasses.dataclass(frozen=True)
class TokenVerdict:
    """The first call whose greedy token is neither eager's nor a tie, and the ties accepted before it."""

    failing: StepRecord | None
    ties: tuple[int, ...] = ()
    #: eager's logit at its token and at the backend's, and the gap allowed.
    gap: tuple[float, float, float] | None = None

    @property
    def passed(self) -> bool:
        return self.failing is None


def judge_tokens(records: list[StepRecord], tol: Tolerance, tie_multiple: float) -> TokenVerdict:
    """Each decode call's greedy token (the prompt's own calls choose none) against eager's, tie-aware."""
    ties = []
    for record in records:
        if not record.call.chooses:
            continue
        mine, eager_token = record.actual_token, record.eager_token
        if mine is None:
            return TokenVerdict(record)
        if mine == eager_token:
            continue
        logits = record.eager.reshape(-1).double()
        best, theirs = float(logits[eager_token]), float(logits[mine])
        allowed = tie_multiple * (tol.atol + tol.rtol * abs(best))
        truth_token = int(record.truth.reshape(-1).argmax()) if record.truth is not None else None
        if best - theirs <= allowed or mine == truth_token:
            ties.append(record.index)
            continue
        return TokenVerdict(record, tuple(ties), (best, theirs, allowed))
    return TokenVerdict(None, tuple(ties))
