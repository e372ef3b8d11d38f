"""The suite's dynamic-shape checks catch backends that specialise, and only them.

Each broken backend of tests/broken_backends_dynamic.py passes the static
parity check of a model and must fail its dynamic one.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys

import pytest
import torch

from pytest_backendconf.suite import SuiteOptions
from pytest_backendconf.suite._context import SuiteContext
from pytest_backendconf.suite._hypothesis import draws_seed
from pytest_backendconf.registry._registry import RegisteredBackend, Source
from pytest_backendconf.conformance import parity
from pytest_backendconf.conformance._zoo_loader import load_zoo

TESTS_DIR = os.path.dirname(os.path.abspath(__file__))
ZOO = {case.name: case for case in load_zoo()}
STATIC = "backendconf::parity::linear[float32]"
DYNAMIC = ["backendconf::parity::linear[float32-dynamic]", "backendconf::parity::mlp[float32-dynamic]"]


def run_suite(pytester, backend_class: str | None, *select: str):
    pytester.syspathinsert(TESTS_DIR)
    name = "reference"
    if backend_class:
        import broken_backends_dynamic

        name = getattr(broken_backends_dynamic, backend_class).name
        pytester.makeconftest(
            f"from broken_backends_dynamic import {backend_class}\n"
            f"def backendconf_register_backends(register):\n    register({backend_class}())\n"
        )
    args = [f"--backendconf-select={s}" for s in select]
    return pytester.runpytest(
        f"--backend={name}", "-p", "no:cacheprovider", "-rfEs", "--backendconf-hypothesis=ci", *args
    )


def outcomes(result) -> dict[str, str]:
    found = {}
    for kind in ("FAILED", "SKIPPED"):
        for m in re.finditer(rf"^{kind} (?:\[\d+\] )?(backendconf::\S+?):? ", result.stdout.str(), re.M):
            found[m.group(1)] = kind
    return found


def test_at_least_twelve_zoo_models_have_varying_dimensions():
    dynamic = [c for c in ZOO.values() if c.dims]
    assert len(dynamic) >= 12
    vision = {"small_cnn", "conv2d_stride_padding", "pools", "residual_block", "batch_norm_eval"}
    assert all("batch" in ZOO[n].dims for n in vision)
    assert all("seq" in ZOO[n].dims for n in ("tiny_attention", "causal_mask", "layer_norm"))
    assert sum(len(c.dims) >= 2 for c in dynamic) >= 3
    for case in dynamic:
        for dim in case.dims.values():
            assert dim.max - dim.min >= 2, (case.name, dim)  # min, middle and max differ


def test_the_reference_backend_passes_the_dynamic_checks(pytester):
    result = run_suite(pytester, None, STATIC, *DYNAMIC)
    result.assert_outcomes(passed=3)


@pytest.mark.parametrize(
    "backend, message",
    [
        (
            "FirstShapeBuffers",
            r"dimension 0 is 1 from backend 'first_shape_buffers', but this call's input sizes make it \d+",
        ),
        ("IgnoresRanges", r"lowered once with dynamic shapes and called at batch=\d+"),
    ],
)
def test_a_backend_that_specialises_fails_the_dynamic_checks_only(pytester, backend, message):
    result = run_suite(pytester, backend, STATIC, *DYNAMIC)
    result.assert_outcomes(passed=1, failed=2)
    assert set(outcomes(result)) == set(DYNAMIC)
    assert re.search(message, result.stdout.str()), result.stdout.str()[-3000:]
    # The shape (or the values after another shape passed) is what differs: the hint says why.
    # Once in each failure's block; the short summary repeats messages whole only under CI=true.
    text = result.stdout.str().split("short test summary info")[0]
    assert text.count("A backend must not specialise on the first shape it runs") == 2, text[-3000:]


def test_a_static_only_backend_gets_the_dynamic_checks_as_unsupported(pytester):
    result = run_suite(pytester, "StaticOnly", STATIC, *DYNAMIC)
    result.assert_outcomes(passed=1, skipped=2)
    result.stdout.fnmatch_lines(["*unsupported: backend 'static_only' declares Capabilities(dynamic_shapes=False)*"])


class RecordsShapes:
    """The reference backend, recording the inputs (and their shapes) each handle is called with."""

    def __init__(self):
        from backendconf_reference import ReferenceBackend

        self.inner = ReferenceBackend()
        self.name = "records_shapes"
        self.capabilities = self.inner.capabilities
        self.shapes: list[tuple] = []
        self.inputs: list[list[torch.Tensor]] = []

    def __getattr__(self, name):
        return getattr(self.inner, name)

    def execute(self, handle, inputs):
        self.shapes.append(tuple(tuple(x.shape) for x in inputs if isinstance(x, torch.Tensor)))
        self.inputs.append([x.clone() for x in inputs if isinstance(x, torch.Tensor)])
        return self.inner.execute(handle, inputs)


@pytest.mark.parametrize("case_name", ["linear", "causal_mask"])
def test_each_dynamic_check_calls_one_lowered_module_at_both_ends_and_more(case_name, tmp_path):
    backend = RecordsShapes()
    registered = RegisteredBackend(backend, Source("a test"))
    options = SuiteOptions(registered.name, hypothesis_profile="ci")
    ctx = SuiteContext(registered, [ZOO[case_name]], tmp_dir=lambda name: tmp_path, options=options)
    parity.check_dynamic_parity(ctx, case_name=case_name, dtype="float32", method="forward")
    dims = ZOO[case_name].dims
    batches = [shapes[0][0] for shapes in backend.shapes]
    assert batches[:2] == [dims["batch"].min, dims["batch"].max]  # the ends come first
    assert len(set(backend.shapes)) >= 3
    assert ctx.export_count == 1  # one dynamic export, one lowering, every shape


@pytest.mark.parametrize("backend", [None, "FirstShapeBuffers"])
def test_archives_of_dynamic_lowerings_run_a_second_shape_after_load_and_on_the_target(pytester, backend):
    select = [
        "backendconf::serialization::dynamic_round_trip[linear]",
        "backendconf::serialization::dynamic_target_round_trip[linear]",
    ]
    result = run_suite(pytester, backend, *select)
    if backend is None:
        result.assert_outcomes(passed=2)
        return
    result.assert_outcomes(failed=2)
    text = result.stdout.str()
    assert (
        "linear.forward (float32) with dynamic shapes, at the max sizes after load: method 'forward' output 0: "
        "dimension 0 is 3" in text
    )
    assert (
        "linear.forward (float32) with dynamic shapes, at the max sizes, before saving: method 'forward' output 0: "
        "dimension 0 is 3" in text
    )


def test_the_ci_profile_draws_a_checks_inputs_from_its_name_not_the_session_seed(tmp_path):
    # The ci inputs are what a known-failures file is recorded against: they must not move with the
    # session seed, nor with the text of the check's code (Hypothesis's own derandomization hashes it).
    def drawn(profile, session_seed):
        backend = RecordsShapes()
        registered = RegisteredBackend(backend, Source("a test"))
        options = SuiteOptions(registered.name, hypothesis_profile=profile, hypothesis_seed=session_seed)
        ctx = SuiteContext(registered, [ZOO["mlp"]], tmp_dir=lambda name: tmp_path, options=options)
        parity.check_parity(ctx, case_name="mlp", dtype="float32", method="forward")
        return backend.inputs

    def same(a, b):
        return len(a) == len(b) and all(torch.equal(x, y) for xs, ys in zip(a, b) for x, y in zip(xs, ys))

    assert same(drawn("ci", 1), drawn("ci", 2))
    assert not same(drawn("dev", 1), drawn("dev", 2))
    assert draws_seed("ci", 1, "mlp[float32].forward") == draws_seed("ci", 2, "mlp[float32].forward")
    assert draws_seed("ci", 1, "mlp[float32].forward") != draws_seed("ci", 1, "mlp[float16].forward")
    assert draws_seed("dev", 7, "mlp[float32].forward") == 7


@pytest.mark.slow
def test_dev_and_thorough_draw_afresh_where_ci_is_set():
    # Hypothesis loads its own derandomized `ci` profile by itself wherever $CI is set; the suite's
    # `dev` and `thorough` must not inherit it (a nightly `thorough` job on CI exists to see new inputs).
    code = (
        "from pytest_backendconf.suite._hypothesis import PROFILES as P; "
        "print(*(P[n].derandomize for n in ('ci', 'dev', 'thorough')), P['ci'].database, P['dev'].database is None)"
    )
    for ci in ("true", ""):
        env = {**os.environ, "CI": ci}
        out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True).stdout
        assert out.split() == ["True", "False", "False", "None", "False"], (ci, out)
