"""Category ``ops``: every single-op OpInfo sample, lowered whole to the backend and compared.

Ids name the aten overload: ``backendconf::ops::aten.add.Tensor[float16-sample0]``.
The samples come from PyTorch's OpInfo database through data files
(``ops.discovery``), the programs are rebuilt from that data once per
session (``_ops_program``) and shared through the session memo, and the
reference for float16 and bfloat16 is eager PyTorch in float64 cast back
(see ``[ops]`` in suite.toml), so a backend more accurate than PyTorch's own
low-precision CPU kernels is not failed for it; nor is one as accurate as
them: eager in the tested dtype is computed too, and an output within
``eager_multiple`` times eager's own closeness passes (``diagnostics``).
Inputs an op writes by its semantics (batch norm's running statistics in
training mode) are compared with eager's writes; index outputs of ops that
leave ties open are checked for validity (``_ties``). The suite's own
long-reduction samples (``_long_samples``) join OpInfo's.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import json
import os
import re
from pathlib import Path
from typing import TYPE_CHECKING, Any, Iterator, Protocol

import torch

from ... import _compat
from ...suite import SuiteContext
from ...lowering import lower_programs
from ...numerics import (
    Closeness,
    StructureMismatch,
    Tolerance,
    compare_outputs,
    compare_tensor,
    resolve_tolerance,
    summary_json,
    worst,
)
from ...checks import Batching, Check, CheckFailed, CheckOutcome, Unsupported, outcome_to_json
from ...archive import write_tensors
from ...errors import UnsupportedNodeError
from . import discovery
from ._long_samples import long_samples
from ._program import OpCall, build_batch_program, build_program, op_call_class
from .._spec import section
from ._ties import InvalidIndices, settle_ties

if TYPE_CHECKING:
    from ...capabilities import Capabilities

LOW_PRECISION = ("float16", "bfloat16")


def checks(ctx: SuiteContext) -> Iterator[Check]:
    from . import _quantized as _ops_quantized

    yield from _opinfo_checks(ctx)
    # The quantize/dequantize overloads and single-op quantized programs: the suite's own samples.
    yield from _ops_quantized.checks(ctx)


def names_in_default_selection(ctx: SuiteContext) -> list[str]:
    """The names of the operator checks of the default selection, whatever this run's selection.

    The quick selection is a part of the default one: a known-failures file recorded with the
    default matrix names checks that a quick run leaves out, and they are not stale for that.
    """
    return [check.name for check in _opinfo_checks(ctx, "default")]


def _opinfo_checks(ctx: SuiteContext, mode: str | None = None) -> Iterator[Check]:
    mode = mode or _mode(ctx)
    data = ops_data(ctx, mode)
    if data is None:
        return
    wanted = set(dtypes_under_test(ctx, mode))
    samples = None if mode == "all" else section("ops").get(f"{mode}_samples", discovery.DEFAULT_SAMPLES)
    for number, sample in enumerate(data.samples):
        if sample.dtype not in wanted or (samples is not None and sample.index >= samples):
            continue
        if sample.kind == "long" and mode == "quick":
            continue
        yield Check(
            category="ops",
            name=sample.name,
            run=functools.partial(check_op, number=number),
            stage="execute",
            case=None,  # a model case name where set; the overload is in the id
            # One dtype per batch: an engine may pick its precision per program (run_batch).
            batch=Batching(group=sample.dtype, member=sample.overload.split(".")[1], item=number, run=run_batch),
        )


def dtypes_under_test(ctx: SuiteContext, mode: str | None = None) -> list[str]:
    """The dtypes the ops matrix has columns for (the rest are "not under test")."""
    mode = mode or _mode(ctx)
    declared = ctx.capabilities.dtypes
    spec = section("ops")
    wanted = spec.get("dtypes", discovery.DISCOVERY_DTYPES)
    if mode != "all":
        wanted = spec.get(f"{mode}_dtypes", wanted)
    return [
        d for d in discovery.DISCOVERY_DTYPES if d in wanted and (declared is None or getattr(torch, d) in declared)
    ]


def _mode(ctx: SuiteContext) -> str:
    return getattr(ctx, "ops_mode", "default")


def ops_data(ctx: SuiteContext, mode: str | None = None) -> discovery.OpsData | None:
    """The session's samples: shipped data for this torch, a cached discovery, or a fresh one."""
    mode = "all" if (mode or _mode(ctx)) == "all" else "default"  # quick selects from the default data
    return ctx.memo(("ops-data", mode), lambda: _with_long_samples(_load_or_discover(ctx, mode)))


