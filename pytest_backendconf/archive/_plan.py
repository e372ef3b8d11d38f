"""What a partitioned method is, as data: `Delegation` records and the `Plan` of steps.

Kept free of torch so that reading an archive (``backendconf inspect``,
``backendconf symbolicate``) never imports it; `lowering._fallback` runs plans and
`lowering._partition` makes them.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from ._method_spec import ValueSpec


@dataclasses.dataclass(frozen=True)
class Delegation:
    """How one lowered method was split between the backend and the CPU fallback.

    Node names are the FX node names of the method's exported program (the
    ``node`` of its `DebugInfo`); only op nodes are counted.
    """

    #: Number of delegated partitions (1 for a whole-method lowering).
    partitions: int
    #: The op nodes the backend runs, in graph order.
    delegated: tuple[str, ...]
    #: The op nodes run on the host CPU by the fallback, in graph order.
    fallback: tuple[str, ...] = ()
    #: The op nodes of each delegated partition, in the order they run.
    partition_nodes: tuple[tuple[str, ...], ...] = ()

    @property
    def total(self) -> int:
        return len(self.delegated) + len(self.fallback)

    def summary(self) -> str:
        """ "3 partitions, 41/47 nodes delegated"."""
        plural = "" if self.partitions == 1 else "s"
        return f"{self.partitions} partition{plural}, {len(self.delegated)}/{self.total} nodes delegated"

    def to_json(self) -> dict[str, Any]:
        return {
            "delegated": list(self.delegated),
            "fallback": list(self.fallback),
            "partitions": [list(p) for p in self.partition_nodes],
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> "Delegation":
        groups = tuple(tuple(str(n) for n in p) for p in data["partitions"])
        delegated = tuple(str(n) for n in data["delegated"])
        if sorted(delegated) != sorted(n for p in groups for n in p):
            raise ValueError("the delegated nodes are not those of the partitions")
        return cls(len(groups), delegated, tuple(str(n) for n in data["fallback"]), groups)


def format_delegation(delegation: dict[str, Delegation]) -> str:
    """The table `backendconf inspect` prints: per method, each partition's nodes and the fallback's."""
    lines = []
    for method, record in delegation.items():
        lines.append(f"method {method}: {record.summary()}")
        for i, nodes in enumerate(record.partition_nodes):
            lines.append(f"  partition {i}  {len(nodes):>4} nodes  {', '.join(nodes)}")
        if record.fallback:
            lines.append(f"  fallback     {len(record.fallback):>4} nodes  {', '.join(record.fallback)}")
    return "\n".join(lines)


@dataclasses.dataclass(frozen=True)
class Step:
    """One unit of a plan: which blob runs, which values it reads and writes."""

    delegated: bool
    key: str  # the blob's key: "forward.partition0" or "forward.fallback0"
    inputs: tuple[int, ...]
    outputs: tuple[int, ...]
    #: What the step returns (checked after a delegated partition runs).
    output_specs: tuple[ValueSpec, ...]

    def to_json(self) -> dict[str, Any]:
        return {
            "delegated": self.delegated,
            "key": self.key,
            "inputs": list(self.inputs),
            "outputs": list(self.outputs),
            "output_specs": [v.to_json() for v in self.output_specs],
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> "Step":
        return cls(
            delegated=bool(data["delegated"]),
            key=str(data["key"]),
            inputs=tuple(_index(i) for i in data["inputs"]),
            outputs=tuple(_index(i) for i in data["outputs"]),
            output_specs=tuple(ValueSpec.from_json(v) for v in data["output_specs"]),
        )


@dataclasses.dataclass(frozen=True)
class Plan:
    """How one partitioned method runs; round-trips through JSON for the archive."""

    n_inputs: int
    n_values: int
    steps: tuple[Step, ...]
    #: Per method output: a value index, or ``{"constant": v}`` for a value baked into the program.
    outputs: tuple[int | dict[str, object], ...]
    delegation: Delegation

    def to_json(self) -> dict[str, Any]:
        return {
            "n_inputs": self.n_inputs,
            "n_values": self.n_values,
            "steps": [s.to_json() for s in self.steps],
            "outputs": list(self.outputs),
            "delegation": self.delegation.to_json(),
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> "Plan":
        plan = cls(
            n_inputs=_index(data["n_inputs"]),
            n_values=_index(data["n_values"]),
            steps=tuple(Step.from_json(s) for s in data["steps"]),
            outputs=tuple(o if isinstance(o, dict) else _index(o) for o in data["outputs"]),
            delegation=Delegation.from_json(data["delegation"]),
        )
        plan.check()
        return plan

    def check(self) -> None:
        """Every value is written before it is read, once (a hostile plan is refused, not run)."""
        written = set(range(self.n_inputs))
        for step in self.steps:
            for i in step.inputs:
                if i not in written:
                    raise ValueError(f"step {step.key!r} reads value {i} before any step writes it")
            for i in step.outputs:
                if i in written or i >= self.n_values:
                    raise ValueError(f"step {step.key!r} writes value {i} twice or out of range")
                written.add(i)
            if len(step.output_specs) != len(step.outputs):
                raise ValueError(
                    f"step {step.key!r} has {len(step.outputs)} outputs but {len(step.output_specs)} specs"
                )
        for o in self.outputs:
            if isinstance(o, dict):
                if set(o) != {"constant"}:
                    raise ValueError(f"method output {o!r} is neither a value index nor a constant")
            elif o not in written:
                raise ValueError(f"method output reads value {o}, which no step writes")

    @property
    def blob_keys(self) -> list[str]:
        return [s.key for s in self.steps]


def _index(value: object) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or value < 0:
        raise ValueError(f"{value!r} is not a value index")
    return value
