"""serialization: archives keep a lowered module whole (docs/archive-format.md).

For every model (first dtype): the module loaded from its archive gives the
same outputs as the one saved, saving it again gives the same bytes, and it
loads and runs in the target process. For a few models (``suite.toml``):
the compile spec, debug info and wrapper attributes survive, and lowering in
a fresh process gives a byte-identical archive. The target loads and the
fresh lowering run in the suite's extra process (`_extra_process`).
"""

from __future__ import annotations

import functools
from typing import TYPE_CHECKING, Any, Iterator

import torch

import pytest_backendconf as bc
from pytest_backendconf import archive as _archive
from pytest_backendconf import lowering as _lowering
from pytest_backendconf._compat import tree_map
from pytest_backendconf.checks import Check, Unsupported, fail
from pytest_backendconf.errors import UnsupportedNodeError

from .._spec import section
from .._session_work import Lowering, Scenario, offer_at_hand
from ._saved_archives import SavedLowerings, serialization_check, target_scenario
from .._session_work import same_outputs as _same
from ..extra_process import session

if TYPE_CHECKING:
    from pytest_backendconf.suite import SuiteContext


def checks(ctx: SuiteContext) -> Iterator[Check]:
    cases = [(name, dtype) for name in ctx.cases if (dtype := ctx.first_dtype(name)) is not None]
    spec = section("serialization")
    per_case = [(check_round_trip, "load"), (check_resave_is_byte_identical, "save")]
    for name, dtype in cases:
        for check, stage in per_case:
            yield serialization_check(check, name, dtype, stage)
    for name, dtype in cases:
        if name in spec["state_cases"]:
            yield serialization_check(check_compile_spec_and_debug_info_survive, name, dtype, "save")
            yield serialization_check(check_wrapper_attributes_survive, name, dtype, "save")
    for name, dtype in cases:
        yield serialization_check(check_target_round_trip, name, dtype, "target")
    for name, dtype in cases:
        if name in spec["deterministic_cases"]:
            yield serialization_check(check_deterministic_lowering, name, dtype, "preprocess")
    from . import _dynamic_archives
    from . import backend_versions

    yield from _dynamic_archives.checks(ctx)
    yield from backend_versions.checks(ctx, _saved, call_fresh)


# --- what every check shares: the lowered module, its archive, its outputs ---------------------


class _Saved:
    """One case's shared lowering, its archive, and (computed when first asked) outputs and a loaded copy."""

    def __init__(self, lowered: Any, calls: dict[str, list[tuple[tuple, dict]]]) -> None:
        self.lowered = lowered
        self.data = _lowering.to_bytes(lowered)
        #: Per method, the example calls (one per seed in suite.toml).
        self.calls = calls

    @functools.cached_property
    def outputs(self) -> dict[str, list[Any]]:
        """Per method, the lowered module's outputs for `calls` (each call on fresh copies of the inputs)."""
        return {
            m: [call_fresh(getattr(self.lowered, m), a, k) for a, k in examples] for m, examples in self.calls.items()
        }

    @functools.cached_property
    def loaded(self) -> Any:
        """`load` of `data`, or the exception it raised."""
        try:
            return bc.load(self.data)
        except Exception as exc:
            return exc


_SAVED: SavedLowerings[_Saved] = SavedLowerings()


def _saved(ctx: SuiteContext, case: str, dtype: str) -> _Saved:
    """The case's shared lowering (the one parity uses), saved once per session."""

    def save() -> _Saved:
        try:
            lowered = ctx.lower(case, dtype)
        except UnsupportedNodeError as exc:
            raise Unsupported.from_rejection(exc) from exc
        seeds = section("serialization")["seeds"]
        calls = {m: [ctx.example(case, dtype, m, seed=s) for s in seeds] for m in ctx.cases[case].methods}
        return _Saved(lowered, calls)

    return _SAVED.get(ctx, case, save)


def _loaded(ctx: SuiteContext, case: str, dtype: str) -> tuple[_Saved, Any]:
    saved = _saved(ctx, case, dtype)
    if isinstance(saved.loaded, Exception):
        exc = saved.loaded
        fail(f"{case} ({dtype}): loading the archive just saved raised {type(exc).__name__}: {exc}")
    return saved, saved.loaded