def _with_long_samples(data: discovery.OpsData | None) -> discovery.OpsData | None:
    if data is not None:
        data.samples.extend(long_samples())
    return data


def _load_or_discover(ctx: SuiteContext, mode: str) -> discovery.OpsData | None:
    version = discovery.release()
    if mode == "default":
        data = discovery.load(discovery.DATA_DIR, version)
        if data is not None:
            return data
    cache = build_cache_dir()
    data = _cached(ctx, cache, version, mode)
    if data is not None:
        return data
    op_db, reason = _compat.opinfo_database()
    if op_db is None:
        notice(ctx, f"ops category skipped: no ops data for torch {version} and {reason}")
        return None
    # Once per machine: the first process discovers under the lock (the xdist controller before any
    # worker starts, see `prepare_samples`); a worker, the backend host or another run waits for it,
    # then reads the cache.
    with _discovery_lock(cache) as locked:
        data = _cached(ctx, cache, version, mode)
        if data is not None:
            return data
        notice(
            ctx,
            f"ops: discovered single-op samples of PyTorch's OpInfo database for torch {torch.__version__} "
            f"(once per torch build; cached in {cache})",
        )
        progress = ctx.discovery_progress
        if progress is not None:
            progress(
                f"torch {torch.__version__} has no shipped samples: sampling {len(op_db)} OpInfo entries "
                f"(once per torch build; cached in {cache})"
            )
        all_samples = mode == "all"
        data = discovery.with_shipped_tolerances(
            discovery.discover(
                op_db,
                max_samples=None if all_samples else discovery.DEFAULT_SAMPLES,
                tries=None if all_samples else discovery.DEFAULT_TRIES,
                progress=ctx.discovery_progress,
            )
        )
        if progress is not None:
            progress(f"{len(data.samples)} samples of {len({s.overload for s in data.samples})} overloads")
        if locked:
            try:
                discovery.save(data, cache, mode)
            except OSError as exc:
                notice(ctx, f"ops: could not cache the discovered samples in {cache}: {exc}")
    return data


def _cached(ctx: SuiteContext, cache: Path, version: str, mode: str) -> discovery.OpsData | None:
    """The samples cached for this torch build, or None; a file that is not what discovery writes is
    said and discovered again (the cache may come from elsewhere: a restored CI cache, a share)."""
    try:
        data = discovery.load(cache, version, mode)
    except discovery.OpsDataError as exc:
        notice(ctx, f"ops: the cached samples are not used: {exc}")
        return None
    if data is None:
        return None
    shipped = discovery.load(discovery.DATA_DIR, version) if mode == "all" else None
    if shipped is not None:
        # The whole sampling holds every (overload, dtype) the default one ships: a cache that lacks some
        # would make their checks vanish.
        have = {(s.overload, s.dtype) for s in data.samples}
        lacking = sorted({(s.overload, s.dtype) for s in shipped.samples} - have)
        if lacking:
            overload, dtype = lacking[0]
            notice(
                ctx,
                f"ops: the cached samples are not used: {cache} lacks {len(lacking)} (overload, dtype) pairs "
                f"that the shipped samples of torch {version} have ({overload} in {dtype}, …); they are "
                "discovered again",
            )
            return None
    notice(
        ctx,
        f"ops: {len(data.samples)} samples from the cache {cache}; their tolerances are the shipped tables'",
    )
    return data


def samples_record(ctx: SuiteContext) -> dict[str, Any] | None:
    """The report's ``ops.samples`` (`OpsData.record`: count, digest, source) of the session's samples."""
    data = ops_data(ctx)
    return None if data is None else ctx.memo(("ops-samples-record",), data.record)


