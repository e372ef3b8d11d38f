"""``--backendconf-shard=K/N``: run the K-th of N deterministic shards of the collection, one CI job each.

The unit dealt out is a *group*: every check of one model (all categories,
all dtypes: each model is exported and lowered by one machine only), every
sample of one operator overload, the availability rows together, and each
other check alone (`shard_group`). Groups are dealt by a greedy
longest-processing-time assignment: heaviest first, each to the shard with
the least work so far, ties to the lower shard and groups in the order of
their names, so that the same collection gives the same shards on every
machine, whatever ``-n`` or the order in which plugins' hooks ran. A
group's work is its checks' durations in an earlier report
(``--backendconf-durations``; a check it does not list costs the median),
else its number of checks.

Sharding runs after every other selection (``-k``, ``-m``,
``--backendconf-select``): the shards of one command line split what that
command line selects. Under pytest-xdist each worker collects and shards
alike; the controller learns the shard's record from them for the report.
"""

from __future__ import annotations

import math
import os
import re
from pathlib import Path
from typing import Any

import pytest

from ..checks import ROOT_ID
from ..errors import ReportError
from ..report import median_duration, read_durations, shard_entry
from ._settings import setting
from ._xdist import scope_of

SHARD_ENV = "BACKENDCONF_SHARD"
DURATIONS_ENV = "BACKENDCONF_DURATIONS"
#: The report's ``run.shard`` of this run (`report._shards.shard_entry`), once the collection is sharded.
SHARD_KEY = pytest.StashKey[dict]()
_SHARD = re.compile(r"\s*(\d{1,6})\s*/\s*(\d{1,6})\s*\Z")
_WORKEROUTPUT = "backendconf_shard"


def shard_choice(config: pytest.Config) -> tuple[int, int] | None:
    """``(K, N)`` from ``--backendconf-shard``, else the ini option ``backendconf_shard``, else ``$BACKENDCONF_SHARD``.

    :raises pytest.UsageError: the value is not ``K/N`` with ``1 <= K <= N``, naming where it came from.
    """
    value, where, _ = setting(config, "backendconf_shard", SHARD_ENV)
    if value is None:
        return None
    match = _SHARD.match(str(value))
    if match is None:
        raise pytest.UsageError(
            f"{where}: write K/N, the K-th of N shards counted from 1 (e.g. --backendconf-shard=2/3 for the "
            "second of three)"
        )
    index, count = int(match[1]), int(match[2])
    if count < 1 or not 1 <= index <= count:
        raise pytest.UsageError(
            f"{where}: K must be between 1 and N"
            + (f" (the shards of {count} are 1/{count} to {count}/{count})" if count >= 1 else " and N at least 1")
            + "; e.g. --backendconf-shard=1/3, 2/3 and 3/3 on three machines"
        )
    return index, count


def durations_choice(config: pytest.Config) -> dict[str, float] | None:
    """The per-check seconds of ``--backendconf-durations`` (or ``backendconf_durations``, ``$BACKENDCONF_DURATIONS``).

    :raises pytest.UsageError: the file is missing, unreadable or not a report, naming it.
    """
    value = (
        config.getoption("backendconf_durations", None)
        or config.getini("backendconf_durations")
        or os.environ.get(DURATIONS_ENV)
        or None
    )
    if value is None:
        return None
    path = Path(config.invocation_params.dir, value)
    try:
        return read_durations(path)
    except ReportError as exc:
        raise pytest.UsageError(
            f"--backendconf-durations={value}: {exc} (the durations come from an earlier run's "
            "--backendconf-report file; leave the option out to balance the shards by check counts)"
        ) from None


def shard_group(nodeid: str) -> str:
    """What one shard runs whole: a model's checks, an operator overload's samples, the availability rows.

    ``backendconf::parity::small_cnn[float16]`` → ``model::small_cnn`` (with
    ``serialization::round_trip[small_cnn]``), ``backendconf::ops::aten.add.Tensor[float16-sample0]``
    → ``ops::aten.add.Tensor`` (with ``…aten.add.Tensor[int8-static-per-tensor]``); a test outside the suite goes with its file.
    """
    if not nodeid.startswith(f"{ROOT_ID}::"):
        return "file::" + nodeid.split("::", 1)[0]
    if nodeid.startswith(f"{ROOT_ID}::ops::"):  # every sample and dtype of one overload, quantized ones too
        return "ops::" + nodeid.split("::", 2)[2].split("[", 1)[0]
    return scope_of(nodeid).removeprefix(f"{ROOT_ID}::")