def call_fresh(function: Any, args: tuple, kwargs: dict) -> Any:
    """``function(*args, **kwargs)`` on copies of the inputs: a backend that writes to its inputs
    (which the parity and reliability checks report) must not make the archive look different here."""
    args, kwargs = tree_map(lambda v: v.clone() if isinstance(v, torch.Tensor) else v, (args, kwargs))
    return function(*args, **kwargs)


# --- per case ----------------------------------------------------------------------------------


def check_round_trip(ctx: SuiteContext, *, case: str, dtype: str) -> None:
    saved, loaded = _loaded(ctx, case, dtype)
    seeds = section("serialization")["seeds"]
    for method, examples in saved.calls.items():
        for seed, (args, kwargs), expected in zip(seeds, examples, saved.outputs[method]):
            problem = _same(call_fresh(getattr(loaded, method), args, kwargs), expected)
            if problem:
                fail(
                    f"{case}.{method} ({dtype}), example seed {seed}: the module loaded from its archive "
                    f"differs from the lowered module it was saved from (exact comparison):\n{problem}"
                )


def check_resave_is_byte_identical(ctx: SuiteContext, *, case: str, dtype: str) -> None:
    saved, loaded = _loaded(ctx, case, dtype)
    again = _lowering.to_bytes(loaded)
    if again != saved.data:
        fail(
            f"{case} ({dtype}): save(load(archive)) is not byte-identical to the archive: "
            f"{archive_difference(saved.data, again)}"
        )


def archive_difference(first: bytes, second: bytes) -> str:
    """Which entries of two archives differ, and where in a differing blob."""
    try:
        a, b = _archive.read_archive(first), _archive.read_archive(second)
    except Exception as exc:
        return f"an archive does not read back: {type(exc).__name__}: {exc}"
    entries_a = {e.name: e for e in a.entries}
    entries_b = {e.name: e for e in b.entries}
    differing = [
        n
        for n in sorted(entries_a.keys() | entries_b.keys())
        if n not in entries_a or n not in entries_b or entries_a[n].sha256 != entries_b[n].sha256
    ]
    if not differing:
        return f"the entries are equal, the zip layout is not ({len(first)} vs {len(second)} bytes)"
    notes = []
    for name in differing:
        if name.startswith("blobs/") and name in entries_a and name in entries_b:
            method = name.removeprefix("blobs/").removesuffix(".bin")
            x, y = a.blobs[method], b.blobs[method]
            at = next((i for i, (p, q) in enumerate(zip(x, y)) if p != q), min(len(x), len(y)))
            notes.append(f"{name} ({len(x)} vs {len(y)} bytes, first difference at byte {at})")
        else:
            notes.append(name if name in entries_a and name in entries_b else f"{name} (only in one)")
    return "entries " + ", ".join(notes) + " differ"


# --- compile spec, debug info, wrapper attributes -----------------------------------------------


def _compile_spec(ctx: SuiteContext, case: str, dtype: str) -> dict[str, dict]:
    """A non-trivial compile spec where the backend declares one it honours (the fault key), else ``{}``."""
    spec: dict[str, dict] = {}
    for method in ctx.cases[case].methods:
        node = None
        if ctx.capabilities.fault_injection:
            program = ctx.program(case, dtype, method)
            node = next((n.name for n in program.graph.nodes if n.op == "call_function"), None)
        spec[method] = {"__backendconf_fault__": {"node": node}} if node else {}
    return spec