def samples_needed(ctx: SuiteContext) -> bool:
    """Whether this run would discover samples: no shipped data and no cache for this torch build."""
    mode = "all" if _mode(ctx) == "all" else "default"
    version = discovery.release()
    if mode == "default" and discovery.data_paths(discovery.DATA_DIR, version, mode)[0].is_file():
        return False
    return not discovery.data_paths(build_cache_dir(), version, mode)[0].is_file()


def prepare_samples(ctx: SuiteContext) -> None:
    """Discover (or read) the session's samples now: what the xdist controller does before any
    worker starts, so that one process discovers and every other reads the cache."""
    ops_data(ctx)


def cache_dir() -> Path:
    base = os.environ.get("BACKENDCONF_CACHE") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "pytest-backendconf"
    )
    return Path(base) / "ops"


def build_cache_dir() -> Path:
    """The cache folder of this exact torch build: two builds of one release (a CPU and a CUDA
    wheel, a nightly) may differ in OpInfo's samples and in what export makes of them."""
    build = f"{torch.__version__}-{(torch.version.git_version or 'unknown')[:12]}"
    return cache_dir() / re.sub(r"[^A-Za-z0-9._+-]", "_", build)


@contextlib.contextmanager
def _discovery_lock(cache: Path) -> Iterator[bool]:
    """An exclusive lock on the cache folder while one process discovers (POSIX ``flock``).

    Yields whether the lock is held: without a writable cache (a read-only home) or ``fcntl``
    (Windows), the process discovers for itself and caches nothing."""
    try:
        import fcntl

        from ...archive import open_regular_file

        cache.mkdir(parents=True, exist_ok=True)
        lock = cache / ".discovery.lock"
        with contextlib.suppress(FileExistsError):  # made new, never through a link planted under its name
            os.close(os.open(lock, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0), 0o644))
        handle = os.fdopen(open_regular_file(lock), "rb")  # a FIFO or a link there: no lock, discovered alone
    except (ImportError, OSError):
        yield False
        return
    with handle:
        fcntl.flock(handle.fileno(), fcntl.LOCK_EX)
        try:
            yield True
        finally:
            fcntl.flock(handle.fileno(), fcntl.LOCK_UN)


def notice(ctx: SuiteContext, text: str) -> None:
    """A one-line message for the terminal (printed after collection)."""
    notices = getattr(ctx, "notices", None)
    if notices is None:
        notices = ctx.notices = []  # type: ignore[attr-defined]
    if text not in notices:
        notices.append(text)


# --- one check -----------------------------------------------------------------------------


def program_of(ctx: SuiteContext, number: int) -> Any:
    """The sample's single-op program, built once per session."""
    sample = ops_data(ctx).samples[number]  # type: ignore[union-attr]
    return ctx.memo(("ops-program", _mode(ctx), number), lambda: build_program(sample, sample.inputs))


@dataclasses.dataclass
class Reference:
    """What a backend's outputs are judged against.

    ``truth``: eager PyTorch in float64 cast back (float16/bfloat16 with
    floating outputs), else eager in the tested dtype; ``eager``: eager in
    the tested dtype when the truth is not it (the second opinion of the
    three-way comparison); ``writes``/``eager_writes``: the inputs the op
    writes by its semantics, by number, as the truth and eager leave them.
    """

    truth: list[torch.Tensor]
    eager: list[torch.Tensor] | None
    how: str
    writes: dict[int, torch.Tensor]
    eager_writes: dict[int, torch.Tensor]
    #: Inputs eager writes although the op's schema declares no write (training batch norm's running
    #: statistics), by number: what the backend did with each (`judge` fills it in; the report keeps it).
    undeclared: dict[int, str] = dataclasses.field(default_factory=dict)

    @property
    def against_float64(self) -> bool:
        return self.eager is not None


