"""parity: every zoo model, in every dtype the backend declares, matches eager PyTorch.

Inputs come from Hypothesis (uniform values, the range's edge values, and
both mixed); tolerances from the backend's declaration, else the defaults in
``suite.toml``. A model the backend rejects is *unsupported*, never a pass.

float16 and bfloat16 models are judged three ways (`Truth`): against the
model run in float64 (float32 where it cannot run in float64) and cast
back, within the tolerance, or within ``eager_multiple`` times eager
PyTorch's own closeness in the tested dtype to that truth. A backend more
accurate than eager passes, and so does one as accurate.

Models whose inputs have varying dimensions (``[model.dims]``) also get a
``[<dtype>-dynamic]`` check: the model lowered once with dynamic shapes, then
called with sizes Hypothesis draws in the exported ranges (both ends and a
middle size always first, then a third of the profile's examples), so a backend that specialises on the first
shape it sees, or keeps its buffers, gives wrong outputs.

An output that is the indices of an op leaving ties open (``sort``,
``topk``, ``max.dim``, ``argmax`` … in the exported graph) is valid when it
selects the values eager's indices select (`pytest_backendconf.numerics.settle_program_ties`).
"""

from __future__ import annotations

import copy
import functools
import json
from pathlib import Path
from typing import Any, Callable, Iterator

import torch
from pytest_backendconf import _compat
from hypothesis import example, given, seed as hypothesis_seed, settings, strategies as st

from pytest_backendconf import OutputSpecError, UnsupportedNodeError
from pytest_backendconf.suite import FIXED, INPUT_MODES, SuiteContext
from pytest_backendconf.lowering import normalize as normalize_call
from pytest_backendconf.diagnostics import locate_in_program
from pytest_backendconf.archive import write_tensors
from pytest_backendconf.numerics import (
    InvalidIndices,
    StructureMismatch,
    Tolerance,
    compare_outputs,
    resolve_tolerance,
    settle_program_ties,
    summary_json,
    tie_open_outputs,
    worst,
)
from pytest_backendconf.suite import PROFILES, GoldenRecorder, draws_seed, notes_before_hypothesis
from pytest_backendconf.checks import Check, CheckFailed, Unsupported
from pytest_backendconf.target import error_record

from ._spec import section


def checks(ctx: SuiteContext) -> Iterator[Check]:
    for case in ctx.cases.values():
        for dtype in ctx.dtypes_for(case):
            for method in case.methods:
                suffix = "" if method == "forward" else f".{method}"
                yield Check(
                    category="parity",
                    name=f"{case.name}{suffix}[{dtype}]",
                    run=functools.partial(check_parity, case_name=case.name, dtype=dtype, method=method),
                    stage="execute",
                    case=case.name,
                    draws_inputs=True,
                )
                if case.method_dims(method):
                    yield Check(
                        category="parity",
                        name=f"{case.name}{suffix}[{dtype}-dynamic]",
                        run=functools.partial(check_dynamic_parity, case_name=case.name, dtype=dtype, method=method),
                        stage="execute",
                        case=case.name,
                        draws_inputs=True,
                    )


def lowered_or_unsupported(ctx: SuiteContext, case_name: str, dtype: str, *, dynamic: bool = False):
    """The case lowered to the backend; `Unsupported` if the backend rejects a node.

    ``dynamic``: lowered with dynamic shapes; `Unsupported` if the backend
    declares ``Capabilities(dynamic_shapes=False)``.
    """
    if dynamic and not ctx.capabilities.dynamic_shapes:
        raise Unsupported(f"backend {ctx.name!r} declares Capabilities(dynamic_shapes=False)")
    try:
        return ctx.lower(case_name, dtype, dynamic=dynamic)
    except UnsupportedNodeError as exc:
        raise Unsupported.from_rejection(exc) from exc


def tolerance(ctx: SuiteContext, dtype: str) -> tuple[float, float]:
    found = tolerance_for(ctx, dtype)
    return found.rtol, found.atol


def tolerance_for(ctx: SuiteContext, dtype: str, case_name: str | None = None) -> Tolerance:
    """The tolerance of a (model, dtype): the backend's per-model override, its per-dtype one, the default."""
    torch_dtype = getattr(torch, "float32" if dtype == FIXED else dtype)
    keys = [case_name] if case_name else []
    return resolve_tolerance(torch_dtype, keys, ctx.capabilities.tolerances, section("parity")["tolerances"])


LOW_PRECISION = ("float16", "bfloat16")


