"""Broken backends for the profiling contract check: the reference backend with one defect in execute_profiled each.

tests/test_profile.py proves that contract::execute_profiled_events[*] fails for each, and only it.
"""

from __future__ import annotations

import time

from backendconf_reference import ReferenceBackend


class WallClockEvents(ReferenceBackend):
    """Stamps its events with time.time_ns() (wall clock) instead of time.perf_counter_ns()."""

    name = "wall_clock_events"

    def execute_profiled(self, handle, inputs):
        outputs, events = super().execute_profiled(handle, inputs)
        shift = time.time_ns() - time.perf_counter_ns()
        return outputs, [(h, start + shift, end + shift) for h, start, end in events]


class FirstNodeOnly(ReferenceBackend):
    """Reports one event for the whole call, under the first node's handle."""

    name = "first_node_only"

    def execute_profiled(self, handle, inputs):
        outputs, events = super().execute_profiled(handle, inputs)
        return outputs, [(events[0][0], events[0][1], events[-1][2])] if events else []