def reference_outputs(sample: discovery.OpSample, program: Any, low_precision_reference: bool) -> Reference:
    """Eager PyTorch's outputs (and writes to inputs), and how they were computed.

    For float16/bfloat16 with every output floating, in float64 and cast
    back: the rounding of the result is then the only error, where
    PyTorch's CPU kernels add their own (float16 ``rsqrt`` differs by
    input length), and eager in the dtype itself beside it. Index outputs
    (``max.dim``, ``sort``) keep eager in the dtype itself as the truth.
    """
    call = OpCall(sample)
    out_dtypes = output_dtypes(program)
    own = [t.clone() for t in sample.inputs]
    with torch.no_grad():
        eager = _compat.tree_leaves(call(*own))
    writes = {i: after for i, (before, after) in enumerate(zip(sample.inputs, own)) if not same_tensor(before, after)}
    if low_precision_reference and sample.dtype in LOW_PRECISION and all(d.is_floating_point for d in out_dtypes):
        low = getattr(torch, sample.dtype)
        wide = [t.double() if t.dtype == low else t.clone() for t in sample.inputs]
        try:
            with torch.no_grad():
                outputs = _compat.tree_leaves(call(*wide))
        except Exception:  # pragma: no cover - an op without a float64 kernel: eager in the dtype is the truth
            return Reference(eager, None, f"eager in {sample.dtype}", writes, {})
        truth = [o.to(d) for o, d in zip(outputs, out_dtypes)]
        truth_writes = {i: wide[i].to(sample.inputs[i].dtype) for i in writes}
        return Reference(truth, eager, "eager in float64, cast back", truth_writes, writes)
    return Reference(eager, None, f"eager in {sample.dtype}", writes, {})


def same_tensor(before: torch.Tensor, after: torch.Tensor) -> bool:
    """Equal values (NaN equal to NaN)."""
    if torch.equal(before, after):
        return True
    return (
        before.is_floating_point()
        and torch.equal(before.isnan(), after.isnan())
        and torch.equal(before.nan_to_num(), after.nan_to_num())
    )


def output_dtypes(program: Any) -> list[torch.dtype]:
    return [node.meta["val"].dtype for node in program.graph_module.graph.output_node().args[0]]


class Judging(Protocol):
    """What judging a sample reads of a suite context: the backend's capabilities (`backendconf rerun`
    passes a stand-in holding only them)."""

    capabilities: Capabilities


def tolerance_for(
    ctx: Judging, sample: discovery.OpSample, low_precision: bool, out_dtypes: list[torch.dtype] | None = None
) -> Tolerance:
    """The tolerance of the sample's dtype; of its floating outputs' dtype when its inputs are
    integers or bools (``cos`` of an int64 tensor is a float32 tensor, with float32's rounding)."""
    spec = section("ops")
    dtype = getattr(torch, sample.dtype)
    floating = [d for d in out_dtypes or [] if d.is_floating_point]
    if not dtype.is_floating_point and floating:
        dtype = floating[0]
    overrides = spec.get("overrides", {})
    tolerance = resolve_tolerance(dtype, [sample.overload], ctx.capabilities.tolerances, spec.get("tolerances", {}))
    if tolerance.source == "default" and sample.overload in overrides:
        name = str(dtype).removeprefix("torch.")
        pair = (
            overrides[sample.overload].get(name)
            if isinstance(overrides[sample.overload], dict)
            else overrides[sample.overload]
        )
        if pair is not None:
            tolerance = Tolerance(float(pair[0]), float(pair[1]), f"the suite's override for {sample.overload}")
    if tolerance.source == "default" and sample.opinfo_tolerance is not None and dtype == getattr(torch, sample.dtype):
        # PyTorch's own tests allow this much of its kernels; never tighter than the suite's default.
        tolerance = Tolerance(
            max(tolerance.rtol, sample.opinfo_tolerance[0]),
            max(tolerance.atol, sample.opinfo_tolerance[1]),
            f"OpInfo {sample.opinfo!r} toleranceOverride for {sample.dtype}",
        )
    if low_precision:
        factor = float(spec.get("low_precision_scale", 2.0))
        tolerance = tolerance.scaled(factor, f"x{factor:g} against the float64 reference")
    return tolerance


