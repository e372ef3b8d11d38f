"""pytest-xdist: send all the checks of one model to one worker, so that each model is exported and lowered once.

xdist's default ``--dist load`` deals tests out one by one, so the checks of
one model land on every worker and each worker exports, lowers and saves
that model again: with two workers on two cores the suite took 2.5 times as
long as a serial run. Under ``load`` (the default with ``-n``) this plugin
makes xdist's scope scheduler group the suite's checks by model instead; any
other ``--dist`` is left as given, and ``-p no:backendconf_xdist`` turns the
grouping off. Test ids are unchanged (xdist's ``loadgroup`` would append
``@group`` to them, which would break known-failure files and reports).
"""

from __future__ import annotations

import re
import zlib
from typing import Any

import pytest

from ..checks import ROOT_ID

#: The bracketed suffixes that name a dtype, not a model (``parity::small_cnn[float16]``).
_DTYPE_IDS = frozenset({"float32", "float16", "bfloat16", "fixed"})
#: The key of a worker's ``workerinput``: True when the controller schedules the checks by `scope_of`.
GROUPED = "backendconf_grouped"
#: How many groups the ops checks of one dtype are dealt in (each goes to one worker whole).
OPS_GROUPS = 4
_NAME = re.compile(r"([^\[]*)\[([^\]]*)\]\Z")


def model_of(nodeid: str) -> str | None:
    """The model a check of the suite uses, read from its id; None for other tests and whole-backend checks.

    ``parity::encoder_decoder.decode[float16]`` → ``encoder_decoder``;
    ``serialization::round_trip[small_cnn]`` → ``small_cnn``;
    ``symbolication::runtime_fault_is_symbolicated[nested_nml:cos]`` → ``nested_nml``.
    A wrong guess only costs time, never a result: it decides where a check runs.
    """
    parts = nodeid.split("::", 2)
    if len(parts) != 3 or parts[0] != ROOT_ID:
        return None
    category, name = parts[1], parts[2]
    match = _NAME.match(name)
    if match is None:
        return None
    head, inside = match.groups()
    if category == "ops":
        # aten.add.Tensor[float16-sample0]: no model. A dtype's overloads go together in a few groups, each
        # with every check of its overloads: the checks a batch may hold (`_batching`) are of one group.
        dtype = inside.split("-")[0]
        return f"ops:{dtype}:{zlib.crc32(head.encode()) % OPS_GROUPS}"
    if inside in _DTYPE_IDS:
        # parity's model.method[dtype]; an op id of another category (aten.add.Tensor[float16]) stays whole.
        return head.split(".")[0] if category == "parity" else head
    return inside.split(":")[0].split(".")[0] or None


def scope_of(nodeid: str) -> str:
    """The unit xdist sends to one worker: the model's checks together, the availability rows together,
    anything else on its own."""
    model = model_of(nodeid)
    if model is not None:
        return f"{ROOT_ID}::model::{model}"
    if nodeid.startswith(f"{ROOT_ID}::availability::"):
        # The target rows share one extra process's archives and loads: spread out, every worker repeats them.
        return f"{ROOT_ID}::availability"
    return nodeid


class ModelGrouping:
    """Registered as ``backendconf_xdist`` on the controller when pytest-xdist is installed."""

    @pytest.hookimpl(optionalhook=True)
    def pytest_configure_node(self, node: Any) -> None:
        # Tell the workers whether the scopes above schedule their checks: only then does a worker run
        # every check of a scope, which batches of checks that share a lowering rely on (`_batching`).
        node.workerinput[GROUPED] = node.config.getvalue("dist") == "load"

    @pytest.hookimpl(tryfirst=True, optionalhook=True)
    def pytest_xdist_make_scheduler(self, config: pytest.Config, log: Any) -> Any:
        if config.getvalue("dist") != "load":
            return None
        from xdist.scheduler import LoadScopeScheduling

        class ByModel(LoadScopeScheduling):
            def _split_scope(self, nodeid: str) -> str:
                return scope_of(nodeid)

        return ByModel(config, log)
