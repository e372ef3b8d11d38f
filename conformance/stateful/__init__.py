"""stateful: programs that keep state in buffers (a KV cache, a running sum) generate as eager PyTorch does.

Each model of ``[stateful]`` in ``suite.toml`` (conformance/stateful/_models.py;
under ``--backendconf-zoo=real|all`` also transformers' tiny Llama, from the
``[llm]`` extra) is lowered to the backend, its state made explicit by the
lowering (docs/backend-contract.md, "State"), and driven through a call
sequence beside eager PyTorch (`_generation`): a prompt, then greedy decode
steps. The checks, per model:

- ``greedy[<dtype>-<lowering>]``: every greedy token is eager's, or a tie;
- ``outputs[<dtype>-<lowering>]``: every call's logits (outputs) pass the
  numerics verdict; a failure names the first diverging step, what the
  state shows (never written back, written one position off …) and the
  first diverging node;
- ``isolation``: two instances interleaved each generate as eager;
- ``reset``: after ``reset()`` the module generates as a fresh model;
- ``reload``: an archive saved after calls starts from the initial state;
- ``past_cache``: at a position past a static cache the module raises, as
  eager does (a sliding window goes on, as eager does);
- ``threads``: two threads calling one instance get eager's outputs (the
  calls take turns) or a clear refusal, never a corrupted state.

``<lowering>`` is ``whole`` (each method lowered whole) or ``supported``
(``partition="supported"``). A backend that rejects a model is *unsupported*.
"""

from __future__ import annotations

import functools
import threading
import warnings
from typing import Any, Iterator

import torch

import pytest_backendconf as bc
from pytest_backendconf.checks import Check, CheckFailed, Unsupported
from pytest_backendconf.errors import LoweringError, UnsupportedNodeError
from pytest_backendconf.lowering import export_method, lower_programs, to_bytes
from pytest_backendconf.numerics import Tolerance
from pytest_backendconf.suite import SuiteContext

from .._spec import section
from ..parity import tolerance_for
from ._generation import (
    CLASSES,
    DRIVERS,
    Calls,
    OutputVerdict,
    Session,
    StatefulModel,
    StepRecord,
    judge_outputs,
    judge_tokens,
    truth_module,
)
from ._models import build
from ._state import StateWatch

__all__ = ["StatefulModel", "checks", "models"]

CATEGORY = "stateful"
#: The generation checks, run per dtype and lowering.
GENERATION = ("greedy", "outputs")


def models(zoo: str = "synthetic") -> list[StatefulModel]:
    """The category's models from ``suite.toml``, and the real ones under ``--backendconf-zoo=real|all``."""
    found = []
    for entry in section("stateful")["models"]:
        cls = CLASSES[entry["class"]]
        assert entry["driver"] in DRIVERS, f"[[stateful.models]] {entry['name']}: driver {entry['driver']!r}"
        found.append(
            StatefulModel(
                name=entry["name"],
                build=functools.partial(build, cls),
                driver=entry["driver"],
                steps=int(entry["steps"]),
                dtypes=tuple(entry["dtypes"]),
                prompt=int(entry.get("prompt", 0)),
                cache=entry.get("cache"),
                past_cache=entry.get("past_cache", ""),
                input_shape=tuple(entry.get("input_shape", ())),
                description=(cls.__doc__ or "").strip().splitlines()[0],
            )
        )
    if zoo != "synthetic":
        from ..real_models import stateful_real_cases

        found += [StatefulModel(**fields) for fields in stateful_real_cases()]
    return found


#: The notice of a real-model run without transformers.
LLM_NOTICE = (
    "stateful: transformers' tiny Llama is not in this run: install the [llm] extra "
    "(pip install 'pytest-backendconf[llm]', transformers==5.23.0; it leaves torch alone)"
)


def checks(ctx: SuiteContext) -> Iterator[Check]:
    lowerings = section("stateful")["lowerings"]
    if ctx.options.zoo != "synthetic":
        from ..ops import notice
        from ..real_models import transformers_available

        if not transformers_available():
            notice(ctx, LLM_NOTICE)
    for model in models(ctx.options.zoo):
        declared = ctx.capabilities.dtypes
        dtypes = [d for d in model.dtypes if declared is None or getattr(torch, d) in declared]
        if not dtypes:
            continue
        for dtype in dtypes:
            for lowering in lowerings.get(dtype, ["whole"]):
                for what in GENERATION:
                    if what == "greedy" and not model.tokens:
                        continue
                    yield _check(model, f"{what}[{dtype}-{lowering}]", _GENERATION_CHECKS[what], dtype, lowering)
        first = dtypes[0]
        yield _check(model, f"isolation[{first}]", check_isolation, first)
        yield _check(model, f"reset[{first}]", check_reset, first)
        yield _check(model, f"reload[{first}]", check_reload, first, stage="load")
        if model.past_cache:
            yield _check(model, f"past_cache[{first}]", check_past_cache, first)
        yield _check(model, f"threads[{first}]", check_threads, first)


