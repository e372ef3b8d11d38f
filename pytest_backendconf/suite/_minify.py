"""Minimal reproductions of the suite's model failures, written as scripts beside the run.

When a parity or contract check of a model fails by a crash, a hang, an
error the backend did not declare (any exception but the suite's own
verdicts) or a divergence the locator pinned to a node, the model's program
is shrunk with `diagnostics.minify` under the matching predicate (the same
exit code or signal, a hang, the same exception type naming the same
operator, a divergence at the same operator) and written as
``repro_<check>.py`` plus its tensor file. The failure text then ends with
``minimal reproduction: N nodes, <path>``. A failure that is listed as
known, a passing check, and ``--backendconf-minify=off`` never get here.
One model failing several checks the same way is shrunk once, and so is
one failure group (its failure template and the operator or error it fails
at): a later failure of the group names the first one's reproduction. The
run's time for reproductions is bounded (`_minify_ledger`); once it is
spent, a failure says in one line that its reproduction was skipped.
"""

from __future__ import annotations

import json
import os
import re
import threading
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable

import pytest

from ..checks import ROOT_ID, Check, CheckContext
from ..report import counted, failure_template
from ._host import NOT_RUN_AGAIN
from ._minify_ledger import MinifyLedger

if TYPE_CHECKING:
    from torch.export import ExportedProgram

    from ..diagnostics import Outcome
    from ._context import SuiteContext

#: The default of ``--backendconf-minify`` when the command line does not give it (the project's own
#: tests set it to ``off``: their many deliberately failing runs test other things).
MINIFY_ENV = "BACKENDCONF_MINIFY"
#: The categories whose model checks are shrunk: they lower and run the model's whole program.
MINIFIED_CATEGORIES = ("parity", "contract")
#: Failures that are the suite's own verdicts, not an error the backend raised.
_VERDICTS = ("CheckFailed", "HostCheckFailed", "_Differs", "AssertionError")
_DIVERGES = re.compile(r"Diverges first at node '[^']+' \(([^)]+)\)")
_SAVED_INPUTS = re.compile(r"^\s*inputs: (\S+\.safetensors)\s*$", re.MULTILINE)


def minify_choice(config: pytest.Config) -> bool:
    """``--backendconf-minify``, else ``$BACKENDCONF_MINIFY``, else on."""
    value = config.getoption("backendconf_minify", None) or os.environ.get(MINIFY_ENV) or "on"
    if value not in ("on", "off"):
        raise pytest.UsageError(f"{MINIFY_ENV}={value!r}: use 'on' or 'off' (or --backendconf-minify=on|off)")
    return value == "on"


def reproduction_dir(config: pytest.Config) -> Path:
    """The one folder where reproduction scripts and their tensor files are written.

    Under ``--backendconf-artifacts`` when given (kept across runs, beside the
    saved inputs and rerun files), else under pytest's temporary directory
    (``--basetemp``), as the saved inputs of failing comparisons are.
    """
    from ._options import artifacts_root

    root = artifacts_root(config)
    factory = getattr(config, "_tmp_path_factory", None)
    base = Path(root) if root else Path(factory.getbasetemp()) if factory is not None else Path.cwd()
    folder = base / "reproductions"
    folder.mkdir(parents=True, exist_ok=True)
    return folder


def target_of(error: dict | None, message: str, ended: dict | None) -> Outcome | None:
    """The failure to reproduce (`diagnostics.Outcome`), or ``None`` for a failure that is not shrunk."""
    from ..diagnostics import Outcome

    if ended is not None:
        if ended.get("timed_out") is not None:
            return Outcome("timed_out")
        if ended.get("killed_because"):  # the memory limit: a leak over calls, not one program's
            return None
        return Outcome("crashed", returncode=ended.get("returncode"))
    kind = (error or {}).get("type", "")
    if kind == NOT_RUN_AGAIN:  # failed at once: the check that hung or crashed is shrunk, not this one
        return None
    if kind in _VERDICTS or not kind:
        found = _DIVERGES.search(message)
        return Outcome("diverged", op=found.group(1)) if found else None
    return Outcome("raised", error_type=kind, message=(error or {}).get("message", message))