def check_op(ctx: SuiteContext, *, number: int) -> dict[str, Any]:
    data = ops_data(ctx)
    assert data is not None
    sample = data.samples[number]
    is_declared = declared_or_skip(ctx, sample)
    program = program_of(ctx, number)
    try:
        lowered = lower_programs(
            {"forward": program},
            ctx.backend,
            {"forward": {}},
            module_type=op_call_class(len(sample.inputs)),
            backend_version=ctx.registered.source.version,
        )
    except UnsupportedNodeError as exc:
        raise rejection(sample, exc, is_declared) from exc
    inputs = [t.clone() for t in sample.inputs]
    with torch.no_grad():
        actual = _compat.tree_leaves(lowered(*inputs))
    return verdict(ctx, sample, number, program, actual, inputs)


def declared_or_skip(ctx: SuiteContext, sample: discovery.OpSample) -> bool:
    """Whether the backend declares the sample's overload; raises `Unsupported` when it declares others only."""
    declared = ctx.capabilities.supported_ops
    if declared is not None and sample.overload not in declared:
        # The backend says it does not compile this overload: take it at its word (and save the time).
        raise Unsupported(f"{sample.overload} is not in the backend's Capabilities.supported_ops")
    return declared is not None


def rejection(sample: discovery.OpSample, exc: UnsupportedNodeError, is_declared: bool) -> Exception:
    """What a check raises when the backend rejects its op: unsupported, or failed where declared."""
    if is_declared:
        return CheckFailed(
            f"{sample.overload} in {sample.dtype}: the backend declares it in Capabilities.supported_ops "
            f"but rejected it: {Unsupported.from_rejection(exc)}"
        )
    return Unsupported.from_rejection(exc)


def verdict(
    ctx: SuiteContext,
    sample: discovery.OpSample,
    number: int,
    program: Any,
    actual: list[torch.Tensor],
    inputs: list[torch.Tensor],
    *,
    explain: bool = True,
) -> dict[str, Any]:
    """Judge the backend's outputs (``actual``) and its inputs after the call; the check's details, or raise.

    ``program`` is the sample's own single-op program; ``inputs`` are the
    clones of the sample's inputs the backend ran on (writes are judged on them).
    ``explain=False`` (a batch, whose failures run again alone) raises a bare
    `CheckFailed` and saves no inputs.
    """
    is_declared = ctx.capabilities.supported_ops is not None
    low_precision = bool(section("ops").get("low_precision_reference", True))
    try:
        results, reference = judge(ctx, sample, program, actual, inputs, low_precision)
    except StructureMismatch as exc:
        raise CheckFailed(_headline(sample, is_declared) + f": {exc}") from None
    except (InvalidIndices, WritesInPlace) as exc:
        raise CheckFailed(f"{_headline(sample, is_declared)}: {exc}") from None
    failing = [r for r in results if not r.passed]
    if failing and not explain:
        raise CheckFailed(f"{sample.name}: differs")
    if failing:
        saved = save_inputs(ctx, sample, number)
        top = worst(failing)
        rerun = rerun_command(ctx, saved)
        raise CheckFailed(
            f"{_headline(sample, is_declared)}: the backend's output differs from the reference ({reference.how}):\n"
            + "\n".join(r.text() for r in failing)
            + f"\n  inputs: {saved}\n  rerun this comparison: {rerun}"
            + (f"\n  worst closeness {top.closeness:.3g}" if top is not None else ""),
            details={"numerics": {**summary_json(results), "reference": reference.how}, **_undeclared(reference)},
            rerun=rerun,
        )
    return {"numerics": {**summary_json(results), "reference": reference.how}, **_undeclared(reference)}


def _undeclared(reference: Reference) -> dict[str, Any]:
    """The report's ``undeclared_writes``: each input eager writes undeclared, and what the backend did."""
    if not reference.undeclared:
        return {}
    return {"undeclared_writes": [{"input": i, "backend": what} for i, what in sorted(reference.undeclared.items())]}


class WritesInPlace(Exception):
    """The backend wrote to an input that eager PyTorch leaves alone."""


