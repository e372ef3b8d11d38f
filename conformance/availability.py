"""availability: the host/target tables of docs/backend-contract.md#availability, one check per row of ``availability.toml``.

Each row is put into effect with a *stand-in* (`_stand_in`): a copy of the
vendor's backend whose class overrides ``is_available``/``compile``/``execute``
to force the row's condition and count calls. Host rows run in this process.
Target rows load archives in the suite's extra process (`_extra_process`),
where the backend's host-only modules and torch's tracing modules cannot be
imported and the stand-in is registered under the backend's name. The
serialization category sends its target loads and fresh lowerings to the
same process.
"""

from __future__ import annotations

import functools
import os
import sys
import warnings
import weakref
from importlib import resources
from typing import TYPE_CHECKING, Any, Iterator

import torch

from pytest_backendconf import archive as _archive
from pytest_backendconf import lowering as _lowering
from pytest_backendconf.checks import Check, Unsupported, fail
from pytest_backendconf.errors import (
    BackendContractError,
    BackendUnavailableError,
    BackendUnavailableWarning,
    UnsupportedNodeError,
)

from .extra_process import session
from ._session_work import Lowering, Scenario, offer_at_hand
from ._spec import section
from .extra_process import StandIn

if TYPE_CHECKING:
    from pytest_backendconf.suite import SuiteContext

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib


@functools.cache
def table() -> dict[str, Any]:
    """``availability.toml``: ``texts`` and the ``row`` list, in table order."""
    return tomllib.loads(resources.files(__package__).joinpath("availability.toml").read_text())


def checks(ctx: SuiteContext) -> Iterator[Check]:
    for row in table()["row"]:
        yield Check(
            "availability",
            row["id"],
            functools.partial(OUTCOMES[row["expect"]], row=row),
            stage="is_available" if row["where"] == "host" else "target",
            # A row whose stand-in decides is_available() runs wherever the backend is; the others
            # need the backend itself available.
            needs_available=row.get("stand_in", {}).get("available", "backend") == "backend",
        )


# --- the archives the target rows load ----------------------------------------------------------


class _PreprocessOnly:
    """The backend, but unavailable to the lowering: it preprocesses and never compiles.

    Target rows get their archives this way, so that their verdict does not
    depend on the host compiling. The backend's own code is not affected.
    """

    def __init__(self, backend: Any) -> None:
        self._backend = backend
        self.name = backend.name

    def is_available(self) -> bool:
        return False

    def __getattr__(self, name: str) -> Any:
        return getattr(self._backend, name)


def load_with(backend: Any, data: bytes) -> Any:
    """`pytest_backendconf.load` of ``data``, with ``backend`` instead of the registered one."""
    return _lowering.instantiate(_archive.read_archive(data), backend)


# --- host rows ---------------------------------------------------------------------------


def subjects(ctx: SuiteContext) -> list[tuple[str, str]]:
    """(case, dtype) pairs the rows are checked with: suite.toml's cases, first dtype each."""
    found = []
    for name in section("availability")["cases"]:
        dtype = ctx.first_dtype(name)
        if dtype is not None:
            found.append((name, dtype))
    if not found:
        raise Unsupported(
            f"none of the availability cases {section('availability')['cases']} runs in a dtype the backend declares"
        )
    return found


def calls_for(ctx: SuiteContext, case: str, dtype: str) -> dict[str, list[tuple[tuple, dict]]]:
    """Per method, the example calls every row makes (one per seed in suite.toml)."""
    seeds = section("availability")["seeds"]
    return {m: [ctx.example(case, dtype, m, seed=s) for s in seeds] for m in ctx.cases[case].methods}


def _lower(ctx: SuiteContext, case: str, dtype: str, backend: Any) -> tuple[Any, list[warnings.WarningMessage]]:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        lowered = ctx.lower(case, dtype, backend=backend)
    return lowered, caught


def _each_supported(ctx: SuiteContext, check: Any) -> None:
    """Run ``check(case, dtype)`` for every subject; unsupported only if the backend rejects all."""
    rejected = []
    for case, dtype in subjects(ctx):
        try:
            check(case, dtype)
        except UnsupportedNodeError as exc:
            rejected.append(f"{case}: {Unsupported.from_rejection(exc)}")
    if len(rejected) == len(subjects(ctx)):
        raise Unsupported("; ".join(rejected))