class Minimiser:
    """Shrinks the failures of one pytest process, once per model and kind of failure and once per failure group,
    within the run's budget (`MinifyLedger`, shared with the run's other pytest-xdist workers)."""

    def __init__(
        self,
        config: pytest.Config,
        budget: float,
        timeout: Callable[[], float | None],
        ledger: MinifyLedger | None = None,
    ) -> None:
        self.config = config
        self.budget = budget
        #: Each candidate's timeout, asked anew per failure (it shortens once the backend has hung).
        self.timeout = timeout
        self.ledger = ledger if ledger is not None else MinifyLedger(None, None)
        self._memo: dict[tuple, dict | None] = {}
        self._lock = threading.Lock()

    def reproduce(
        self, check: Check, ctx: SuiteContext, error: dict | None, message: str, ended: dict | None
    ) -> dict | None:
        """The reproduction's record for the report (``script``, ``nodes``, ``ops`` …), or ``None``."""
        where = _subject(check, ctx)
        if where is None:
            return None
        target = target_of(error, message, ended)
        if target is None:
            return None
        case, dtype, method = where
        key = (case, dtype, method, target)
        with self._lock:  # one shrinking at a time: each is a child process on a shared machine
            if key not in self._memo:
                self._memo[key] = self._once_per_group(check, ctx, where, target, error, message)
            return self._memo[key]

    def _once_per_group(
        self,
        check: Check,
        ctx: SuiteContext,
        where: tuple[str, str, str],
        target: Outcome,
        error: dict | None,
        message: str,
    ) -> dict:
        """The failure's reproduction: made when it is the first of its group and the run's budget is not spent."""
        group = json.dumps(
            [
                failure_template(str((error or {}).get("type", "failure")), message),
                target.kind,
                target.op,
                target.error_type,
                target.returncode,
            ]
        )
        verdict, found = self.ledger.claim(group, f"{ROOT_ID}::{check.id}")  # as the report names it
        if verdict == "same":
            prior = dict(found.get("record") or {})
            prior.pop("seconds", None)  # spent once, by the first
            if not prior:  # another pytest-xdist worker is making it now
                prior = {"script": None, "note": f"the same failure as {found['check']}, shrunk once for both"}
            return {**prior, "same_as": found["check"]}
        if verdict == "spent":
            spent = self.ledger.budget or 0.0
            return {
                "script": None,
                "skipped": True,
                "run_budget": spent,
                "note": f"skipped: the run's {spent:g} s for minimal reproductions (--backendconf-minify-run-budget) "
                "are spent; rerun this check alone (its reproduce command) to get one",
            }
        started = time.monotonic()
        budget = self.budget if found is None else min(self.budget, found)
        record = self._shrink(check, ctx, *where, target, message, budget)
        spent = time.monotonic() - started
        record.setdefault("seconds", round(spent, 1))  # also when it could not shrink: the time is spent
        if self.ledger.budget is not None:
            record["run_budget"] = self.ledger.budget
        self.ledger.done(group, record, spent)
        return record

    def _shrink(
        self,
        check: Check,
        ctx: SuiteContext,
        case: str,
        dtype: str,
        method: str,
        target: Outcome,
        message: str,
        budget: float,
    ) -> dict:
        from ..diagnostics import minify, same_failure, script_stem, write_script
        from ..target import active_plugins

        try:
            program = ctx.program(case, dtype, method)
            inputs = _inputs(ctx, program, case, dtype, method, message if target.kind == "diverged" else "")
            tolerance = _tolerance(ctx, case, dtype) if target.kind == "diverged" else None
            plugins = active_plugins()
            found = minify(
                program,
                ctx.name,
                inputs,
                same_failure(target),
                budget=budget,
                timeout=self.timeout(),
                tolerance=tolerance,
                plugins=plugins,
            )
        except Exception as exc:  # a diagnosis: never hide the failure behind it
            return {"script": None, "note": f"could not minimise: {type(exc).__name__}: {exc}"}
        # The per-failure budget, as the summary names it: trimmed to what the run's budget had left.
        record: dict[str, Any] = {
            "script": None,
            "nodes": None,
            "ops": list(found.ops),
            "original_nodes": found.original_nodes,
            "budget_ran_out": found.budget_ran_out,
            "budget": budget,  # the summary names it, also when it is read back from the report
            "seconds": round(found.seconds, 1),
        }
        if found.program is None:
            record["note"] = (
                f"the {budget:g} s budget (--backendconf-minify-budget) ran out before a smaller program failed"
                if found.budget_ran_out
                else "the failure did not reproduce on the model's program alone"
            )
            return record
        try:
            script = write_script(
                found,
                reproduction_dir(self.config),
                script_stem(check.id),
                backend=ctx.name,
                plugins=plugins,
                title=f"backendconf::{check.id} on backend {ctx.name!r}",
                subject=f"model {case} ({dtype}, method {method})",
                tolerances=[tolerance] * len(found.output_ops) if tolerance is not None else None,
            )
        except Exception as exc:
            record["note"] = f"could not write the script: {type(exc).__name__}: {exc}"
            return record
        record.update(script=str(script), nodes=len(found.ops), inputs=str(script.with_suffix(".safetensors")))
        return record