def assign(weights: dict[str, float], count: int) -> dict[str, int]:
    """``{group: shard index (0-based)}``: greedy longest-processing-time, deterministic.

    Heaviest group first (ties by name), each to the shard with the least
    work so far (ties to the lower index): no shard gets more than 4/3 of
    the best possible largest shard.
    """
    loads = [0.0] * count
    placed = {}
    for group in sorted(weights, key=lambda g: (-weights[g], g)):
        shard = min(range(count), key=lambda s: (loads[s], s))
        placed[group] = shard
        loads[shard] += weights[group]
    return placed


class ShardPlugin:
    """Registered (as ``backendconf_shard``) when a shard is chosen: keeps this shard's items only."""

    def __init__(self, config: pytest.Config, index: int, count: int) -> None:
        self.config = config
        self.index, self.count = index, count
        self.durations = durations_choice(config)
        given = config.getoption("backendconf_durations", None) or config.getini("backendconf_durations")
        self.balanced_by = (
            f"durations in {given or os.environ.get(DURATIONS_ENV)}" if self.durations is not None else "check counts"
        )
        self.kept = self.total = 0

    def weight(self, nodeid: str) -> float:
        if self.durations is None:
            return 1.0
        if not hasattr(self, "_median"):
            self._median = median_duration(self.durations)
        return self.durations.get(nodeid, self._median)

    @pytest.hookimpl(trylast=True)
    def pytest_collection_modifyitems(self, config: pytest.Config, items: list[pytest.Item]) -> None:
        # Last: after -k, -m and every plugin's own selection, so every shard splits the same set.
        parts: dict[str, list[float]] = {}
        for item in items:
            parts.setdefault(shard_group(item.nodeid), []).append(self.weight(item.nodeid))
        # fsum is exact, so a group's weight does not depend on the order its checks were collected in.
        placed = assign({group: math.fsum(p) for group, p in parts.items()}, self.count)
        kept = [item for item in items if placed[shard_group(item.nodeid)] == self.index - 1]
        dropped = [item for item in items if placed[shard_group(item.nodeid)] != self.index - 1]
        self.kept, self.total = len(kept), len(items)
        config.stash[SHARD_KEY] = shard_entry(
            self.index, self.count, (i.nodeid for i in kept), (i.nodeid for i in items), self.balanced_by
        )
        if dropped:
            config.hook.pytest_deselected(items=dropped)
        items[:] = kept
        output = getattr(config, "workeroutput", None)
        if output is not None:
            output[_WORKEROUTPUT] = config.stash[SHARD_KEY]

    @pytest.hookimpl(optionalhook=True)
    def pytest_testnodedown(self, node: Any, error: object) -> None:
        entry = getattr(node, "workeroutput", {}).get(_WORKEROUTPUT)
        if entry is not None:  # every worker shards alike: any one's record is the run's
            self.config.stash[SHARD_KEY] = entry
            self.kept, self.total = len(entry["checks"]), entry["suite_checks"]

    def line(self) -> str:
        return (
            f"backendconf: shard {self.index}/{self.count}: {self.kept} of {self.total} checks "
            f"(whole models per shard, balanced by {self.balanced_by})"
        )

    def pytest_report_collectionfinish(self, config: pytest.Config) -> str:
        self._said = True
        return self.line()

    @pytest.hookimpl(optionalhook=True)
    def pytest_xdist_node_collection_finished(self, node: Any, ids: list[str]) -> None:
        self.kept = len(ids)

    @pytest.hookimpl(wrapper=True)
    def pytest_sessionfinish(self, session: pytest.Session, exitstatus: int) -> Any:
        # A shard the deal left empty (more shards than groups) ran what it was given: nothing. That is
        # no failure of the CI job, as "no tests collected" (exit status 5) would make it.
        if self.kept == 0 and self.total > 0 and session.exitstatus == pytest.ExitCode.NO_TESTS_COLLECTED:
            session.exitstatus = pytest.ExitCode.OK
        return (yield)

    def pytest_terminal_summary(self, terminalreporter: Any) -> None:
        if not getattr(self, "_said", False):  # an xdist controller, which collects nothing, says it here
            terminalreporter.write_line(self.line())