def unavailable_on_host(ctx: SuiteContext, *, row: dict) -> None:
    texts = table()["texts"]
    warning = texts["warning"].format(name=ctx.name)

    def check(case: str, dtype: str) -> None:
        where = f"row {row['id']}, {case} ({dtype})"
        stand_in = StandIn(ctx.backend, **row["stand_in"], row=row["id"])
        try:
            lowered, caught = _lower(ctx, case, dtype, stand_in.backend)
        except UnsupportedNodeError:
            raise
        except Exception as exc:
            stand_in.expect_no_calls(f"{where}, lowering", "compile", "execute")
            fail(
                f"{where}: with is_available() False, lowering must succeed with a BackendUnavailableWarning; "
                f"it raised {type(exc).__name__}: {exc}"
            )
        texts_seen = [str(w.message) for w in caught if issubclass(w.category, BackendUnavailableWarning)]
        if not any(warning in t for t in texts_seen):
            others = [f"{w.category.__name__}: {w.message}" for w in caught]
            fail(f"{where}: lowering did not warn {warning!r}; warnings seen: {others or 'none'}")
        stand_in.expect_no_calls(f"{where}, lowering", "compile", "execute")
        try:
            data = _lowering.to_bytes(lowered)
        except Exception as exc:
            fail(f"{where}: saving the module lowered while unavailable raised {type(exc).__name__}: {exc}")
        _expect_unavailable(f"{where}: loading the saved archive", lambda: load_with(stand_in.backend, data))
        for method, [(args, kwargs), *_] in calls_for(ctx, case, dtype).items():
            _expect_unavailable(
                f"{where}: calling {method}()", lambda m=method, a=args, k=kwargs: getattr(lowered, m)(*a, **k)
            )
        stand_in.expect_no_calls(f"{where}, load and call", "compile", "execute")

    _each_supported(ctx, check)


def _expect_unavailable(what: str, action: Any) -> None:
    prefix = table()["texts"]["unavailable_error"]
    try:
        action()
    except BackendUnavailableError as exc:
        if not str(exc).startswith(prefix):
            fail(f"{what} raised BackendUnavailableError, but its text does not start {prefix!r}: {exc}")
        return
    except Exception as exc:
        fail(f"{what} must raise BackendUnavailableError starting {prefix!r}; it raised {type(exc).__name__}: {exc}")
    fail(f"{what} succeeded; with is_available() False it must raise BackendUnavailableError starting {prefix!r}")


def violation_on_host(ctx: SuiteContext, *, row: dict) -> None:
    violation = table()["texts"]["violation"]

    def check(case: str, dtype: str) -> None:
        where = f"row {row['id']}, {case} ({dtype})"
        stand_in = StandIn(ctx.backend, **row["stand_in"], row=row["id"])
        try:
            _lower(ctx, case, dtype, stand_in.backend)
        except UnsupportedNodeError:
            raise
        except BackendContractError as exc:
            if violation not in str(exc):
                fail(f"{where}: the BackendContractError does not name {violation!r}: {exc}")
        except Exception as exc:
            fail(
                f"{where}: is_available() True with compile() failing must be reported as a "
                f"BackendContractError naming {violation!r}; lowering raised {type(exc).__name__}: {exc}"
            )
        else:
            fail(
                f"{where}: is_available() returned True and compile() raised ({stand_in.calls['compile']} "
                "call(s)), yet lowering returned a module: the contract violation was not reported"
            )
        if stand_in.calls["execute"]:
            fail(f"{where}: execute() was called {stand_in.calls['execute']} time(s) after compile() failed")

    _each_supported(ctx, check)


def compiles_once(ctx: SuiteContext, *, row: dict) -> None:
    if ctx.backend.is_available() is not True:
        raise Unsupported(
            f"backend {ctx.name!r} reports is_available() == False on this host, so row {row['id']} "
            "cannot be shown here; run the suite where the backend is available"
        )

    def check(case: str, dtype: str) -> None:
        where = f"row {row['id']}, {case} ({dtype})"
        stand_in = StandIn(ctx.backend, row=row["id"])
        try:
            lowered, caught = _lower(ctx, case, dtype, stand_in.backend)
        except UnsupportedNodeError:
            raise
        except Exception as exc:
            fail(f"{where}: is_available() returned True on this host, but lowering raised {type(exc).__name__}: {exc}")
        warned = [str(w.message) for w in caught if issubclass(w.category, BackendUnavailableWarning)]
        if warned:
            fail(f"{where}: is_available() returned True, yet lowering warned: {warned[0]}")
        if stand_in.calls["compile"] != 1:
            fail(
                f"{where}: compile() was called {stand_in.calls['compile']} time(s) while lowering; "
                "with the backend available it must be called exactly once, with every method's blob"
            )
        calls = calls_for(ctx, case, dtype)
        for method, examples in calls.items():
            for seed, (args, kwargs) in zip(section("availability")["seeds"], examples):
                actual = getattr(lowered, method)(*args, **kwargs)
                _match_eager(ctx, case, dtype, method, seed, args, kwargs, actual, where)
        if stand_in.calls["compile"] != 1:
            fail(
                f"{where}: calls compiled again: compile() ran {stand_in.calls['compile']} times in all; "
                "a module compiled at lowering must reuse its handles"
            )

    _each_supported(ctx, check)