class Truth:
    """The model of a low-precision (case, dtype) run in a wider dtype: the reference of the three-way rule.

    The copy holds the very weights of the model in the tested dtype,
    widened (no rounding of its own); inputs are widened the same way and
    the outputs cast back to eager's dtypes. float64 first; a model with an
    op that has no float64 kernel runs in float32.
    """

    def __init__(self, ctx: SuiteContext, case_name: str, dtype: str) -> None:
        self.module = ctx.module(case_name, dtype)
        self.low = getattr(torch, dtype)
        self.wide: dict[torch.dtype, Any] = {}
        self.how = ""

    def __call__(self, method: str, args: tuple, kwargs: dict, like: Any) -> Any:
        for wide in (torch.float64, torch.float32):
            try:
                if wide not in self.wide:
                    self.wide[wide] = copy.deepcopy(self.module).to(wide)
                widen = functools.partial(self._cast, wide)
                with torch.no_grad():
                    out = getattr(self.wide[wide], method)(
                        *_compat.tree_map(widen, args), **_compat.tree_map(widen, kwargs)
                    )
                leaves, spec = _compat.tree_flatten(out)
                eager_leaves = _compat.tree_leaves(like)
                if len(leaves) != len(eager_leaves):
                    return None
                self.how = f"the model in {str(wide).removeprefix('torch.')}, cast back"
                return [
                    o.to(e.dtype) if isinstance(o, torch.Tensor) and isinstance(e, torch.Tensor) else o
                    for o, e in zip(leaves, eager_leaves)
                ]
            except Exception:
                continue
        return None  # no wider run: eager in the dtype is the reference

    def _cast(self, wide: torch.dtype, value: Any) -> Any:
        return value.to(wide) if isinstance(value, torch.Tensor) and value.dtype == self.low else value


def truth_for(ctx: SuiteContext, case_name: str, dtype: str) -> Truth | None:
    if dtype not in LOW_PRECISION:
        return None
    return ctx.memo(("parity-truth", case_name, dtype), lambda: Truth(ctx, case_name, dtype))


def check_parity(ctx: SuiteContext, *, case_name: str, dtype: str, method: str) -> dict:
    lowered = lowered_or_unsupported(ctx, case_name, dtype)
    eager = getattr(ctx.module(case_name, dtype), method)
    truth = truth_for(ctx, case_name, dtype)
    run = getattr(lowered, method)
    tol = tolerance_for(ctx, dtype, case_name)
    profile = PROFILES[ctx.hypothesis_profile]
    #: The worst comparison among the passing examples.
    seen: dict = {}
    suffix = "" if method == "forward" else f".{method}"
    golden = GoldenRecorder(ctx, "parity", f"{case_name}{suffix}[{dtype}]", tol)

    @profile
    @given(seed=st.integers(0, 2**31 - 1), mode=st.sampled_from(INPUT_MODES))
    def compare(seed: int, mode: str) -> None:
        args, kwargs = ctx.example(case_name, dtype, method, seed=seed, mode=mode)
        originals = [a.clone() if isinstance(a, torch.Tensor) else a for a in args]
        ties = tie_judge(ctx, case_name, dtype, method, args, kwargs)
        expected = eager(*args, **kwargs)
        wide = truth(method, args, kwargs, expected) if truth is not None else None
        where = f"{case_name}.{method} in {dtype}"
        drawn = f" for inputs drawn with seed={seed}, mode={mode!r}"
        with notes_before_hypothesis(f"(in {where}{drawn})"):
            try:
                actual = run(*args, **kwargs)
            except OutputSpecError as exc:
                raise _spec_failure(where + drawn, exc, (args, kwargs, None)) from None
        _compare_with_eager(
            actual,
            expected,
            tol,
            seen,
            (args, kwargs, None),
            where,
            after=drawn,
            truth=wide,
            how=_how(truth, wide),
            ties=ties,
        )
        for i, (before, after) in enumerate(zip(originals, args)):
            if isinstance(before, torch.Tensor) and not torch.equal(before, after):
                raise CheckFailed(f"{case_name}.{method}: execute() changed input {i} in place")
        golden.add(args, kwargs, expected)

    compare = _seeded(ctx, f"{case_name}[{dtype}].{method}", compare)
    try:
        compare()
    except _Differs as exc:
        raise _with_saved_inputs(exc, ctx, case_name, dtype, method, tol) from None
    golden.write(lowered, method)  # --backendconf-golden: the archive, bundled with what it was checked on
    return {"numerics": _numerics(seen)}


def _how(truth: Truth | None, wide: Any) -> str:
    return truth.how if truth is not None and wide is not None else ""