def _check(model: StatefulModel, name: str, run: Any, dtype: str, lowering: str = "whole", *, stage: str = "execute"):
    return Check(
        category=CATEGORY,
        name=f"{model.name}.{name}",
        run=functools.partial(run, model_name=model.name, dtype=dtype, lowering=lowering),
        stage=stage,
        case=model.name,
    )


# --- models, lowerings and generations shared per session -------------------------------------


def _model(ctx: SuiteContext, name: str) -> StatefulModel:
    return next(m for m in models(ctx.options.zoo) if m.name == name)


def _lower(ctx: SuiteContext, model: StatefulModel, dtype: str, lowering: str) -> Any:
    """The session's one lowering of ``model`` in ``dtype`` and its archive's bytes, taken before any call.

    Lowering is the slow part (export, and the lowering making the state explicit), so each (model,
    dtype, lowering) is lowered once: the generation checks run this very module, and every other
    check runs instances loaded from its archive, each with its own state (`_instance`).
    """

    def lower() -> Any:
        try:
            return _lowered(ctx, model, dtype, lowering)
        except Unsupported as exc:
            return exc

    found = ctx.memo(("stateful-lowered", model.name, dtype, lowering), lower)
    if isinstance(found, BaseException):
        raise found
    return found


def _instance(ctx: SuiteContext, model: StatefulModel, dtype: str, lowering: str) -> Any:
    """A fresh instance of the session's lowering (loaded from its archive): the initial state, its own."""
    return bc.load(_lower(ctx, model, dtype, lowering)[1])


def _lowered(ctx: SuiteContext, model: StatefulModel, dtype: str, lowering: str) -> tuple[Any, bytes]:
    partition = "supported" if lowering == "supported" else None
    try:
        if model.program is not None:  # a real model: the program its own export recipe made
            lowered = bc.to_backend(
                _program(ctx, model, dtype, "forward"), ctx.backend, {"forward": {}}, partition=partition
            )
        else:
            # The programs are exported once per dtype and shared by both lowerings (the lowering keeps
            # each program's explicit form too, so the state is made explicit once).
            lowered = lower_programs(
                {m: _program(ctx, model, dtype, m) for m in model.methods},
                ctx.backend,
                {m: {} for m in model.methods},
                module_type=type(model.module(dtype)),
                backend_version=ctx.registered.source.version,
                partition=partition,
            )
    except UnsupportedNodeError as exc:
        raise Unsupported.from_rejection(exc) from exc
    except LoweringError as exc:
        if partition is None:
            raise
        # As in the quantized category: what the partitioner cannot cut (a SymInt between partitions of a
        # dynamic program) is a limit of partial delegation, not of the backend.
        raise Unsupported(f'{model.name} in {dtype}, partition="supported": {exc}') from exc
    if partition is not None:
        records = bc.delegation(lowered)
        if not any(r.delegated for r in records.values()):
            total = sum(r.total for r in records.values())
            raise Unsupported(f"{model.name} in {dtype}: the backend accepts none of its {total} op nodes")
    return lowered, to_bytes(lowered)


def _program(ctx: SuiteContext, model: StatefulModel, dtype: str, method: str) -> Any:
    """The exported program of one method (a real model's: its recipe's own export), once per session."""

    def export() -> Any:
        if model.program is not None:
            return model.program(dtype)
        shapes = (model.dynamic_shapes() or {}).get(method)
        return export_method(
            model.module(dtype), method, model.example_inputs(dtype)[method], {}, dynamic_shapes=shapes
        )

    return ctx.memo(("stateful-program", model.name, dtype, method), export)


def _runner(lowered: Any) -> Any:
    def run(method: str, *args: Any, **kwargs: Any) -> Any:
        return getattr(lowered, method)(*args, **kwargs)

    return run