def judge(
    ctx: Judging,
    sample: discovery.OpSample,
    program: Any,
    actual: list[torch.Tensor],
    inputs: list[torch.Tensor],
    low_precision: bool,
) -> tuple[list[Closeness], Reference]:
    """Compare the backend's outputs (``actual``, from running on ``inputs``, clones of the sample's) with
    the reference: outputs, then the inputs the op writes.

    Raises `StructureMismatch`, `InvalidIndices` (a tie-open index output
    that selects other values than eager's) or `WritesInPlace`.
    """
    reference = reference_outputs(sample, program, low_precision)
    tolerance = tolerance_for(ctx, sample, reference.against_float64, output_dtypes(program))
    multiple = float(section("ops").get("eager_multiple", 2.0))
    if len(actual) == len(reference.truth):
        actual, _ = settle_ties(sample, actual, reference.truth)
    results = compare_outputs(actual, reference.truth, tolerance, reference.eager, multiple)
    declared = _declares_writes(sample)
    for i, (before, after) in enumerate(zip(sample.inputs, inputs)):
        if i in reference.writes and not declared:
            # Eager writes an input the schema does not declare written: the contract forbids execute to
            # change its inputs, so leaving it alone is right; the write is reported apart, not judged.
            # Written anyway, it must be eager's write (any other change is a change of the caller's tensor).
            if same_tensor(before, after):
                reference.undeclared[i] = "left unchanged (eager writes it; the schema declares no write)"
                continue
            written = compare_tensor(len(results), after, reference.writes[i], tolerance, None, multiple)
            if not written.passed:
                raise WritesInPlace(
                    f"execute() changed input {i} in place to other values than eager's: eager writes it although "
                    f"{sample.overload}'s schema declares no write, and a backend may leave it unchanged "
                    "(execute must not change its inputs) or write eager's values, nothing else"
                )
            reference.undeclared[i] = "written as eager writes it (the schema declares no write)"
        elif i in reference.writes:
            written = compare_tensor(
                len(results),
                after,
                reference.writes[i],
                tolerance,
                reference.eager_writes.get(i) if reference.against_float64 else None,
                multiple,
            )
            results.append(dataclasses.replace(written, label=f"input {i} (written by the op, as eager writes it)"))
        elif not same_tensor(before, after):
            raise WritesInPlace(f"execute() changed input {i} in place, which eager PyTorch leaves unchanged")
    return results, reference


def _declares_writes(sample: discovery.OpSample) -> bool:
    """Whether the op's schema declares any argument written (``Tensor(a!)``); unknown schema: True."""
    try:
        schema = _compat.op_schema(discovery.resolve_overload(sample.overload))
    except (AttributeError, RuntimeError):
        return True
    return schema is None or bool(schema.is_mutable)


def _headline(sample: discovery.OpSample, is_declared: bool) -> str:
    if sample.kind == "long":
        text = f"{sample.overload} in {sample.dtype} (long sample {sample.index}: a {sample.opinfo})"
    else:
        text = f"{sample.overload} in {sample.dtype} (sample {sample.index}, from OpInfo {sample.opinfo!r})"
    arguments = other_arguments(sample)
    if arguments:
        text += f", with {arguments}"
    return text + (" (declared in Capabilities.supported_ops)" if is_declared else "")


class _Tensor:
    """Stands for an input tensor while the sample's arguments are decoded for text."""


def other_arguments(sample: discovery.OpSample) -> str:
    """The call's arguments other than tensors, by schema name: ``kernel_size=[2, 2], divisor_override=2``.

    What a failure text needs besides the saved tensors, so that a reader sees
    at once which variant of the op failed (e.g. ``divisor_override``).
    """
    tensor = _Tensor()
    args = discovery.decode_arg(sample.args, [tensor] * len(sample.inputs))
    kwargs = discovery.decode_arg_dict(sample.kwargs, [tensor] * len(sample.inputs))
    try:
        schema = _compat.op_schema(discovery.resolve_overload(sample.overload))
    except (AttributeError, RuntimeError):
        schema = None
    names = [a.name for a in schema.arguments] if schema is not None else []
    pairs = [(names[i] if i < len(names) else f"arg{i}", v) for i, v in enumerate(args)] + list(kwargs.items())

    def has_tensor(value: Any) -> bool:
        return value is tensor or (isinstance(value, (list, tuple)) and any(has_tensor(v) for v in value))

    shown = [f"{name}={value!r}" for name, value in pairs if not has_tensor(value)]
    text = ", ".join(shown)
    return text if len(text) <= 300 else text[:297] + "..."