def _numerics(seen: dict) -> dict:
    found = summary_json(seen.get("worst") or [])
    found["reference"] = seen.get("how") or "eager PyTorch in the tested dtype"
    return found


def _seeded(ctx: SuiteContext, check: str, test: Any) -> Any:
    """``test`` drawing from the check's seed: its own under the ``ci`` profile, the session's otherwise."""
    return hypothesis_seed(draws_seed(ctx.hypothesis_profile, ctx.hypothesis_seed, check))(test)


def tie_judge(
    ctx: SuiteContext, case_name: str, dtype: str, method: str, args: Any, kwargs: dict, *, dynamic: bool = False
) -> Callable[[list, list], tuple[list, list[int]]] | None:
    """What settles the tie-open index outputs of one call (``None``: the method's graph returns none).

    The judgement runs the exported program on copies of the call's inputs,
    taken before the backend ran, to see what each index output selects from.
    """
    program = ctx.program(case_name, dtype, method, dynamic=dynamic)
    if not tie_open_outputs(program):
        return None
    args, kwargs = normalize_call(getattr(type(ctx.module(case_name, dtype)), method), method, tuple(args), kwargs)
    inputs = [v.clone() if isinstance(v, torch.Tensor) else v for v in _compat.tree_leaves((args, kwargs))]
    return functools.partial(settle_program_ties, program, inputs)


class _Differs(CheckFailed):
    """Outputs out of tolerance, or not as the program's output spec says; ``example`` is the
    ``(args, kwargs, sizes)`` that showed it.

    Kept on the exception: of several failing explicit examples Hypothesis
    reports the first, after running them all, and after shrinking it
    reports the last example it ran. ``locate``: whether to look for the
    node where the values first diverge (not for an output of the wrong
    dtype, shape or count: the output and its node are named already).
    """

    def __init__(self, message: str, example: tuple, *, locate: bool = True, error: Exception | None = None) -> None:
        super().__init__(message, error_record=error_record(error) if error is not None else None)
        self.example = example
        self.locate = locate


def _spec_failure(where: str, exc: OutputSpecError, example: tuple, hint: str = "") -> _Differs:
    """An output of the wrong dtype, shape or count: the check's text, the error kept as the report's."""
    node = f"\n  (output {exc.output} is the exported program's node {exc.node!r})" if exc.node else ""
    return _Differs(f"{where}: {exc}{node}{hint}", example, locate=False, error=exc)


def _compare_with_eager(
    actual: Any,
    expected: Any,
    tol: Tolerance,
    seen: dict,
    example: tuple,
    where: str,
    *,
    after: str = "",
    hint: str = "",
    shape_hint: str = "",
    truth: Any = None,
    how: str = "",
    ties: Callable[[list, list], tuple[list, list[int]]] | None = None,
) -> None:
    """`_Differs` if the backend's outputs have another structure, dtype or shape than eager's, or one is out of
    tolerance (only then is the diverging node looked for).

    ``where`` starts every message and ``after`` (the drawn inputs) ends its
    first part; ``hint`` (what a backend must not do) follows a value's
    divergence, ``shape_hint`` an output of another shape than eager's. ``seen["worst"]``
    keeps the comparisons of the example closest to failing. ``truth``: the
    flat outputs of the model in a wider dtype, cast back (``how`` says
    which): the outputs are then judged three ways, against it and against
    eager's own error. ``ties`` (`tie_judge`) settles the index outputs that
    leave ties open: valid ones count as equal to the reference, an invalid
    one is `_Differs` naming the first wrong index.
    """
    if _compat.tree_structure(actual) != _compat.tree_structure(expected):
        raise _Differs(
            f"{where}: the backend's outputs have another structure than eager PyTorch's{after}", example, locate=False
        )
    if ties is not None:
        reference = truth if truth is not None else _compat.tree_leaves(expected)
        try:
            actual, _ = ties(list(_compat.tree_leaves(actual)), list(reference))
        except InvalidIndices as exc:
            raise _Differs(
                f"{where}: the backend's indices select other values than eager PyTorch's{after}:\n{exc}", example
            ) from None
    try:
        if truth is not None:
            multiple = float(section("parity").get("eager_multiple", 2.0))
            results = compare_outputs(actual, truth, tol, expected, multiple)
        else:
            results = compare_outputs(actual, expected, tol)
    except StructureMismatch as exc:
        also = shape_hint if exc.differs == "shape" else ""
        raise _Differs(f"{where}: {exc}{after}{also}", example, locate=False) from None
    failing = [r for r in results if not r.passed]
    if failing:
        against = f"{how} (and eager PyTorch in the tested dtype)" if truth is not None else "eager PyTorch"
        differs = _Differs(
            f"{where}: the backend's outputs differ from {against}{after}:\n"
            + "\n".join(r.text() for r in failing)
            + hint,
            example,
        )
        differs.details = {
            "numerics": {**summary_json(results), "reference": how or "eager PyTorch in the tested dtype"}
        }
        raise differs
    top = worst(results)
    if top is not None:
        before = worst(seen.get("worst") or [])
        if before is None or top.closeness > before.closeness:
            seen["worst"] = results
            seen["how"] = how