def _session(model: StatefulModel, dtype: str, lowered: Any, *, seed: int = 0, watch: bool = False, **calls: Any):
    eager = model.module(dtype)
    session = Session(Calls(model, dtype, seed, **calls), eager, _runner(lowered), truth=truth_module(eager))
    if watch and _state_readable(lowered):
        session.watch = StateWatch(eager, lowered)
    return session


def _state_readable(lowered: Any) -> bool:
    """False when the backend keeps the state itself (``keeps_state``): then only the outputs are judged."""
    core = getattr(lowered, "lowered", lowered)
    return not core.state_kept_by_backend


def _generation(ctx: SuiteContext, model_name: str, dtype: str, lowering: str) -> Session:
    """The whole call sequence on one fresh lowering, shared by the greedy and the outputs checks."""

    def run() -> Any:
        model = _model(ctx, model_name)
        try:
            lowered = _lower(ctx, model, dtype, lowering)[0]
        except Unsupported as exc:
            return exc
        session = _session(model, dtype, lowered, watch=True)
        session.run_all()
        return session

    found = ctx.memo(("stateful-generation", model_name, dtype, lowering), run)
    if isinstance(found, BaseException):
        raise found
    return found


def _tolerance(ctx: SuiteContext, model_name: str, dtype: str) -> Tolerance:
    return tolerance_for(ctx, dtype, model_name)


def _multiple() -> float:
    return float(section("stateful")["eager_multiple"])


def _how(lowering: str) -> str:
    return "lowered whole" if lowering == "whole" else 'lowered with partition="supported"'


# --- the checks ------------------------------------------------------------------------------


def check_greedy(ctx: SuiteContext, *, model_name: str, dtype: str, lowering: str) -> dict[str, Any]:
    session = _generation(ctx, model_name, dtype, lowering)
    tol = _tolerance(ctx, model_name, dtype)
    verdict = judge_tokens(session.records, tol, float(section("stateful")["tie_multiple"]))
    chosen = [r for r in session.records if r.call.chooses]
    if verdict.failing is not None:
        record = verdict.failing
        where = f"{model_name} in {dtype}, {_how(lowering)}"
        if record.actual_token is None:
            what = _no_output(record)
        else:
            best, theirs, allowed = verdict.gap or (0.0, 0.0, 0.0)
            what = (
                f"the backend's greedy token is {record.actual_token}, eager's {record.eager_token} (eager's logits: "
                f"{best:.6g} at {record.eager_token}, {theirs:.6g} at {record.actual_token}; a tie allows a gap "
                f"of {allowed:.3g} ({tol}))"
            )
        matched = sum(1 for r in chosen if r.index < record.index)
        raise CheckFailed(
            f"{where}: greedy generation departs from eager PyTorch at {record.where()}: {what}. "
            f"The {matched} tokens before it were eager's.{_diagnosis(ctx, session, record, tol, lowering)}",
            details={"stateful": _trace_json(session, record)},
        )
    return {
        "stateful": {
            "tokens": [r.eager_token for r in chosen],
            "ties": list(verdict.ties),
            "calls": len(session.records),
        }
    }


def check_outputs(ctx: SuiteContext, *, model_name: str, dtype: str, lowering: str) -> dict[str, Any]:
    session = _generation(ctx, model_name, dtype, lowering)
    tol = _tolerance(ctx, model_name, dtype)
    verdict = judge_outputs(session.records, tol, _multiple())
    if not verdict.passed:
        record = verdict.failing
        assert record is not None
        where = f"{model_name} in {dtype}, {_how(lowering)}"
        raise CheckFailed(
            f"{where}: {_outputs_text(verdict, record)}{_diagnosis(ctx, session, record, tol, lowering)}",
            details={"stateful": _trace_json(session, record)},
        )
    from pytest_backendconf.numerics import summary_json

    return {"numerics": summary_json(list(verdict.worst)), "stateful": {"calls": len(session.records)}}


_GENERATION_CHECKS = {"greedy": check_greedy, "outputs": check_outputs}


def _outputs_text(verdict: OutputVerdict, record: StepRecord) -> str:
    if verdict.broken:
        return f"at {record.where()} the lowered module's outputs cannot be compared with eager's: {verdict.broken}"
    against = (
        "the model in float64 (and eager PyTorch in the tested dtype)" if record.truth is not None else "eager PyTorch"
    )
    return (
        f"the outputs first differ from {against} at {record.where()}; the {record.index} calls before it "
        "matched:\n" + "\n".join(r.text() for r in verdict.results if not r.passed)
    )