def save_inputs(ctx: SuiteContext, sample: discovery.OpSample, number: int) -> Path:
    """The sample's inputs and call, in a tensor file the rerun command reads (no code in it)."""
    directory = ctx.artifact_dir("ops-inputs")
    path = directory / f"{sample.overload}-{sample.dtype}-{sample.kind}{sample.index}.safetensors"
    record = sample.as_json()
    write_tensors(
        path,
        {f"input{i}": t for i, t in enumerate(sample.inputs)},
        {
            "kind": "ops",
            "sample": json.dumps(record),
            "backend": ctx.name,
            "low_precision_reference": str(bool(section("ops").get("low_precision_reference", True))),
        },
    )
    return path


def rerun_command(ctx: SuiteContext, path: Path) -> str:
    return ctx.rerun_command(path)


# --- several checks lowered as one (Capabilities(batch_ops=True)) ------------------------------
# Several ops checks lowered as one program: the engine's per-lowering cost paid once per batch.
#
# A real engine costs a second or more per lowering, however small the
# program; the ops category lowers one single-op program per check. Here the
# samples of a batch become one program (`build_batch_program`: each sample's
# placeholders and call side by side, no node shared), lowered and executed
# once; each sample's outputs are cut out and judged exactly as its own check
# judges them (`verdict`: the same inputs, reference and tolerance).
#
# What a batch decides, and what it leaves to the check run alone
# (`suite._batching` runs those, and bisects what this cannot attribute):
#
# - a sample whose outputs pass is decided ``passed``, with the numerics its
#   check alone reports;
# - a rejection (`UnsupportedNodeError`) at a sample's own call node is that
#   sample's outcome (its node keeps the name it has alone, so the text is the
#   same); the batch is lowered again without it. A rejection at any other
#   node (a placeholder, an output) sends that sample to run alone;
# - a sample whose comparison fails runs alone, so that its failure text,
#   saved inputs and rerun command are those of its own lowering;
# - a batch that fails otherwise (another lowering error, an error in
#   execute) is split.
#
# A crash or hang takes the host down during the batch: the suite side runs
# every member alone then, so that the host's isolation blames the right check.


def run_batch(ctx: SuiteContext, checks: list[Check]) -> dict[str, Any]:
    """Lower ``checks`` (ops checks of one dtype, distinct op names) as one program; see the section text."""
    from ...suite import run_check

    data = ops_data(ctx)
    assert data is not None
    decided: dict[str, CheckOutcome] = {}
    rejected: dict[str, CheckOutcome] = {}
    alone: list[str] = []
    pending: list[Check] = []
    named = 0  # the most nodes one rejection named
    for check in checks:
        sample = data.samples[check.batch.item]  # type: ignore[union-attr]
        try:
            declared_or_skip(ctx, sample)
        except Exception:  # not lowered at all: cheap alone
            alone.append(check.id)
            continue
        pending.append(check)
    while len(pending) > 1:
        samples = [data.samples[c.batch.item] for c in pending]  # type: ignore[union-attr]
        program, spans = build_batch_program(samples)
        try:
            lowered = lower_programs(
                {"forward": program},
                ctx.backend,
                {"forward": {}},
                module_type=op_call_class(sum(len(s.inputs) for s in samples)),
                backend_version=ctx.registered.source.version,
            )
        except UnsupportedNodeError as exc:
            owners = [_owner(one, pending, samples) for one in exc.rejections]
            if any(owner is None for owner in owners):
                return _result(decided, rejected, alone, pending, named)
            named = max(named, len(owners))
            mine: dict[str, int] = {}
            for check, _, _ in owners:  # type: ignore[misc]
                mine[check.id] = mine.get(check.id, 0) + 1
            for one, (check, sample, own_node) in zip(exc.rejections, owners):  # type: ignore[misc]
                if check not in pending:
                    continue
                if own_node and mine[check.id] == 1:
                    # The check alone is this one node's rejection: the same text, one node. A one-node
                    # rejection decides, as it always has; a list's entries wait for a rejection alone.
                    error = rejection(sample, _single(one), ctx.capabilities.supported_ops is not None)
                    raising = dataclasses.replace(check, run=functools.partial(_raise, error))
                    (decided if len(owners) == 1 else rejected)[check.id] = run_check(raising, ctx)
                else:
                    alone.append(check.id)
                pending.remove(check)
            continue
        except Exception:
            return _result(decided, rejected, alone, pending, named)
        inputs = [[t.clone() for t in s.inputs] for s in samples]
        try:
            with torch.no_grad():
                outputs = _compat.tree_leaves(lowered(*[t for own in inputs for t in own]))
        except Exception:
            return _result(decided, rejected, alone, pending, named)
        for check, sample, own, (start, stop) in zip(pending, samples, inputs, spans):
            number = check.batch.item  # type: ignore[union-attr]
            judged = functools.partial(_judge_part, sample, number, own, outputs[start:stop])
            outcome = run_check(dataclasses.replace(check, run=judged), ctx)
            if outcome.outcome == "passed":
                decided[check.id] = outcome
            else:
                alone.append(check.id)
        return _result(decided, rejected, alone, [], named)
    return _result(decided, rejected, alone + [c.id for c in pending], [], named)