def _match_eager(
    ctx: SuiteContext, case: str, dtype: str, method: str, seed: int, args: tuple, kwargs: dict, actual: Any, where: str
) -> None:
    from .parity import tolerance  # parity imports Hypothesis: not in the target process

    expected = getattr(ctx.module(case, dtype), method)(*args, **kwargs)
    rtol, atol = tolerance(ctx, dtype)
    try:
        torch.testing.assert_close(actual, expected, rtol=rtol, atol=atol, equal_nan=True)
    except AssertionError as exc:
        fail(
            f"{where}: {case}.{method} (example seed {seed}) differs from eager PyTorch "
            f"(rtol={rtol}, atol={atol}):\n{exc}"
        )


# --- target rows -------------------------------------------------------------------------------

#: Per session: the cases whose archives could not be made, and why: the backend's rejection
#: (`Unsupported`: the case is left out of the target rows) or the text of a host failure.
_ARCHIVE_PROBLEMS: "weakref.WeakKeyDictionary[Any, dict[str, Unsupported | str]]" = weakref.WeakKeyDictionary()


def _scenario_key(row: dict, case: str) -> str:
    # Rows with the backend itself and intact blobs share one scenario (and one load).
    kind = row["id"] if "stand_in" in row or row["blobs"] != "intact" else "backend"
    return f"availability:{kind}/{case}"


@offer_at_hand
def items_at_hand(ctx: SuiteContext, asking: str) -> tuple[list[Scenario], list[Lowering]]:
    """Every target row's scenario (archives written now), once this category asks for the process."""
    return (availability_scenarios(ctx), []) if asking == "availability" else ([], [])


def availability_scenarios(ctx: SuiteContext) -> list[Scenario]:
    """Every target row's scenario for every subject, archives written now."""
    try:
        found_subjects = subjects(ctx)
    except Unsupported:
        return []
    directory = ctx.tmp_dir("availability-archives")
    problems = _ARCHIVE_PROBLEMS.setdefault(ctx, {})
    scenarios: dict[str, Scenario] = {}
    for case, dtype in found_subjects:
        try:
            made = _archives(ctx, case, dtype, directory)
        except UnsupportedNodeError as exc:
            problems[case] = Unsupported.from_rejection(exc)
            continue
        except Exception as exc:
            problems[case] = f"preprocessing it on the host failed: {type(exc).__name__}: {exc}"
            continue
        calls = calls_for(ctx, case, dtype)
        for row in table()["row"]:
            key = _scenario_key(row, case)
            if row["where"] == "target" and key not in scenarios:
                scenarios[key] = Scenario(
                    key, made[row["blobs"]], calls, row.get("stand_in"), row["id"], last=row["blobs"] != "intact"
                )
    return list(scenarios.values())