def _no_output(record: StepRecord) -> str:
    if record.error is not None:
        return f"the lowered module raised {type(record.error).__name__}: {record.error}"
    return f"the lowered module returned {_describe(record.actual)}, eager a {list(record.eager.shape)} tensor"


def _describe(value: Any) -> str:
    if isinstance(value, torch.Tensor):
        return f"a {list(value.shape)} tensor"
    return type(value).__name__


def _diagnosis(ctx: SuiteContext, session: Session, record: StepRecord, tol: Tolerance, lowering: str) -> str:
    """What the state shows at the failing step, and the first diverging node of that call."""
    text = ""
    watch = getattr(session, "watch", None)
    if watch is not None and watch.finding is not None:
        text += f"\n{watch.finding}"
    if record.error is None:
        text += _divergence(ctx, session, record, tol)
    return text


def _divergence(ctx: SuiteContext, session: Session, record: StepRecord, tol: Tolerance) -> str:
    """``Diverges first at node …``: the failing call's program, exported from eager's state before that call."""
    from pytest_backendconf import _compat
    from pytest_backendconf.diagnostics import locate_in_program

    calls = session.calls
    model = calls.model
    if model.program is not None:
        return ""  # a real model's program is its recipe's: no method of the module to export again
    try:
        replay = Session(Calls(model, calls.dtype_name, calls.seed), model.module(calls.dtype_name), lambda *a: None)
        for _ in range(record.index):
            replay.step()
        module = replay.eager
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            program = torch.export.export(
                _Method(module, record.call.method), record.call.args, strict=False
            ).run_decompositions({})
        found = locate_in_program(
            program,
            ctx.backend,
            list(_compat.tree_leaves(record.call.args)),
            top_class=type(module).__name__,
            method=record.call.method,
            tolerance=tol,
        )
    except Exception as exc:  # a diagnosis: never hide the failure behind it
        return f"\n(could not locate the divergence: {type(exc).__name__}: {exc})"
    if found is None:
        return "\n(no single node of that call is out of tolerance on its own)"
    return "\n" + found.text()


class _Method(torch.nn.Module):
    """One method of a model as a module's forward, its buffers (the state as it is now) included."""

    def __init__(self, module: torch.nn.Module, method: str) -> None:
        super().__init__()
        self.module = module
        self.method = method

    def forward(self, *args: Any) -> Any:
        return getattr(self.module, self.method)(*args)


def _trace_json(session: Session, failing: StepRecord) -> dict[str, Any]:
    return {
        "failing_step": failing.index,
        "call": failing.call.describe(),
        "eager_tokens": [r.eager_token for r in session.records if r.call.chooses and r.index <= failing.index],
        "backend_tokens": [r.actual_token for r in session.records if r.call.chooses and r.index <= failing.index],
    }


def _judged(session: Session, ctx: SuiteContext, model_name: str, dtype: str) -> OutputVerdict:
    return judge_outputs(session.records, _tolerance(ctx, model_name, dtype), _multiple())


def _failed_at(verdict: OutputVerdict) -> str:
    record = verdict.failing
    assert record is not None
    return _outputs_text(verdict, record)


def _off_eager(session: Session, ctx: SuiteContext, model_name: str, dtype: str) -> str:
    """Where ``session``'s outputs first leave eager's, as the failure says it; "" when it generated as eager."""
    verdict = _judged(session, ctx, model_name, dtype)
    return "" if verdict.passed else _failed_at(verdict)


def _fresh_run(ctx: SuiteContext, model: StatefulModel, dtype: str, lowered: Any, where: str) -> tuple[Session, str]:
    """A fresh session (seed 0) run through on ``lowered``, after `_starts_initial` (``where`` names the moment),
    and where its outputs leave eager's (`_off_eager`)."""
    _starts_initial(model, dtype, lowered, where)
    session = _session(model, dtype, lowered, seed=0)
    session.run_all()
    return session, _off_eager(session, ctx, model.name, dtype)