def _result(
    decided: dict[str, CheckOutcome],
    rejected: dict[str, CheckOutcome],
    alone: list[str],
    split: list[Check],
    named: int,
) -> dict[str, Any]:
    """What `suite._batching` gets back, as JSON (it may come from the backend host): ``rejected`` are the
    outcomes of checks whose node a rejection naming several nodes named, which it takes only where the
    same rejection was seen alone before."""
    return {
        "decided": {i: outcome_to_json(o) for i, o in decided.items()},
        "rejected": {i: outcome_to_json(o) for i, o in rejected.items()},
        "alone": alone,
        "split": [c.id for c in split],
        "named": named,
    }


def _single(one: Any) -> UnsupportedNodeError:
    """One node of a rejection as the error the check alone gets: that node, its reason, its source line."""
    error = UnsupportedNodeError(one.node, one.reason)
    error.debug_info = one.debug_info
    return error


#: Names in a rejection's reason that may read otherwise alone: the batch's placeholders, and any quoted
#: name with a counter (``'convert_element_type_default_2'``: an engine numbers its nodes across the
#: whole program, so the other members' nodes move the counter).
_BATCH_DEPENDENT = re.compile(r"\bb\d+_input\d+\b|'[A-Za-z_][\w.]*_\d+'")


def _owner(one: Any, pending: list[Check], samples: list[Any]) -> tuple[Check, Any, bool] | None:
    """The check whose node was rejected (one `Rejection`), and whether its own reading holds; None: unknown.

    The reading holds where the node is the sample's call node and the
    reason quotes nothing the rest of the batch may have renamed.
    """
    node = getattr(one, "node", None)
    name = getattr(node, "name", None)
    if not isinstance(name, str):
        return None
    # A reason that names what the rest of the batch may have renamed would read otherwise alone: it runs alone.
    batch_names = _BATCH_DEPENDENT.search(str(getattr(one, "reason", "")))
    for k, (check, sample) in enumerate(zip(pending, samples)):
        if getattr(node, "op", None) == "call_function" and name == sample.overload.split(".")[1]:
            return check, sample, batch_names is None
        if name.startswith(f"b{k}_input"):
            return check, sample, False
    return None


def _raise(error: Exception, ctx: SuiteContext) -> Any:
    """The run of a batch's check that its lowering rejected: ``error`` (the outcome `run_check` makes of it)."""
    raise error


def _judge_part(
    sample: Any, number: int, inputs: list[torch.Tensor], actual: list[torch.Tensor], ctx: SuiteContext
) -> Any:
    """The run of a batch's check: one sample's part of the batch's outputs, judged as `check_op` judges it."""
    program = program_of(ctx, number)
    return verdict(ctx, sample, number, program, list(actual), inputs, explain=False)