def _with_saved_inputs(
    exc: _Differs, ctx: SuiteContext, case_name: str, dtype: str, method: str, tol: Tolerance
) -> CheckFailed:
    """The failure, with where the outputs first diverge, the failing inputs saved and the command that reruns them."""
    args, kwargs, sizes = exc.example
    saved = save_inputs(ctx, case_name, dtype, method, args, kwargs, sizes=sizes)
    # A dynamic-shape failure is localised on the model exported at the failing sizes: the dynamic
    # program's symbolic shapes have no place in the one-node programs the bisection lowers.
    details = dict(exc.details or {})
    located = (
        divergence_text(
            ctx, case_name, dtype, method, args, kwargs, tol, at_these_sizes=sizes is not None, details=details
        )
        if exc.locate
        else ""
    )
    rerun = rerun_command(ctx, saved)
    return CheckFailed(
        f"{exc}{located}\n  inputs: {saved}\n  rerun this comparison: {rerun}",
        details=details,
        rerun=rerun,
        error_record=exc.error_record,
    )


def divergence_text(
    ctx: SuiteContext,
    case_name: str,
    dtype: str,
    method: str,
    args: tuple,
    kwargs: dict,
    tol: Tolerance,
    *,
    at_these_sizes: bool = False,
    details: dict | None = None,
) -> str:
    """``Diverges first at node 'sub' (aten::sub): …`` and the node's source, for a multi-node model.

    ``at_these_sizes``: the model is exported again at the inputs' own shapes
    (a dynamic-shape failure; the session's program has the example shapes).
    ``details``: the failure's report details, given the node as data (``divergence``) when it is found,
    so that a known-failures entry names it without reading this text.
    """
    module = ctx.module(case_name, dtype)
    module_type = type(module)
    try:
        if at_these_sizes:
            from pytest_backendconf.lowering import export_method

            program = export_method(copy.deepcopy(module), method, tuple(args), dict(kwargs))
        else:
            program = ctx.program(case_name, dtype, method)
    except Exception as exc:  # a diagnosis: never hide the failure behind it
        return f"\n(could not locate the divergence: {type(exc).__name__}: {exc})"
    ops = [n for n in program.graph_module.graph.nodes if n.op == "call_function"]
    if len(ops) < 2:
        return ""
    args, kwargs = normalize_call(getattr(module_type, method), method, args, kwargs)
    try:
        found = locate_in_program(
            program,
            ctx.backend,
            list(_compat.tree_leaves((args, kwargs))),
            top_class=module_type.__name__,
            method=method,
            tolerance=tol,
        )
    except Exception as exc:  # localisation is a diagnosis: never hide the failure behind it
        return f"\n(could not locate the divergence: {type(exc).__name__}: {exc})"
    if found is None:
        return "\n(no single node or prefix of the program is out of tolerance on its own)"
    if details is not None:
        details["divergence"] = found.as_json()
    return "\n" + found.text()


