"""`profile`: where a lowered method spends its time, by source line, operator and module.

A backend may implement ``execute_profiled(handle, inputs) -> (outputs,
events)``, each event ``(debug_handle, start_ns, end_ns)`` on the
``time.perf_counter_ns`` clock (docs/writing-a-backend.md, "Profiling").
`profile` calls it ``repeat`` times, checks the events (known handles,
inside the call), and turns them into a `Profile` through the debug info:
rows per source location and op, aggregates by line, op and module
hierarchy, a table, and a Chrome trace. A backend without the method is
timed per call: the report then has one row for the method.
"""

from __future__ import annotations

import dataclasses
import json
import os
import time
from typing import TYPE_CHECKING, Any, Callable, Hashable, Mapping, Sequence

from ..debuginfo import DebugInfo, hierarchy_prefix, one_line
from ..errors import BackendContractError, BackendError

if TYPE_CHECKING:
    from ..lowering import LoweredModule, WrapperModule

#: One event: (debug handle, start, end), nanoseconds of time.perf_counter_ns.
Event = tuple[int, int, int]


@dataclasses.dataclass(frozen=True)
class Call:
    """One call of the method: its measured start and end, and the backend's events (None: not profiled)."""

    start_ns: int
    end_ns: int
    events: tuple[Event, ...] | None

    @property
    def duration_ns(self) -> int:
        return self.end_ns - self.start_ns


def profiled_call(core: LoweredModule, method: str, args: tuple, kwargs: dict) -> tuple[Any, Call]:
    """Run ``method`` of a `LoweredModule` once, through ``execute_profiled`` when the backend has it.

    Returns the method's result (structure restored, checked as every call
    is) and the `Call`. Malformed events are a `BackendContractError` naming
    the first bad one; a `BackendError` is symbolicated as in a normal call.
    """
    profiled = getattr(core.backend, "execute_profiled", None)
    if not callable(profiled) or method in core._plan_runners or method in core._state_of or method not in core.methods:
        # Partitioned methods interleave backend and CPU fallback, and a method with state passes it in and
        # writes it back under the module's lock (`LoweredModule.run`): both are timed as whole calls.
        start = time.perf_counter_ns()
        result = core.run(method, args, kwargs)
        return result, Call(start, time.perf_counter_ns(), None)
    from ..errors import BackendUnavailableError

    runner = core._runners[method]
    if core.backend.is_available() is not True:
        raise BackendUnavailableError(core._unavailable_text(f"cannot profile method {method!r}"))
    if core.handles is None:
        core.compile_now(at="call")
    handles = core.handles
    assert handles is not None  # compile_now set them
    inputs = runner.flatten(args, kwargs)
    start = time.perf_counter_ns()
    try:
        answer = profiled(handles[method], inputs)
    except BackendError as exc:
        raise core._symbolicate(exc, method) from exc
    end = time.perf_counter_ns()
    name = core.backend_name
    if not isinstance(answer, tuple) or len(answer) != 2:
        raise BackendContractError(
            f"execute_profiled() of backend {name!r} must return (outputs, events), got {type(answer).__name__}"
        )
    outputs, events = answer
    return runner.unflatten(outputs, name), Call(start, end, check_events(events, name, method))


def check_events(events: object, backend: str, method: str) -> tuple[Event, ...]:
    """``events`` as a tuple of ``(handle, start_ns, end_ns)`` int triples, or a contract error naming the first bad one."""
    if not isinstance(events, (list, tuple)):
        raise BackendContractError(
            f"execute_profiled() of backend {backend!r} (method {method!r}) must return a list of events "
            f"(debug_handle, start_ns, end_ns), got {type(events).__name__}"
        )
    out = []
    for i, event in enumerate(events):
        kernel = event[0] if isinstance(event, (tuple, list)) and len(event) == 3 else None
        if isinstance(kernel, (tuple, list)) and kernel and all(type(h) is int for h in kernel):
            event = (0, *event[1:])  # checked below as one event, then shared among the range's nodes
        else:
            kernel = None
        if (
            not isinstance(event, (tuple, list))
            or len(event) != 3
            or not all(type(v) is int for v in event)
            or event[1] > event[2]
        ):
            raise BackendContractError(
                f"execute_profiled() of backend {backend!r} (method {method!r}): event {i} is {event!r}; each "
                "event is (debug_handle, start_ns, end_ns), three ints from time.perf_counter_ns with start <= end "
                "(or ([h1, h2, ...], start_ns, end_ns) for a fused kernel covering several nodes)"
            )
        if kernel is None:
            out.append((event[0], event[1], event[2]))
        else:
            out.extend(share_kernel(list(kernel), event[1], event[2]))
    return tuple(out)