def reproduction_line(record: dict | None) -> str:
    """``minimal reproduction: 1 node, /tmp/…/repro_parity_x_float16.py`` (or why there is none)."""
    if not record:
        return ""
    if record.get("script") is None:
        return f"minimal reproduction: none ({record.get('note', 'not found')})"
    nodes = record["nodes"]
    ran_out = "; the budget ran out: the smallest found" if record.get("budget_ran_out") else ""
    same = f" (the same failure as {record['same_as']})" if record.get("same_as") else ""
    return f"minimal reproduction{same}: {counted(nodes, 'node')}{ran_out}, {record['script']}"


def _subject(check: Check, ctx: CheckContext) -> tuple[str, str, str] | None:
    """``(case, dtype, method)`` of a model check that is shrunk, else ``None``."""
    if check.category not in MINIFIED_CATEGORIES or check.case is None or check.case not in ctx.cases:
        return None
    case = ctx.cases[check.case]
    base, _, bracket = check.name.rpartition("[")
    bracket = bracket.rstrip("]")
    if check.category == "parity":
        if bracket not in ctx.dtypes_for(case):  # the dynamic-shape checks: no single static program
            return None
        method = base[len(check.case) + 1 :] if base.startswith(check.case + ".") else "forward"
        return check.case, bracket, method
    dtype = ctx.first_dtype(check.case)
    if dtype is None or "forward" not in case.methods:
        return None
    return check.case, dtype, "forward"


def _inputs(ctx: SuiteContext, program: ExportedProgram, case: str, dtype: str, method: str, message: str) -> list:
    """The failing example's inputs when the check saved them (a divergence), else the export's example."""
    from torch.export.graph_signature import InputKind

    from ..archive import read_tensors

    wanted = sum(spec.kind == InputKind.USER_INPUT for spec in program.graph_signature.input_specs)
    saved = _SAVED_INPUTS.search(message)
    if saved and os.path.exists(saved.group(1)):
        tensors, _ = read_tensors(saved.group(1))
        if len(tensors) == wanted:
            return tensor_inputs(program, [tensors[f"input{i}"] for i in range(wanted)])
        if len(tensors) == len(tensor_inputs(program, [])) and len(tensors):  # the check saved its tensors only
            return [tensors[f"input{i}"] for i in range(len(tensors))]
    return tensor_inputs(program, list(ctx.flat_inputs(case, dtype, method)))


def tensor_inputs(program: ExportedProgram, flat: list) -> list:
    """The tensors of a program's flat user inputs, as `minify` takes them: a Python number the program
    takes (a ``ConstantArgument``: ``scale: float``) is baked into the exported program, and minify refuses it."""
    import torch
    from torch.export.graph_signature import InputKind, TensorArgument

    users = [spec for spec in program.graph_signature.input_specs if spec.kind == InputKind.USER_INPUT]
    if not flat:  # how many tensors it takes: as many placeholders
        return [spec for spec in users if isinstance(spec.arg, TensorArgument)]
    if len(users) != len(flat):
        return [value for value in flat if isinstance(value, torch.Tensor)]
    return [value for spec, value in zip(users, flat) if isinstance(spec.arg, TensorArgument)]


def _tolerance(ctx: SuiteContext, case: str, dtype: str) -> tuple[float, float]:
    from ..conformance.parity import tolerance_for

    found = tolerance_for(ctx, dtype, case)
    return found.rtol, found.atol
