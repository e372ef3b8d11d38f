"""Checks that share one lowering: where a batch is formed, run, split, and its outcomes handed out.

A check that carries a `Batching` record (the ops category's) may be lowered
together with later checks of the same group that this process will run.
When the first of them runs, the batch is formed from it and the next
checks of its group in the session's order (up to ``[ops] batch_size``,
distinct members), run at once (in the backend host, or here with
``--backendconf-in-process``), and every outcome it decides is kept for its
own check, which then reports it without running. What the batch does not
decide runs alone, exactly as without batching:

- ``alone``: the category's runner could not judge it in the batch (a
  failed comparison, a rejection at a node that is not the check's own);
- ``split``: the batch failed as a whole (a lowering error it cannot
  attribute, an error in execute): it is halved and each half tried again,
  down to single checks, which run alone;
- the host died (crash, hang, memory limit) during the batch: every member
  runs alone, so the host's isolation blames the one that does it again.

When batching is on: ``--backendconf-batch=on``, or ``auto`` (the default,
also the ini option ``backendconf_batch``) for a backend whose capabilities
declare ``batch_ops=True``; ``off`` turns it off. Under pytest-xdist a batch
holds only checks of the worker's own scope (`_xdist.scope_of`), and
batching is off when the suite's grouping is not in use.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

from ..checks import Check, CheckOutcome, outcome_from_json
from ..report import counted

if TYPE_CHECKING:
    import pytest

    from ..capabilities import Capabilities
    from ._context import SuiteContext
    from ._host import BackendHost
    from ._suite import ConformanceItem

#: ``--backendconf-batch`` / the ini option ``backendconf_batch``.
CHOICES = ("auto", "on", "off")
#: Checks per batch unless ``[ops] batch_size`` in suite.toml says otherwise.
DEFAULT_SIZE = 16


def batching_choice(config: pytest.Config, capabilities: Capabilities) -> bool:
    """Whether this run batches: the option, else the ini option, else the backend's declaration."""
    value = config.getoption("backendconf_batch", None) or config.getini("backendconf_batch") or "auto"
    if value not in CHOICES:
        import pytest

        raise pytest.UsageError(
            f"backendconf_batch = {value!r} in the ini file: write one of {', '.join(CHOICES)} "
            "(auto: batch when the backend declares Capabilities(batch_ops=True))"
        )
    if value == "auto":
        return bool(getattr(capabilities, "batch_ops", None))
    return value == "on"