def size_choices(
    ctx: SuiteContext, case_name: str, method: str
) -> tuple[st.SearchStrategy[dict[str, int]], list[dict[str, int]]]:
    """A Hypothesis strategy of ``{dim: size}`` in the case's bounds, and the sizes always tried.

    Always tried, in this order: every Dim at its minimum, at its maximum,
    and at the middle of its range (three distinct shapes for every range
    of width two or more).
    """
    dims = ctx.cases[case_name].method_dims(method)
    strategy = st.fixed_dictionaries({name: st.integers(d.min, d.max) for name, d in dims.items()})
    ends = [
        {name: d.min for name, d in dims.items()},
        {name: d.max for name, d in dims.items()},
        {name: (d.min + d.max) // 2 for name, d in dims.items()},
    ]
    return strategy, ends


#: What a dynamic-shape failure adds when the shape is what differs (or values, after other sizes passed).
SPECIALISATION_HINT = (
    "\nA backend must not specialise on the first shape it runs (or on the example shape of the export)."
)


def check_dynamic_parity(ctx: SuiteContext, *, case_name: str, dtype: str, method: str) -> dict:
    lowered = lowered_or_unsupported(ctx, case_name, dtype, dynamic=True)
    eager = getattr(ctx.module(case_name, dtype), method)
    truth = truth_for(ctx, case_name, dtype)
    run = getattr(lowered, method)
    tol = tolerance_for(ctx, dtype, case_name)
    profile = PROFILES[ctx.hypothesis_profile]
    strategy, always = size_choices(ctx, case_name, method)
    #: The worst comparison among the passing examples.
    seen: dict = {}
    suffix = "" if method == "forward" else f".{method}"
    golden = GoldenRecorder(ctx, "parity", f"{case_name}{suffix}[{dtype}-dynamic]", tol)

    #: The sizes of the calls that passed: a failure at other sizes after them is what specialising looks like.
    passed: list[dict] = []

    def compare(sizes: dict, seed: int, mode: str) -> None:
        args, kwargs = ctx.example(case_name, dtype, method, seed=seed, mode=mode, sizes=sizes)
        ties = tie_judge(ctx, case_name, dtype, method, args, kwargs, dynamic=True)
        expected = eager(*args, **kwargs)
        shapes = ", ".join(f"{n}={v}" for n, v in sizes.items())
        where = (
            f"{case_name}.{method} in {dtype}, lowered once with dynamic shapes and called at {shapes}, "
            f"inputs drawn with seed={seed}, mode={mode!r}"
        )
        with notes_before_hypothesis(f"(in {where})"):
            try:
                actual = run(*args, **kwargs)
            except OutputSpecError as exc:
                # The hint only where the shape is what differs: a wrong dtype or count is no specialisation.
                hint = SPECIALISATION_HINT if "shape" in exc.differs else ""
                raise _spec_failure(where, exc, (args, kwargs, sizes), hint) from None
        wide = truth(method, args, kwargs, expected) if truth is not None else None
        # Values wrong at sizes where no call passed, after calls at other sizes passed: the backend
        # may have kept the first shape. Wrong at every size (a wrong kernel), it has not.
        hint = SPECIALISATION_HINT if passed and sizes not in passed else ""
        _compare_with_eager(
            actual,
            expected,
            tol,
            seen,
            (args, kwargs, sizes),
            where,
            hint=hint,
            shape_hint=SPECIALISATION_HINT,
            truth=wide,
            how=_how(truth, wide),
            ties=ties,
        )
        passed.append(sizes)
        golden.add(args, kwargs, expected)

    test = given(sizes=strategy, seed=st.integers(0, 2**31 - 1), mode=st.sampled_from(INPUT_MODES))(compare)
    for sizes in reversed(always):  # example() stacks: the last applied runs first
        test = example(sizes=sizes, seed=0, mode="random")(test)
    # Values are parity's job; here the sizes are: a third of the profile's
    # draws on top of the three sizes always tried keeps the suite's time.
    test = settings(profile, max_examples=max(1, profile.max_examples // 3))(test)
    test = _seeded(ctx, f"{case_name}[{dtype}-dynamic].{method}", test)
    try:
        test()
    except _Differs as exc:
        raise _with_saved_inputs(exc, ctx, case_name, dtype, method, tol) from None
    golden.write(lowered, method)
    return {"numerics": _numerics(seen)}


def save_inputs(
    ctx: SuiteContext, case_name: str, dtype: str, method: str, args: tuple, kwargs: dict, *, sizes: dict | None = None
) -> Path:
    """The failing example's tensors in a tensor file (no code in it) for `pytest_backendconf.rerun`.

    ``sizes``: the dynamic-shape check's sizes; the rerun lowers with dynamic shapes again.
    """
    leaves = [leaf for leaf in _compat.tree_leaves((args, kwargs)) if isinstance(leaf, torch.Tensor)]
    suffix = "-dynamic" if sizes is not None else ""
    path = ctx.artifact_dir("parity-inputs") / f"{case_name}.{method}-{dtype}{suffix}.safetensors"
    metadata = {"kind": "parity", "case": case_name, "dtype": dtype, "method": method, "backend": ctx.name}
    if sizes is not None:
        metadata["sizes"] = json.dumps(sizes)
    write_tensors(path, {f"input{i}": t for i, t in enumerate(leaves)}, metadata)
    return path


def rerun_command(ctx: SuiteContext, path: Path) -> str:
    return ctx.rerun_command(path)
