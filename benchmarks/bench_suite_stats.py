"""A pytest plugin (``-p bench_suite_stats``) that reports, from inside a suite run, what the benchmark needs.

``benchmarks/run.py`` runs the conformance suite in a subprocess with this
module on ``PYTHONPATH``. At session end it writes ``<pid>.json`` into the
folder named by ``$BACKENDCONF_BENCH_STATS`` (one file per process, so that
pytest-xdist workers each write theirs):

- ``exports``: every ``torch.export.export`` call of the process, however it
  was reached, and ``unique_exports``: how many distinct (model class,
  method code, input signature, weight dtype, constants' shapes, dynamic shapes) they were for;
- ``ctx_export_count`` / ``ctx_programs``: `SuiteContext.export_count` and
  the number of keys in its program cache, read from the context the
  conformance items share (``item.ctx``);
- ``repeated_exports``: the first few signatures exported more than once
  (module, class and input signature), to name what a cache missed;
- ``items`` (conformance items collected) and ``outcomes`` (per outcome;
  a delegation run skipped because the backend lowers the model whole is
  counted as ``not needed``, the report's own outcome for it).

Under pytest-xdist every worker collects every item and the controller
receives every report, so ``worker`` says which kind of process wrote the
file: the benchmark takes ``items`` from any one process and ``outcomes``
from the controller.
"""

from __future__ import annotations

import atexit
import collections
import json
import os
from typing import Any

import pytest

from pytest_backendconf.report import ReportTest

ENV = "BACKENDCONF_BENCH_STATS"

_exports: list[tuple] = []
_outcomes: collections.Counter = collections.Counter()
_worker = False


def pytest_configure(config: pytest.Config) -> None:
    global _worker
    if not os.environ.get(ENV):
        return
    _worker = hasattr(config, "workerinput")
    _count_exports()


def backendconf_register_cases(register: Any) -> None:
    """A backendconf hook (registering nothing), so that the suite's backend host imports this
    module too; there, where no pytest session ends, the exports are written at exit."""
    if os.environ.get(ENV) and not _counting:
        _count_exports()
        atexit.register(
            _write,
            {"items": 0, "contexts": 0, "ctx_export_count": 0, "ctx_programs": 0, "outcomes": {}, "worker": True},
        )


_counting = False


def _count_exports() -> None:
    global _counting
    _counting = True
    import torch.export

    original = torch.export.export
    if getattr(original, "_bench_counted", False):
        return

    def counted(mod: Any, args: tuple = (), kwargs: Any = None, *rest: Any, **options: Any) -> Any:
        # A dynamic-shape export of a model is another signature than its static one.
        _exports.append(_signature(mod, args, kwargs) + (repr(options.get("dynamic_shapes")),))
        return original(mod, args, kwargs, *rest, **options)

    counted._bench_counted = True  # type: ignore[attr-defined]
    torch.export.export = counted


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    if _worker:
        return
    test = (getattr(report, "backendconf", None) or {}).get("test")  # the gating plugin's record of the phase
    if test is not None and ReportTest.from_json(test).not_needed:
        _outcomes["not needed"] += 1
    elif report.when == "call" or report.outcome != "passed":
        _outcomes[f"{report.when}:{report.outcome}" if report.when != "call" else report.outcome] += 1


def pytest_sessionfinish(session: pytest.Session) -> None:
    folder = os.environ.get(ENV)
    if not folder:
        return
    contexts = {}
    items = 0
    for item in session.items:
        ctx = getattr(item, "ctx", None)
        if ctx is not None and hasattr(ctx, "export_count"):
            items += 1
            contexts[id(ctx)] = ctx
    # The checks run in the backend host: its counts come back to the context's `host`.
    hosts = [getattr(ctx, "host", None) for ctx in contexts.values()]
    _write(
        {
            "contexts": len(contexts),
            "ctx_export_count": sum(ctx.export_count for ctx in contexts.values()) + sum(h.exports for h in hosts if h),
            "ctx_programs": sum(len(ctx._programs) for ctx in contexts.values())
            + sum(len(h.programs) for h in hosts if h),
            "items": items,
            "outcomes": dict(_outcomes),
            "worker": _worker,
        }
    )


def _write(stats: dict) -> None:
    folder = os.environ.get(ENV)
    if not folder:
        return
    repeated = [k for k, n in collections.Counter(_exports).items() if n > 1]
    stats = {
        "exports": len(_exports),
        "unique_exports": len(set(_exports)),
        "repeated_exports": [f"{k[0]}.{k[1]} {k[5]}"[:200] for k in repeated[:5]],
        **stats,
    }
    with open(os.path.join(folder, f"{os.getpid()}.json"), "w", encoding="utf-8") as f:
        json.dump(stats, f)


def _signature(mod: Any, args: Any, kwargs: Any) -> tuple:
    import torch
    from torch.utils import _pytree as pytree

    cls = type(mod)
    code = getattr(getattr(cls, "forward", None), "__code__", None)
    leaves, tree = pytree.tree_flatten((args, kwargs or {}))
    described = tuple(
        ("tensor", str(v.dtype), tuple(v.shape)) if isinstance(v, torch.Tensor) else (type(v).__name__, repr(v))
        for v in leaves
    )
    weight = next((str(p.dtype) for p in mod.parameters()), None) if isinstance(mod, torch.nn.Module) else None
    # Two instances of one class can be two programs (a per-tensor and a per-channel weight): their
    # constants' shapes tell them apart.
    constants = (
        tuple((n, str(t.dtype), tuple(t.shape)) for n, t in (*mod.named_parameters(), *mod.named_buffers()))
        if isinstance(mod, torch.nn.Module)
        else ()
    )
    return (
        cls.__module__,
        cls.__qualname__,
        getattr(code, "co_filename", None),
        getattr(code, "co_firstlineno", None),
        str(tree),
        described,
        weight,
        constants,
    )