class Batcher:
    """The pytest process's side: forms batches from the session's items and keeps their outcomes."""

    def __init__(
        self, items: list[pytest.Item], size: int, host: BackendHost | None, ctx: SuiteContext, same_scope: bool
    ) -> None:
        self.items = items
        self.size = max(1, size)
        self.host = host
        self.ctx = ctx
        #: Under pytest-xdist: a batch holds checks of one scope only (the worker runs the whole scope).
        self.same_scope = same_scope
        self._index: dict[str, int] | None = None
        #: Outcomes decided by a batch, by check id, until their check reports them.
        self.decided: dict[str, CheckOutcome] = {}
        #: Check ids that run alone (a batch left them undecided).
        self.alone: set[str] = set()
        #: How many batches were lowered and how long they took (for the benchmarks).
        self.batches = 0
        self.seconds = 0.0
        #: How many checks a batch decided.
        self.shared = 0
        #: Members (op names) the backend rejected once: their later checks run alone, since each
        #: rejection in a batch costs a lowering of the whole batch again, and one alone a small one
        #: (unless the backend names every rejected node at once: see `bulk`).
        self.refused: set[str] = set()
        #: Whether the backend named several rejected nodes in one error: a rejection then costs the
        #: batch nothing more, and refused members stay in batches.
        self.bulk = False
        #: Rejections seen alone, as ``(member, outcome, message)``: a batch's rejection of a check is
        #: taken as its outcome only when a check of the same member was rejected so alone (`_key`).
        self.confirmed: set[tuple[str, str, str]] = set()
        #: Checks a batch said were rejected, not confirmed, so run alone: their batch outcome, to compare.
        self.claimed: dict[str, CheckOutcome] = {}
        #: Checks whose batch rejection their run alone contradicted (the backend's list was wrong).
        self.contradicted: list[str] = []
        #: Each contradiction in words, for the summary: the check, the node the batch named, what it was alone.
        self.contradictions: list[str] = []

    def counts(self) -> dict[str, Any]:
        """What this process's batches did, for the summary (an xdist worker sends it to the controller)."""
        return {
            "shared": self.shared,
            "batches": self.batches,
            "seconds": self.seconds,
            "alone": len(self.alone),
            "contradicted": len(self.contradicted),
            "contradictions": list(self.contradictions),
        }

    @staticmethod
    def add_counts(total: dict[str, Any] | None, counts: dict[str, Any]) -> dict[str, Any]:
        return {k: (total or {}).get(k, [] if isinstance(v, list) else 0) + v for k, v in counts.items()}

    @staticmethod
    def summary(counts: dict[str, Any]) -> str:
        """``backendconf: batched: 42 checks decided in 8 shared lowerings (23.2 s), 0 ran alone …``."""
        text = (
            f"backendconf: batched: {counted(counts['shared'], 'check')} decided in "
            f"{counted(counts['batches'], 'shared lowering')} "
            f"({counts['seconds']:.1f} s), {counts['alone']} ran alone (--backendconf-batch=off: one lowering each)"
        )
        wrong = counts.get("contradicted", 0)
        if wrong:
            text += (
                f"; the backend named {counted(wrong, 'node')} as rejected in a batch that it judged "
                "otherwise alone (those checks report their outcome alone; its rejection list is wrong)"
            )
            named = list(counts.get("contradictions") or [])
            shown = named[:MAX_CONTRADICTIONS_SHOWN]
            text += "".join(f"\n  {line}" for line in shown)
            if len(named) > len(shown):
                text += f"\n  … and {len(named) - len(shown)} more"
        return text

    def ran_alone(self, check: Check, outcome: str, message: str) -> None:
        """A check ran alone: remember a rejection (its member's later checks run alone, or are confirmed by
        it), and whether it contradicts what a batch said of it."""
        if check.batch is None:
            return
        if outcome == "unsupported":
            self.refused.add(check.batch.member)
        if outcome in ("unsupported", "failed"):
            self.confirmed.add(_key(check, outcome, message))
        claimed = self.claimed.pop(check.id, None)
        if claimed is not None and (claimed.outcome, claimed.message) != (outcome, message):
            self.contradicted.append(check.id)
            said = (claimed.message.splitlines() or [""])[0]
            self.contradictions.append(
                f"{check.id}: the batch's rejection named {said[:200]!r}; alone it {_ALONE_WORDS.get(outcome, outcome)}"
            )

    def outcome(self, item: ConformanceItem) -> CheckOutcome | None:
        """The check's outcome from a batch, or None: run it alone."""
        check: Check = item.check
        if check.batch is None:
            return None
        if check.id in self.decided:
            return self.decided.pop(check.id)
        claimed = self.claimed.get(check.id)
        if claimed is not None and _key(check, claimed.outcome, claimed.message) in self.confirmed:
            # A batch named its node, and another check of its member was rejected so alone since.
            del self.claimed[check.id]
            self.alone.discard(check.id)
            self.shared += 1
            return claimed
        if check.id in self.alone or self._refused(check):
            return None
        members = [check] + self._mates(item)
        if len(members) < 2:
            return None
        self._resolve(members)
        return self.decided.pop(check.id, None)

    def _mates(self, item: ConformanceItem) -> list[Check]:
        """The checks of the next items of the check's group that this process runs, with distinct members."""
        from ._xdist import scope_of

        if self._index is None:
            self._index = {it.nodeid: i for i, it in enumerate(self.items)}
        start = self._index.get(item.nodeid)
        if start is None:
            return []
        batch = item.check.batch
        if batch is None:
            return []
        members = {batch.member}
        scope = scope_of(item.nodeid) if self.same_scope else None
        found: list[Check] = []
        for other in self.items[start + 1 :]:
            if len(found) + 1 >= self.size:
                break
            check = getattr(other, "check", None)  # a test of the vendor's own, beside the suite, has none
            if not isinstance(check, Check):
                continue
            theirs = check.batch
            if (
                theirs is None
                or theirs.group != batch.group
                or theirs.member in members
                or theirs.run is not batch.run
                or self._refused(check)
            ):
                continue
            if check.id in self.decided or check.id in self.alone or self._known_to_hang(check):
                continue
            if scope is not None and scope_of(other.nodeid) != scope:
                continue
            members.add(theirs.member)
            found.append(check)
        return found

    def _refused(self, check: Check) -> bool:
        """Whether the check runs alone because its member was rejected before (and rejections are dear)."""
        return not self.bulk and check.batch is not None and check.batch.member in self.refused

    def _known_to_hang(self, check: Check) -> bool:
        """A check whose lowered model hung or crashed before runs alone: it then fails at once."""
        if self.host is None:
            return False
        from ._host import model_key

        return self.host.models.known(model_key(check.category, check.name, check.case, None)) is not None

    def _resolve(self, checks: list[Check]) -> None:
        if len(checks) < 2:
            self.alone.update(c.id for c in checks)
            return
        started = time.monotonic()
        result = self._run(checks)
        self.batches += 1
        self.seconds += time.monotonic() - started
        if result is None:  # the host died, or the runner broke: nobody is blamed, each runs alone
            self.alone.update(c.id for c in checks)
            return
        by_id = {c.id: c for c in checks}
        decided = {i: outcome_from_json(data) for i, data in result.get("decided", {}).items() if i in by_id}
        # A rejection the batch read off the backend's list counts only where the same member was
        # rejected so alone before; otherwise the check runs alone, and its outcome is compared.
        for i, data in result.get("rejected", {}).items():
            batch = by_id[i].batch if i in by_id else None
            if batch is None:
                continue
            outcome = outcome_from_json(data)
            if _key(by_id[i], outcome.outcome, outcome.message) in self.confirmed:
                decided[i] = outcome
            else:
                self.claimed[i] = outcome
                self.alone.add(i)
            self.refused.add(batch.member)
        # A one-node rejection decides, as it always has.
        self.refused.update(
            by_id[i].batch.member  # type: ignore[union-attr]
            for i, outcome in decided.items()
            if outcome.outcome == "unsupported"
        )
        if int(result.get("named", 0) or 0) > 1:
            self.bulk = True
        self.decided.update(decided)
        self.shared += len(decided)
        self.alone.update(result.get("alone", []))
        split = [by_id[i] for i in result.get("split", []) if i in by_id]
        if len(split) == 1:
            self.alone.add(split[0].id)
        elif split:
            middle = len(split) // 2
            self._resolve(split[:middle])
            self._resolve(split[middle:])
        # Anything the runner did not mention runs alone.
        self.alone.update(c.id for c in checks if c.id not in self.decided and c.id not in self.alone)

    def _run(self, checks: list[Check]) -> dict[str, Any] | None:
        if self.host is not None:
            return self.host.run_batch([c.id for c in checks])
        batching = checks[0].batch
        if batching is None:  # only checks that carry a Batching are resolved
            return None
        try:
            return batching.run(self.ctx, checks)
        except Exception:  # the runner itself failed: the checks alone will say what
            return None


#: How many contradicted checks the summary names (the rest are counted).
MAX_CONTRADICTIONS_SHOWN = 20
_ALONE_WORDS = {"passed": "passed", "failed": "failed", "unsupported": "was rejected otherwise"}


def _key(check: Check, outcome: str, message: str) -> tuple[str, str, str]:
    """What a batch's rejection of a check must match to be taken: a rejection of the same member (op) with
    the very text seen alone (a reason that depends on the dtype says so, and then differs)."""
    return (getattr(check.batch, "member", ""), outcome, message)
