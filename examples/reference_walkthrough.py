"""The reference backend through every stage a vendor's backend goes through.

Lowers the nested N/M/L model and a small CNN, compares with eager, shows
the symbolicated texts of a rejected op and of a runtime fault, saves and
loads the archive, runs it on a simulated target (a fresh process with the
backend's compiler blocked), and symbolicates a handle offline. Prints one
line per check and exits non-zero if any fails.
"""

from __future__ import annotations

import os
import sys
import tempfile
import traceback
import warnings

import torch

import pytest_backendconf as bc
from pytest_backendconf import run_on_target
from pytest_backendconf.conformance import zoo as models  # the nested N/M/L model, a small CNN

results: list[tuple[str, bool]] = []


def check(name: str):
    def run(fn):
        try:
            fn()
        except Exception:
            traceback.print_exc()
            results.append((name, False))
            print(f"FAIL  {name}")
        else:
            results.append((name, True))
            print(f"ok    {name}")
        return fn

    return run


X = torch.randn(2, 3)
IMAGE = torch.randn(2, 3, 8, 8)
NML = models.N()
CNN = models.SmallCNN().eval()


@check("N/M/L lowered to the reference backend matches eager")
def _():
    lowered = bc.to_backend(NML, "reference", {"forward": {}}, example_inputs=(X,))
    torch.testing.assert_close(lowered(X), NML(X))


@check("small CNN (conv2d, batch_norm, relu, max_pool2d, linear) matches eager")
def _():
    lowered = bc.to_backend(CNN, "reference", {"forward": {}}, example_inputs=(IMAGE,))
    torch.testing.assert_close(lowered(IMAGE), CNN(IMAGE))


@check("an op outside the reference set is rejected with the user's source")
def _():
    class Logit(torch.nn.Module):
        def forward(self, x):
            return torch.logit(x) + 1

    try:
        bc.to_backend(Logit(), "reference", {"forward": {}}, example_inputs=(X,))
    except bc.UnsupportedNodeError as exc:
        text = str(exc)
        print("\n" + "\n".join("      " + line for line in text.splitlines()[:4]) + "\n")
        assert text.startswith("The node of aten::logit is not supported in this compiler.")
        assert "~~~~ <--- HERE" in text
    else:
        raise AssertionError("lowering did not reject aten.logit")


@check("a runtime fault is symbolicated down to `x * 5`")
def _():
    spec = {"forward": {"__backendconf_fault__": {"node": "mul"}}}
    lowered = bc.to_backend(NML, "reference", spec, example_inputs=(X,))
    try:
        lowered(X)
    except bc.BackendRuntimeError as exc:
        text = str(exc)
        print("\n" + "\n".join("      " + line for line in text.splitlines()) + "\n")
        assert "Module hierarchy:top(N)::forward.m(M)::forward.l(L)::forward.aten::mul" in text
        assert text.index("self.m(x) + 3") < text.index("self.l(x) - 2") < text.index("x * 5")
    else:
        raise AssertionError("the injected fault did not raise")


@check("archive round trip, byte-identical re-save, target subprocess, offline symbolication")
def _():
    lowered = bc.to_backend(CNN, "reference", {"forward": {}}, example_inputs=(IMAGE,))
    lowered.labels = ["cat", "dog"]
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "cnn.bcpt")
        again_path = os.path.join(tmp, "again.bcpt")
        bc.save(lowered, path)
        again = bc.load(path)
        torch.testing.assert_close(again(IMAGE), CNN(IMAGE))
        assert again.labels == ["cat", "dog"]
        bc.save(again, again_path)
        assert open(path, "rb").read() == open(again_path, "rb").read()
        outcome = run_on_target(path, {"forward": [(IMAGE,)]})
        assert outcome["ok"], outcome["error"] or outcome["errors"]
        torch.testing.assert_close(outcome["outputs"]["forward"][0], CNN(IMAGE))
        handle = next(iter(bc.debug_info(lowered)))
        assert f"debug handle {handle}" in bc.symbolicate(path, [handle])


@check("an unavailable backend warns at lowering and refuses to run")
def _():
    from backendconf_reference import ReferenceBackend

    class Offline(ReferenceBackend):
        name = "offline"

        def is_available(self):
            return False

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        lowered = bc.to_backend(NML, Offline(), {"forward": {}}, example_inputs=(X,))
    assert any(issubclass(w.category, bc.BackendUnavailableWarning) for w in caught)
    try:
        lowered(X)
    except bc.BackendUnavailableError as exc:
        assert str(exc).startswith("Backend is not available.")
    else:
        raise AssertionError("an unavailable backend ran")


passed = sum(ok for _, ok in results)
failed = len(results) - passed
print(f"walkthrough: {passed} passed, {failed} failed")
sys.exit(1 if failed else 0)