def share_kernel(handles: list[int], start: int, end: int) -> list[Event]:
    """A fused kernel's event as consecutive slices, one per node: each node gets an equal share of its time.

    Slices rather than one copy per node, so that the nodes' self times add
    up to the kernel's time once and no node looks nested in another.
    """
    count = len(handles)
    bounds = [start + (end - start) * k // count for k in range(count + 1)]
    return [(h, bounds[k], bounds[k + 1]) for k, h in enumerate(handles)]


def profile(
    lowered: WrapperModule | LoweredModule, *args: object, repeat: int = 1, method: str = "forward", **kwargs: object
) -> "Profile":
    """Call ``method`` of ``lowered`` ``repeat`` times and report where the time goes.

    :param lowered: what `to_backend` or `load` returned.
    :param args: the method's arguments (and ``kwargs``, its keyword arguments).
    :param repeat: how many calls to time (all are reported; the first may include warm-up).
    """
    from ..lowering import LoweredModule, WrapperModule

    core = lowered.lowered if isinstance(lowered, WrapperModule) else lowered
    if not isinstance(core, LoweredModule):
        raise TypeError(f"profile() needs a lowered module (from to_backend or load), got {type(lowered).__name__}")
    if type(repeat) is not int or repeat < 1:
        raise ValueError(f"profile(repeat={repeat!r}): repeat is the number of calls to time, an int >= 1")
    if method not in core.methods:
        raise AttributeError(f"this lowered module has no method {method!r}; its methods: {', '.join(core.methods)}")
    calls = [profiled_call(core, method, args, kwargs)[1] for _ in range(repeat)]
    separate = getattr(core, "separate_debug", None)
    return Profile(
        method=method,
        backend=core.backend_name,
        calls=tuple(calls),
        debug=core.debug,
        top=hierarchy_prefix((("top", _top_class(core.debug, method)),), method),
        hint=separate["hint"] if separate is not None and not core.debug else None,
    )


def _top_class(debug: Mapping[int, DebugInfo], method: str) -> str:
    for info in debug.values():
        if info.method == method and info.module_hierarchy:
            return info.module_hierarchy[0][1]
    return "?"


@dataclasses.dataclass(frozen=True, eq=False)
class Profile:
    """The timed calls of one method, and the aggregates of their events through the debug info."""

    method: str
    backend: str
    calls: tuple[Call, ...]
    debug: Mapping[int, DebugInfo] = dataclasses.field(repr=False)
    #: ``top(N)::forward``: the method's place in the module hierarchy (whole-call rows).
    top: str = ""
    #: ``backendconf symbolicate model.bcpt.debug`` when the debug info is in a .debug file not loaded.
    hint: str | None = None

    @property
    def profiled(self) -> bool:
        """Whether the backend reported events (``execute_profiled``), not only whole calls."""
        return all(c.events is not None for c in self.calls)

    @property
    def call_ns(self) -> list[int]:
        """The measured time of each call (around the backend call, profiling included)."""
        return [c.duration_ns for c in self.calls]

    def spans(self) -> list[tuple[Event, int]]:
        """Every event with its self time (its duration less the events nested inside it)."""
        out: list[tuple[Event, int]] = []
        for call in self.calls:
            events = sorted(call.events or (), key=lambda e: (e[1], -e[2]))
            stack: list[list] = []  # [event, self time] of the open events
            done: list[list] = []
            for event in events:
                while stack and stack[-1][0][2] <= event[1]:
                    done.append(stack.pop())
                if stack and event[2] <= stack[-1][0][2]:
                    stack[-1][1] -= event[2] - event[1]
                stack.append([event, event[2] - event[1]])
            done.extend(stack)
            out.extend((e, max(s, 0)) for e, s in done)
        return out

    def _where(self, handle: int) -> dict[str, Any]:
        info = self.debug.get(handle)
        if info is None:
            return {"op": None, "file": None, "line": None, "hierarchy": None, "handle": handle}
        return {  # names from the debug info, capped as every text rendered from it is
            "op": one_line(info.op),
            "file": one_line(info.file) if info.file is not None else None,
            "line": info.line,
            "hierarchy": hierarchy_prefix(info.module_hierarchy, info.method),
        }

    @property
    def rows(self) -> list[dict[str, Any]]:
        """One row per (op, file, line, hierarchy): ``calls`` (events), ``self_ns``, ``total_ns``; largest total first."""
        if not self.profiled:
            total = sum(self.call_ns)
            return [
                {
                    "op": self.method,
                    "file": None,
                    "line": None,
                    "hierarchy": self.top,
                    "calls": len(self.calls),
                    "self_ns": total,
                    "total_ns": total,
                }
            ]
        return self._aggregate(lambda w: (w["op"], w["file"], w["line"], w["hierarchy"], w.get("handle")))

    def by_line(self) -> list[dict[str, Any]]:
        """Rows per source line (``file``, ``line``), every op on it together."""
        return self._aggregate(
            lambda w: (w["file"], w["line"], w.get("handle") if w["file"] is None else None), keep=("file", "line")
        )

    def by_op(self) -> list[dict[str, Any]]:
        """Rows per operator (``op``)."""
        return self._aggregate(lambda w: (w["op"], w.get("handle") if w["op"] is None else None), keep=("op",))

    def by_module(self) -> list[dict[str, Any]]:
        """Rows per module (``hierarchy``): ``total_ns`` includes submodules, ``self_ns`` only the module's own ops."""
        own: dict[tuple, list[int]] = {}  # module path -> [self ns, events]
        methods: dict[tuple, str] = {}
        for event, self_ns in self.spans():
            info = self.debug.get(event[0])
            path = info.module_hierarchy if info is not None else ()
            row = own.setdefault(path, [0, 0])
            row[0] += self_ns
            row[1] += 1
            methods[path] = info.method if info is not None else self.method
        totals: dict[tuple, list[int]] = {}
        for path, (self_ns, _) in own.items():
            for depth in range(1 if path else 0, len(path) + 1):
                totals.setdefault(path[:depth], [0, 0])[0] += self_ns
        rows = []
        for path, (total, _) in totals.items():
            self_ns, events = own.get(path, [0, 0])
            name = hierarchy_prefix(path, methods.get(path, self.method)) if path else "?"
            rows.append({"hierarchy": name, "calls": events, "self_ns": self_ns, "total_ns": total})
        return sorted(rows, key=lambda r: (-r["total_ns"], r["hierarchy"]))

    def _aggregate(
        self, key: Callable[[dict[str, Any]], Hashable], keep: Sequence[str] = ("op", "file", "line", "hierarchy")
    ) -> list[dict[str, Any]]:
        groups: dict[Hashable, dict[str, Any]] = {}
        for event, self_ns in self.spans():
            where = self._where(event[0])
            row = groups.get(key(where))
            if row is None:
                row = groups[key(where)] = {k: where[k] for k in keep} | {"calls": 0, "self_ns": 0, "total_ns": 0}
                if where["op"] is None:
                    row["handle"] = event[0]
            row["calls"] += 1
            row["self_ns"] += self_ns
            row["total_ns"] += event[2] - event[1]
        return sorted(groups.values(), key=lambda r: (-r["total_ns"], str(r.get("file")), r.get("line") or 0))

    def __str__(self) -> str:
        calls = self.call_ns
        mean = sum(calls) / len(calls)
        lines = [
            f"profile of {self.method!r} on backend {self.backend!r}: {len(calls)} call(s), "
            f"mean {_ms(mean)} ms, min {_ms(min(calls))} ms"
            + ("" if self.profiled else " (the backend has no execute_profiled: whole calls only)"),
        ]
        header = f"{'total ms':>10} {'self ms':>10} {'%':>6} {'calls':>6}  {'op':<24} source / module"
        lines += ["", header, "-" * len(header)]
        whole = sum(calls) or 1
        for row in self.rows:
            source = (
                f"{row['file']}:{row['line']}"
                if row["file"]
                else (f"debug handle {row['handle']}" if "handle" in row else "-")
            )
            lines.append(
                f"{_ms(row['total_ns']):>10} {_ms(row['self_ns']):>10} {100 * row['self_ns'] / whole:>6.1f} "
                f"{row['calls']:>6}  {str(row['op'] or '?'):<24} {source}  {row['hierarchy'] or ''}".rstrip()
            )
        if self.profiled:
            covered = sum(s for _, s in self.spans())
            lines.append(
                f"{'':>10} {_ms(covered):>10} {100 * covered / whole:>6.1f}  in events; the rest is the "
                "backend's own overhead between them"
            )
            lines += ["", f"{'total ms':>10} {'self ms':>10} {'events':>6}  module", "-" * 40]
            for row in self.by_module():
                lines.append(
                    f"{_ms(row['total_ns']):>10} {_ms(row['self_ns']):>10} {row['calls']:>6}  {row['hierarchy']}"
                )
        if self.hint:
            lines.append(f"\n(debug info not loaded: symbolicate handles with: {self.hint} HANDLE)")
        return "\n".join(lines)

    def to_chrome_trace(self, path: str | os.PathLike) -> None:
        """Write a Chrome trace (JSON, opens in Perfetto and chrome://tracing): one event per call, one per node event.

        As every output document is written (`archive.output_file`): ``-`` is standard output, and a
        symlink or a pipe is written through, never replaced.
        """
        from ..archive import output_file

        trace = output_file("chrome trace", os.fspath(path))
        trace.write(json.dumps(self.chrome_trace(), indent=None, separators=(",", ":")) + "\n")

    def chrome_trace(self) -> dict[str, Any]:
        """The document `to_chrome_trace` writes: ``{"traceEvents": [...]}``, times in microseconds."""
        origin = self.calls[0].start_ns if self.calls else 0
        trace: list[dict[str, Any]] = [
            {"name": "process_name", "ph": "M", "pid": 1, "args": {"name": f"backend {self.backend}"}},
            {"name": "thread_name", "ph": "M", "pid": 1, "tid": 1, "args": {"name": f"method {self.method}"}},
        ]
        for i, call in enumerate(self.calls):
            trace.append(
                {
                    "name": f"{self.method} call {i}",
                    "cat": "call",
                    "ph": "X",
                    "pid": 1,
                    "tid": 1,
                    "ts": (call.start_ns - origin) / 1000,
                    "dur": call.duration_ns / 1000,
                }
            )
            for handle, start, end in call.events or ():
                info = self.debug.get(handle)
                args: dict[str, Any] = {"debug_handle": handle, "call": i}
                if info is not None:
                    args.update(
                        node=one_line(info.node),
                        op=one_line(info.op),
                        source=f"{one_line(info.file)}:{info.line}" if info.file else None,
                        hierarchy=hierarchy_prefix(info.module_hierarchy, info.method),
                        text=str(info),
                    )
                elif self.hint:
                    args["symbolicate"] = f"{self.hint} {handle}"
                trace.append(
                    {
                        "name": one_line(info.op) if info else f"debug handle {handle}",
                        "cat": "node",
                        "ph": "X",
                        "pid": 1,
                        "tid": 1,
                        "ts": (start - origin) / 1000,
                        "dur": (end - start) / 1000,
                        "args": args,
                    }
                )
        return {
            "traceEvents": trace,
            "displayTimeUnit": "ns",
            "otherData": {"backend": self.backend, "method": self.method, "calls": len(self.calls)},
        }


def _ms(ns: float) -> str:
    return f"{ns / 1e6:.3f}"


__all__ = ["Call", "Event", "Profile", "check_events", "profile", "profiled_call"]