def check_compile_spec_and_debug_info_survive(ctx: SuiteContext, *, case: str, dtype: str) -> None:
    spec = _compile_spec(ctx, case, dtype)
    try:
        lowered = ctx.lower(case, dtype, spec)
    except UnsupportedNodeError as exc:
        raise Unsupported.from_rejection(exc) from exc
    data = _lowering.to_bytes(lowered)
    manifest_spec = _archive.read_archive(data).method_compile_spec
    if manifest_spec != spec:
        fail(
            f"{case} ({dtype}): the archive's manifest records the method compile spec {manifest_spec!r}; "
            f"the module was lowered with {spec!r}"
        )
    loaded = bc.load(data)
    got = {name: m.compile_spec for name, m in loaded.lowered.methods.items()}
    if got != spec:
        fail(f"{case} ({dtype}): after load the method compile spec is {got!r}; it was lowered with {spec!r}")
    before, after = bc.debug_info(lowered), bc.debug_info(loaded)
    if before.keys() != after.keys():
        lost, new = sorted(before.keys() - after.keys()), sorted(after.keys() - before.keys())
        fail(f"{case} ({dtype}): debug handles changed in the round trip: lost {lost[:10]}, gained {new[:10]}")
    for handle, info in before.items():
        if after[handle] != info or str(after[handle]) != str(info):
            fail(
                f"{case} ({dtype}): debug info of handle {handle} changed in the round trip.\n"
                f"before:\n{info}\nafter:\n{after[handle]}"
            )
    if loaded.lowered.backend_version != lowered.lowered.backend_version:
        fail(
            f"{case} ({dtype}): the backend version {lowered.lowered.backend_version!r} came back as "
            f"{loaded.lowered.backend_version!r}"
        )


def _attributes() -> dict[str, Any]:
    # One of each kind the design promises: tensors, numbers, strings, lists and dicts of them.
    return {
        "calibration": torch.linspace(-1.0, 1.0, 6).reshape(2, 3),
        "class_ids": torch.tensor([3, 1, 4], dtype=torch.int64),
        "version": 7,
        "threshold": 0.125,
        "label": "backendconf round trip",
        "steps": [1, 2.5, "three", torch.ones(2, dtype=torch.bool)],
        "meta": {"name": "zoo", "sizes": [2, 3], "scale": 1.5},
    }


def check_wrapper_attributes_survive(ctx: SuiteContext, *, case: str, dtype: str) -> None:
    try:
        lowered = ctx.lower(case, dtype, cache=False)  # our own module: we add attributes to it
    except UnsupportedNodeError as exc:
        raise Unsupported.from_rejection(exc) from exc
    expected = _attributes()
    for name, value in expected.items():
        setattr(lowered, name, value)
    data = _lowering.to_bytes(lowered)
    loaded = bc.load(data)
    for name, value in expected.items():
        if not hasattr(loaded, name):
            fail(f"{case} ({dtype}): attribute {name!r} set on the lowered module after lowering is missing after load")
        problem = _same_value(getattr(loaded, name), value)
        if problem:
            fail(f"{case} ({dtype}): attribute {name!r} set after lowering came back changed: {problem}")
    again = _lowering.to_bytes(loaded)
    if again != data:
        fail(
            f"{case} ({dtype}): with attributes, save(load(archive)) is not byte-identical: "
            f"{archive_difference(data, again)}"
        )


def _same_value(got: Any, want: Any) -> str | None:
    if type(got) is not type(want) and not (isinstance(want, torch.Tensor) and isinstance(got, torch.Tensor)):
        return f"{type(got).__name__} {got!r} instead of {type(want).__name__} {want!r}"
    if isinstance(want, torch.Tensor):
        if got.dtype != want.dtype or got.shape != want.shape or not torch.equal(got, want):
            return f"tensor {got!r} instead of {want!r}"
        return None
    if isinstance(want, (list, tuple)):
        if len(got) != len(want):
            return f"{len(got)} items instead of {len(want)}: {got!r}"
        return next((f"item {i}: {p}" for i, (g, w) in enumerate(zip(got, want)) if (p := _same_value(g, w))), None)
    if isinstance(want, dict):
        if list(got) != list(want):
            return f"keys {list(got)} instead of {list(want)}"
        return next((f"key {k!r}: {p}" for k in want if (p := _same_value(got[k], want[k]))), None)
    return None if got == want else f"{got!r} instead of {want!r}"


# --- the target process and the fresh lowering (_extra_process runs both, _session_work has the records)


def _scenario(ctx: SuiteContext, case: str) -> Scenario:
    saved = _SAVED.of(ctx)[case]
    return target_scenario(ctx, f"serialization:{case}", f"{case}.bcpt", saved.data, saved.calls)