def _half_run(model: StatefulModel, dtype: str, lowered: Any) -> tuple[Session, int]:
    """A session (seed 1) that has made half its calls on ``lowered`` (at least one), and that number."""
    session = _session(model, dtype, lowered, seed=1)
    half = max(1, session.calls.total // 2)
    for _ in range(half):
        session.step()
    return session, half


def _alone_passes(ctx: SuiteContext, model_name: str, dtype: str) -> str:
    """What one instance alone does (the shared whole-lowering generation), to tell a shared state from a wrong kernel."""
    try:
        alone = _generation(ctx, model_name, dtype, "whole")
    except Unsupported:
        return ""
    if _judged(alone, ctx, model_name, dtype).passed:
        return " One instance alone generates as eager (the outputs check), so the instances share state."
    return " One instance alone fails too (see the outputs check)."


def check_isolation(ctx: SuiteContext, *, model_name: str, dtype: str, lowering: str) -> dict[str, Any]:
    model = _model(ctx, model_name)
    first, second = _instance(ctx, model, dtype, lowering), _instance(ctx, model, dtype, lowering)
    # The second instance generates from another prompt (for prefill, of another length).
    other: dict[str, Any] = {"prompt": max(2, model.prompt - 2)} if model.driver == "prefill_decode" else {}
    a = _session(model, dtype, first, seed=0)
    b = _session(model, dtype, second, seed=1, **other)
    while (a.step() is not None) | (b.step() is not None):
        pass
    for label, session in (("first", a), ("second", b)):
        if failed := _off_eager(session, ctx, model_name, dtype):
            raise CheckFailed(
                f"{model_name} in {dtype}: two instances lowered apart, called in turn (each with its own prompt), "
                f"the {label} instance: {failed}\nEach lowered instance must keep its own state: "
                f"a call on one must never change what the other computes.{_alone_passes(ctx, model_name, dtype)}"
            )
    return {"stateful": {"calls": len(a.records) + len(b.records)}}


def check_reset(ctx: SuiteContext, *, model_name: str, dtype: str, lowering: str) -> dict[str, Any]:
    model = _model(ctx, model_name)
    lowered = _instance(ctx, model, dtype, lowering)
    before, _ = _half_run(model, dtype, lowered)
    lowered.reset()
    where = f"{model_name} in {dtype}: after {len(before.records)} calls and reset()"
    after, failed = _fresh_run(ctx, model, dtype, lowered, where)
    if failed:
        raise CheckFailed(
            f"{where}, compared with a fresh eager model: {failed}\nreset() must return the state to its initial "
            "value; "
            + (
                "the backend keeps the state (keeps_state=True), and reset() compiles the blobs again: each "
                "compile() must start from the initial values the blobs carry, never from state kept across calls."
                if not _state_readable(lowered)
                else "the backend must keep no state of its own between calls (the lowered module passes it in "
                "and takes it back)."
            )
        )
    return {"stateful": {"calls_before_reset": len(before.records), "calls": len(after.records)}}


def _starts_initial(model: StatefulModel, dtype: str, lowered: Any, where: str) -> None:
    """The module's state is a fresh eager model's buffers: a decoder masks the cache past its position, so a
    stale cache would go unseen by its outputs."""
    if not _state_readable(lowered):
        return
    initial = dict(model.module(dtype).named_buffers())
    for name, value in sorted(bc.state(lowered).items()):
        if name in initial and not torch.equal(value, initial[name]):
            diff = (value.double() - initial[name].double()).abs()
            raise CheckFailed(
                f"{where}: its state {name!r} is not the initial state (as exported): {int((diff > 0).sum())} of "
                f"{diff.numel()} elements differ, by up to {float(diff.max()):.3g}"
            )


def check_reload(ctx: SuiteContext, *, model_name: str, dtype: str, lowering: str) -> dict[str, Any]:
    model = _model(ctx, model_name)
    lowered = _instance(ctx, model, dtype, lowering)
    used, half = _half_run(model, dtype, lowered)
    path = ctx.tmp_dir("stateful-reload") / f"{model_name}.bcarchive"
    bc.save(lowered, path)
    loaded = bc.load(path)
    where = f"{model_name} in {dtype}: an archive saved after {half} calls, loaded"
    fresh, failed = _fresh_run(ctx, model, dtype, loaded, where)
    if failed:
        raise CheckFailed(
            f"{where} and compared with a fresh eager model: {failed}\nA loaded archive must start from the initial "
            "state (as exported), never from the live state of the module that was saved."
        )
    # Saving must not disturb the module saved: it goes on as eager does.
    used.run_all()
    if failed := _off_eager(used, ctx, model_name, dtype):
        raise CheckFailed(
            f"{model_name} in {dtype}: the module saved after {half} calls, called on after bc.save: "
            f"{failed}\nSaving must leave the module's state as it was."
        )
    return {"stateful": {"calls_before_save": half, "calls": len(fresh.records)}}


def check_past_cache(ctx: SuiteContext, *, model_name: str, dtype: str, lowering: str) -> dict[str, Any]:
    model = _model(ctx, model_name)
    assert model.cache is not None
    lowered = _instance(ctx, model, dtype, lowering)
    wraps = model.past_cache == "wraps"
    # A sliding window goes on twice round its slots; a static cache stops one position past its end.
    last = 2 * model.cache + 1 if wraps else model.cache
    session = _session(model, dtype, lowered, seed=0, last_position=last)
    session.run_all()
    final = session.records[-1]
    judged = session.records if wraps else session.records[:-1]
    verdict = judge_outputs(judged, _tolerance(ctx, model_name, dtype), _multiple())
    if not verdict.passed:
        raise CheckFailed(f"{model_name} in {dtype}, up to position {last}: {_failed_at(verdict)}")
    if wraps:
        return {"stateful": {"last_position": last, "behaviour": "wraps, as eager"}}
    if final.eager_error is None:
        raise CheckFailed(f"{model_name}: eager PyTorch ran position {last} past its cache of {model.cache}")
    if final.error is None:
        raise CheckFailed(
            f"{model_name} in {dtype}: at position {last}, past the cache of {model.cache} positions, the lowered "
            f"module returned {_describe(final.actual)} where eager PyTorch raises {type(final.eager_error).__name__}: "
            f"{final.eager_error}\nA position past the cache must raise an error, not give an answer computed from "
            "a write that was clamped, wrapped or dropped."
        )
    return {"stateful": {"last_position": last, "error": f"{type(final.error).__name__}: {str(final.error)[:200]}"}}


def check_threads(ctx: SuiteContext, *, model_name: str, dtype: str, lowering: str) -> dict[str, Any]:
    model = _model(ctx, model_name)
    lowered = _instance(ctx, model, dtype, lowering)
    count = int(section("stateful")["threads"])
    barrier = threading.Barrier(count)
    # A sliding window stays within its slots: a thread running ahead would overwrite a slot the other still reads.
    last = model.cache - 1 if model.past_cache == "wraps" and model.cache else None
    sessions = [_session(model, dtype, lowered, seed=0, last_position=last) for _ in range(count)]
    errors: list[BaseException] = []

    def work(session: Session) -> None:
        try:
            barrier.wait(timeout=60)
            session.run_all()
        except BaseException as exc:  # reported below, in the check's own thread
            errors.append(exc)

    threads = [threading.Thread(target=work, args=(s,), name=f"stateful-{i}") for i, s in enumerate(sessions)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    if errors:
        raise errors[0]
    where = f"{model_name} in {dtype}: {count} threads making the same calls on one lowered instance at once"
    rule = (
        "\nThe calls of one instance must take turns (the lowered module serializes them): each call reads the "
        "state and writes it back whole, and two at once lose one's update."
    )
    for i, session in enumerate(sessions):
        raised = next((r for r in session.records if r.error is not None), None)
        if raised is not None:
            raise CheckFailed(
                f"{where}: thread {i}'s {raised.where()} raised {type(raised.error).__name__}: {raised.error}{rule}"
            )
    if model.tokens:
        # Every thread writes the same values at the same positions, and reads only positions it wrote
        # itself first: taken in turns, each thread sees exactly eager's sequence.
        for i, session in enumerate(sessions):
            if failed := _off_eager(session, ctx, model_name, dtype):
                raise CheckFailed(f"{where}: thread {i}'s {failed}{rule}")
    else:
        # A running sum: after every call of every thread, one more call must see them all.
        eager = model.module(dtype)
        for session in sessions:
            for record in session.records:
                with torch.no_grad():
                    eager(*record.call.args)
        x = torch.full(model.input_shape, 0.5, dtype=getattr(torch, dtype))
        with torch.no_grad():
            expected = eager(x)
        actual = lowered(x)
        from pytest_backendconf.numerics import compare_outputs

        results = compare_outputs(
            actual, expected, _tolerance(ctx, model_name, dtype).scaled(4.0, "sums in another order")
        )
        if not all(r.passed for r in results):
            raise CheckFailed(
                f"{where}: a call after all {sum(len(s.records) for s in sessions)} calls differs from eager PyTorch "
                "fed every call:\n" + "\n".join(r.text() for r in results if not r.passed) + rule
            )
    return {"stateful": {"threads": count, "calls": sum(len(s.records) for s in sessions)}}
