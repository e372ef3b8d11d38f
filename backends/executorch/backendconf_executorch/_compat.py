"""The private torch names this backend uses, in one place (the project's rule for torch internals).

Only ``lowering`` (host only) imports this module.
"""

from __future__ import annotations

import contextlib
import functools
import threading
from collections.abc import Iterator
from typing import Any

import torch

# ExecuTorch's edge lowering runs torch's decompositions several times, and each
# asks torch._export.utils._collect_all_valid_cia_ops, which walks every operator
# namespace (about 200 with ExecuTorch and torchao imported) and queries the C++
# dispatcher once per namespace; torch caches only the aten namespace, since a
# custom op may be registered at any time. That walk was about 40 % of a small
# model's lowering. Inside our lowering only, the result is kept for as long as
# a cheap fingerprint of the registry (the C++ CompositeImplicitAutograd
# registrations, the Python namespaces, the operator count) is unchanged; any
# registration starts over. The suite's deterministic_lowering check compares a
# warm-memo lowering with a fresh process's, byte for byte.

_MEMO_STATE = threading.local()
_MEMO_LOCK = threading.Lock()
_MEMO: dict[str, Any] = {"fingerprint": None, "ops": None}
_MEMO_INSTALLED: list[bool] = []


def _registry_fingerprint() -> tuple:
    return (
        hash(tuple(torch._C._dispatch_get_registrations_for_dispatch_key("CompositeImplicitAutograd"))),
        tuple(torch.ops._dir),
        len(torch._C._dispatch_get_all_op_names()),
    )


@contextlib.contextmanager
def cia_ops_memo() -> Iterator[None]:
    """Within: torch's ``_collect_all_valid_cia_ops`` is memoised (for this thread)."""
    _install_memo()
    depth = getattr(_MEMO_STATE, "depth", 0)
    _MEMO_STATE.depth = depth + 1
    try:
        yield
    finally:
        _MEMO_STATE.depth = depth


def _install_memo() -> None:
    with _MEMO_LOCK:
        if _MEMO_INSTALLED:
            return
        _MEMO_INSTALLED.append(True)
        try:
            import torch._export.utils as export_utils
            import torch.export.decomp_utils as decomp_utils
            import torch.export.exported_program as exported_program

            original = export_utils._collect_all_valid_cia_ops
        except (ImportError, AttributeError):  # another torch: lower without the memo
            return

        @functools.wraps(original)
        def memoised() -> Any:
            if not getattr(_MEMO_STATE, "depth", 0):
                return original()
            fingerprint = _registry_fingerprint()
            with _MEMO_LOCK:
                if _MEMO["fingerprint"] == fingerprint:
                    return _MEMO["ops"]
            ops = original()  # torch: "the output of this function should never be modified"
            with _MEMO_LOCK:
                _MEMO.update(fingerprint=fingerprint, ops=ops)
            return ops

        for module in (exported_program, decomp_utils):
            if getattr(module, "_collect_all_valid_cia_ops", None) is original:
                module._collect_all_valid_cia_ops = memoised