@offer_at_hand
def items_at_hand(ctx: SuiteContext, asking: str) -> tuple[list[Scenario], list[Lowering]]:
    """What the session's first extra process can carry without lowering anything here.

    Every case already saved or lowered: in the default order parity has
    lowered them all, and the process does everything at once; when only
    some checks were selected, it carries nobody's work but theirs.
    """
    scenarios = []
    for case in ctx.cases.values():
        dtype = ctx.first_dtype(case.name)
        if dtype is not None and _at_hand(ctx, case.name):
            try:
                _saved(ctx, case.name, dtype)
            except Exception:  # Unsupported, or broken: the case's own checks report it
                continue
            scenarios.append(_scenario(ctx, case.name))
    from ._dynamic_archives import scenarios_at_hand

    scenarios += scenarios_at_hand(ctx)
    return scenarios, _lowerings(ctx)


def _at_hand(ctx: SuiteContext, case: str) -> bool:
    dtype = ctx.first_dtype(case)
    return dtype is not None and (case in _SAVED.of(ctx) or ctx.has_lowered(case, dtype))


def _lowerings(ctx: SuiteContext, *, also: str | None = None) -> list[Lowering]:
    """The fresh lowerings of the deterministic cases at hand (saved or lowered here already) and of ``also``.

    Only those: under pytest-xdist another worker has the other cases, and
    lowering them here would repeat its work.
    """
    cases = [
        (c, dtype)
        for c in section("serialization")["deterministic_cases"]
        if (dtype := ctx.first_dtype(c)) is not None and (c == also or _at_hand(ctx, c))
    ]
    found = []
    for case, dtype in cases:
        try:
            saved = _saved(ctx, case, dtype)
        except Exception:
            continue
        spec: dict[str, dict[str, Any]] = {m: {} for m in saved.lowered.lowered.methods}
        found.append(Lowering(f"fresh:{case}", case, dtype, spec))
    return found


def check_target_round_trip(ctx: SuiteContext, *, case: str, dtype: str) -> None:
    from ..parity import tolerance

    saved = _saved(ctx, case, dtype)
    runs = session(ctx, "serialization")
    with _SAVED.lock:
        if f"serialization:{case}" not in runs.placed:
            # One process for every case saved so far that none holds yet.
            runs.place([_scenario(ctx, c) for c in _SAVED.of(ctx) if f"serialization:{c}" not in runs.placed], [])
    result = runs.result(f"serialization:{case}")
    if not result["loaded"]:
        error = result["error"]
        fail(
            f"{case} ({dtype}): the archive did not load on the target ({', '.join(result['blocked'])} "
            f"blocked): {error['type']}: {error['message']}"
        )
    rtol, atol = tolerance(ctx, dtype)
    seeds = section("serialization")["seeds"]
    for method, expected in saved.outputs.items():
        for i, (seed, want) in enumerate(zip(seeds, expected)):
            error = result["errors"][method][i]
            if error is not None:
                fail(
                    f"{case}.{method} ({dtype}), example seed {seed}, on the target: {error['type']}: {error['message']}"
                )
            problem = _same(result["outputs"][method][i], want, rtol=rtol, atol=atol)
            if problem:
                fail(
                    f"{case}.{method} ({dtype}), example seed {seed}: on the target the archive gives other "
                    f"outputs than the lowered module on the host (rtol={rtol}, atol={atol}):\n{problem}"
                )


def check_deterministic_lowering(ctx: SuiteContext, *, case: str, dtype: str) -> None:
    saved = _saved(ctx, case, dtype)
    runs = session(ctx, "serialization")
    runs.place([], _lowerings(ctx, also=case))
    result = runs.result(f"fresh:{case}")
    if result.get("error"):
        fail(
            f"{case} ({dtype}): lowering it again in a fresh process failed: {result['error']['type']}: "
            f"{result['error']['message']}"
        )
    with open(result["archive"], "rb") as f:
        fresh = f.read()
    if fresh != saved.data:
        fail(
            f"{case} ({dtype}): lowering it in a fresh process gives a different archive: "
            f"{archive_difference(saved.data, fresh)}. Is preprocess() deterministic across processes "
            "(no addresses, process ids, times, or orders of hashed strings in the blob)?"
        )
