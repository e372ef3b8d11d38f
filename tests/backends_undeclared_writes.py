"""Backends for an op whose eager kernel writes an input its schema does not declare.

``aten.native_batch_norm`` with ``training=True`` updates ``running_mean`` and
``running_var`` in eager PyTorch, while its schema declares no write. The
contract says ``execute`` must not change its inputs, so a compiler that takes
the schema at its word leaves them alone: ``FunctionalCopies`` runs the
reference backend on copies of its inputs (the outputs right, no input
written) and must pass. ``WritesStatsWrong`` writes the running statistics
with other values than eager's: it changed its inputs, which no reading of
the contract allows, and must fail.
"""

from __future__ import annotations

from backendconf_reference import ReferenceBackend

import pytest_backendconf as bc


class FunctionalCopies(ReferenceBackend):
    name = "functional_copies"

    def execute(self, handle, inputs):
        return super().execute(handle, [i.clone() if hasattr(i, "clone") else i for i in inputs])


class WritesStatsWrong(ReferenceBackend):
    name = "writes_stats_wrong"

    def execute(self, handle, inputs):
        outputs = super().execute(handle, [i.clone() if hasattr(i, "clone") else i for i in inputs])
        # A running statistic (a 1-d input of batch norm) overwritten with nonsense.
        for tensor in inputs[3:5]:
            if hasattr(tensor, "fill_") and tensor.dim() == 1 and tensor.is_floating_point():
                tensor.fill_(7.0)
        return outputs


@bc.hookimpl
def backendconf_register_backends(register):
    register(FunctionalCopies())
    register(WritesStatsWrong())