def _archives(ctx: SuiteContext, case: str, dtype: str, directory: Any) -> dict[str, str]:
    """Intact and truncated archives of one case, preprocessed without compiling."""
    from pytest_backendconf.lowering import LoweredModule

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", BackendUnavailableWarning)
        lowered = ctx.lower(case, dtype, backend=_PreprocessOnly(ctx.backend)).lowered
    truncated = LoweredModule(
        ctx.backend,
        lowered.methods,
        {m: b[: len(b) // 2] for m, b in lowered.blobs.items()},
        lowered.debug,
        backend_version=lowered.backend_version,
    )
    paths = {}
    for kind, module in (("intact", lowered), ("truncated", truncated)):
        paths[kind] = os.path.join(str(directory), f"{case}-{kind}.bcpt")
        _lowering.save(module, paths[kind])
    return paths


def _target_results(ctx: SuiteContext, row: dict) -> Iterator[tuple[str, str, str, dict]]:
    """(case, dtype, where, result) of this row's scenario for every subject that has an archive."""
    found = session(ctx, "availability")
    problems = _ARCHIVE_PROBLEMS.get(ctx, {})
    ran = False
    for case, dtype in subjects(ctx):
        problem = problems.get(case)
        if isinstance(problem, str):
            fail(f"row {row['id']}, {case} ({dtype}): no archive for the target: {problem}")
        if problem is None:
            ran = True
            yield (
                case,
                dtype,
                f"row {row['id']}, {case} ({dtype}) on the target",
                found.result(_scenario_key(row, case)),
            )
    if not ran:
        raise Unsupported("; ".join(str(problem) for problem in problems.values()))


def _error_text(result: dict) -> str:
    error = result["error"]
    return f"{error['type']}: {error['message']}" if error else "no error"


def unavailable_on_target(ctx: SuiteContext, *, row: dict) -> None:
    prefix = table()["texts"]["unavailable_error"]
    for _case, _dtype, where, result in _target_results(ctx, row):
        if result["loaded"]:
            fail(
                f"{where}: the archive loaded although is_available() is False there; load must raise "
                f"BackendUnavailableError starting {prefix!r}"
            )
        error = result["error"]
        if error["type"] != "BackendUnavailableError" or not error["message"].startswith(prefix):
            fail(
                f"{where}: load must raise BackendUnavailableError starting {prefix!r}; it raised {_error_text(result)}"
            )


def violation_on_target(ctx: SuiteContext, *, row: dict) -> None:
    violation = table()["texts"]["violation"]
    for _case, _dtype, where, result in _target_results(ctx, row):
        if result["loaded"]:
            fail(
                f"{where}: is_available() returned True and compile() raised, yet the archive loaded: "
                "the contract violation was not reported"
            )
        error = result["error"]
        if error["type"] != "BackendContractError" or violation not in error["message"]:
            fail(f"{where}: load must raise BackendContractError naming {violation!r}; it raised {_error_text(result)}")


def blob_not_ready(ctx: SuiteContext, *, row: dict) -> None:
    for _case, _dtype, where, result in _target_results(ctx, row):
        if result["loaded"]:
            fail(
                f"{where}: the archive with blobs cut to half their length loaded; compile() must reject a "
                "blob that is not ready, so that load fails with a clear error"
            )
        error = result["error"]
        if error["type"] in ("TargetCrashError", "TargetTimeoutError", "TargetNotRunError"):
            fail(
                f"{where}: loading blobs cut to half their length must fail with a clear error, never a crash "
                f"or a hang: {_error_text(result)}"
            )
        if not error["message"].strip():
            fail(f"{where}: loading truncated blobs raised {error['type']} with an empty message")


def loads_on_target(ctx: SuiteContext, *, row: dict) -> None:
    _runs_on_target(ctx, row, first_call_only=True)


def runs_on_target(ctx: SuiteContext, *, row: dict) -> None:
    _runs_on_target(ctx, row, first_call_only=False)


def _runs_on_target(ctx: SuiteContext, row: dict, *, first_call_only: bool) -> None:
    seeds = section("availability")["seeds"]
    for case, dtype, where, result in _target_results(ctx, row):
        if not result["loaded"]:
            fail(
                f"{where}: the archive did not load with {', '.join(result['blocked'])} blocked: {_error_text(result)}"
            )
        for method, examples in calls_for(ctx, case, dtype).items():
            for i, (seed, (args, kwargs)) in enumerate(zip(seeds, examples)):
                if first_call_only and i:
                    break
                error = result["errors"][method][i]
                if error is not None:
                    fail(
                        f"{where}: call {i + 1} of {method}() (example seed {seed}) raised "
                        f"{error['type']}: {error['message']}"
                    )
                _match_eager(ctx, case, dtype, method, seed, args, kwargs, result["outputs"][method][i], where)


#: ``expect`` in availability.toml → the procedure that checks the row's outcome.
OUTCOMES = {
    "unavailable_on_host": unavailable_on_host,
    "violation_on_host": violation_on_host,
    "compiles_once": compiles_once,
    "unavailable_on_target": unavailable_on_target,
    "loads_on_target": loads_on_target,
    "blob_not_ready": blob_not_ready,
    "violation_on_target": violation_on_target,
    "runs_on_target": runs_on_target,
}
