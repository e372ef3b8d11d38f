"""The model zoo: its data is consistent with its code, and its loader rejects bad entries by name."""

from __future__ import annotations

import functools
import subprocess
import sys
import textwrap
import zlib

import pytest
import torch
from torch.utils import _pytree as pytree

import pytest_backendconf as bc
from pytest_backendconf.conformance import _zoo_loader, zoo
from pytest_backendconf.conformance._zoo_loader import ZooSpecError, load_torchscript_zoo, load_zoo, parse_models

CASES = load_zoo()
BY_NAME = {case.name: case for case in CASES}
# Export inserts these checks on its own; they are not ops a model asks for.
EXPORT_ARTEFACTS = {"aten._assert_tensor_metadata.default"}


def make_inputs(case: bc.ModelCase, method: str, dtype: str, seed: int = 0) -> tuple:
    """Random inputs for ``method`` following the case's `TensorInput` specs."""
    generator = torch.Generator().manual_seed(zlib.crc32(f"{case.name}.{method}".encode()) + seed)
    args = []
    for spec in case.inputs[method]:
        if not isinstance(spec, bc.TensorInput):
            args.append(spec)
            continue
        name = dtype if spec.dtype == "float" else spec.dtype
        shape = spec.concrete_shape(case.example_sizes())
        if name == "bool":
            args.append(torch.rand(shape, generator=generator) < 0.5)
        elif name == "int64":
            low = int(spec.low) if spec.low is not None else -100
            high = int(spec.high) if spec.high is not None else 100
            args.append(torch.randint(low, high + 1, shape, generator=generator))
        else:
            low = spec.low if spec.low is not None else -1.0
            high = spec.high if spec.high is not None else 1.0
            values = torch.rand(shape, generator=generator, dtype=torch.float64) * (high - low) + low
            args.append(values.to(getattr(torch, name)))
    return tuple(args)


def call(model: torch.nn.Module, case: bc.ModelCase, method: str, args: tuple):
    return getattr(model, method)(*args, **case.kwargs.get(method, {}))


class _Method(torch.nn.Module):
    """Exports one method of a model as its forward."""

    def __init__(self, model: torch.nn.Module, method: str) -> None:
        super().__init__()
        self.model = model
        self.method = method

    def forward(self, *args, **kwargs):
        return getattr(self.model, self.method)(*args, **kwargs)


def overload_name(target) -> str:
    if isinstance(target, torch._ops.OpOverload):
        return str(target)
    if isinstance(target, torch._ops.HigherOrderOperator):
        return f"higher_order.{target.name()}"
    return f"{target.__module__}.{target.__name__}"


def graph_ops(graph_module: torch.fx.GraphModule) -> set[str]:
    """Op names of every call in the graph and its subgraphs (torch.cond branches)."""
    ops = {overload_name(n.target) for n in graph_module.graph.nodes if n.op == "call_function"}
    for child in graph_module.children():
        if isinstance(child, torch.fx.GraphModule):
            ops |= graph_ops(child)
    return ops


@functools.cache
def exported_ops(name: str) -> frozenset[str]:
    """The ops of every method of a case, exported once in float32."""
    case = BY_NAME[name]
    model = case.build()
    ops: set[str] = set()
    for method in case.methods:
        args = make_inputs(case, method, "float32")
        program = torch.export.export(_Method(model, method), args, dict(case.kwargs.get(method, {})))
        ops |= graph_ops(program.graph_module)
    return frozenset(ops - EXPORT_ARTEFACTS)


def dtype_params():
    return [pytest.param(case, dtype, id=f"{case.name}-{dtype}") for case in CASES for dtype in case.float_dtypes]


all_cases = pytest.mark.parametrize("case", CASES, ids=[case.name for case in CASES])


# --- the zoo as a whole -------------------------------------------------------------


def test_zoo_has_enough_uniquely_named_cases():
    assert len(CASES) >= 30
    assert len(BY_NAME) == len(CASES)


def test_zoo_covers_the_structures_the_suite_checks():
    tags = {tag for case in CASES for tag in case.tags}
    wanted = {"nested", "cond", "multi_method", "tuple_output", "dict_output", "nested_output", "kwargs", "int", "bool"}
    assert wanted <= tags
    assert any(len(case.methods) > 1 and "forward" not in case.methods for case in CASES)
    assert any(any(not isinstance(i, bc.TensorInput) for i in args) for case in CASES for args in case.inputs.values())


def test_every_zoo_class_is_used_and_documented():
    modules = {
        name: cls
        for name, cls in vars(zoo).items()
        if isinstance(cls, type) and issubclass(cls, torch.nn.Module) and cls.__module__ == zoo.__name__
    }
    seeds = load_torchscript_zoo()
    used = {case.build.args[0].__name__ for case in CASES + seeds} | {"L", "M", "SeedL", "SeedM"}  # parts of N
    assert sorted(set(modules) - used) == []
    undocumented = [name for name, cls in modules.items() if not (cls.__doc__ or "").strip()]
    assert undocumented == []


def test_the_seeds_models_are_adds_and_subs_on_one_element():
    # PyTorch's demo compiler takes aten::add, aten::sub and constants, and computes one element:
    # the TorchScript form's seed models are exactly that, scripted as the seeds script them.
    seeds = {case.name: case for case in load_torchscript_zoo()}
    assert sorted(seeds) == ["seed_basic_module", "seed_nested_nml", "seed_two_methods"]
    assert seeds["seed_two_methods"].methods == ("forward", "sub_accum")
    for case in seeds.values():
        scripted = torch.jit.script(case.build())
        for method in case.methods:
            graph = getattr(scripted, method).graph
            torch._C._jit_pass_inline(graph)
            kinds = {n.kind() for n in graph.nodes()} - {"prim::Constant", "prim::GetAttr"}
            assert kinds <= {"aten::add", "aten::sub"}, (case.name, method, kinds)
            assert all(i.shape == (1,) for i in case.inputs[method])
    x, h = torch.tensor([0.5]), torch.tensor([0.25])
    assert seeds["seed_nested_nml"].build()(x, h).item() == 0.25
    assert seeds["seed_basic_module"].build()(x, h).item() == 0.75


def test_load_zoo_reads_the_file_once():
    assert load_zoo() == CASES
    assert load_zoo() is not load_zoo()  # a copy: callers cannot change the cached zoo
    assert _zoo_loader._load_shipped.cache_info().misses == 1


# --- each case ----------------------------------------------------------------------


#: models.toml lists what the newest releases' exports call; an older release may not call an op
#: yet: (model, op) -> the first release whose float32 export calls it (measured under 2.10-2.12).
CALLED_SINCE = {("multihead_attention", "aten.reshape.default"): (2, 13)}


@all_cases
def test_listed_ops_are_the_exported_ops(case):
    from pytest_backendconf import _compat

    observed = exported_ops(case.name)
    listed = {op for op in case.ops if _compat.torch_version() >= CALLED_SINCE.get((case.name, op), (0, 0))}
    missing = sorted(listed - observed)
    unlisted = sorted(observed - set(case.ops))
    assert not missing, f"{case.name}: models.toml lists ops its float32 export does not call: {missing}"
    assert not unlisted, f"{case.name}: its float32 export calls ops models.toml does not list: {unlisted}"


@pytest.mark.parametrize(("case", "dtype"), dtype_params())
def test_case_runs_in_eager(case, dtype):
    model = case.build().to(getattr(torch, dtype))
    assert not model.training
    for method in case.methods:
        outputs = call(model, case, method, make_inputs(case, method, dtype))
        leaves = pytree.tree_leaves(outputs)
        assert leaves and all(isinstance(t, torch.Tensor) for t in leaves)
        for t in leaves:
            if t.is_floating_point():
                assert t.dtype in (getattr(torch, dtype), torch.float32)
                assert torch.isfinite(t).all(), f"{case.name}.{method} gives non-finite values in {dtype}"


@all_cases
def test_two_builds_have_the_same_weights(case):
    torch.manual_seed(0)
    first = case.build().state_dict()
    torch.manual_seed(1)
    second = case.build().state_dict()
    assert first.keys() == second.keys()
    for key in first:
        torch.testing.assert_close(first[key], second[key], rtol=0, atol=0, msg=f"{case.name}: {key}")


def test_build_does_not_touch_the_global_rng():
    torch.manual_seed(7)
    expected = torch.rand(3)
    torch.manual_seed(7)
    BY_NAME["small_cnn"].build()
    torch.testing.assert_close(torch.rand(3), expected)


def test_batch_norm_statistics_are_not_the_identity():
    bn = BY_NAME["batch_norm_eval"].build().bn
    assert not torch.allclose(bn.running_mean, torch.zeros(3))
    assert not torch.allclose(bn.running_var, torch.ones(3))


def test_nested_nml_computes_x_times_5_minus_2_plus_3():
    x = torch.randn(4, 3)
    torch.testing.assert_close(BY_NAME["nested_nml"].build()(x), x * 5 - 2 + 3)


def test_cond_takes_either_branch_by_the_sign_of_the_sum():
    model = BY_NAME["cond_on_sign"].build()
    x = torch.rand(3, 4) + 0.1
    torch.testing.assert_close(model(x), torch.cos(x) * 2.0)
    torch.testing.assert_close(model(-x), torch.sin(-x) - 1.0)


# --- lowered to the reference backend -------------------------------------------------


@pytest.fixture(scope="module")
def reference_backend():
    pytest.importorskip(
        "backendconf_reference", reason="the reference backend (backends/reference) is not installed here"
    )
    return "reference"


@all_cases
def test_reference_backend_matches_eager(case, reference_backend):
    if "float32" not in case.float_dtypes:
        pytest.skip(f"{case.name} is not checked in float32")
    model = case.build()
    example = {method: make_inputs(case, method, "float32") for method in case.methods}
    lowered = bc.to_backend(
        model,
        reference_backend,
        {method: {} for method in case.methods},
        example_inputs=example,
        example_kwargs=case.kwargs,
    )
    for method in case.methods:
        calls = [example[method], make_inputs(case, method, "float32", seed=1)]
        if "cond" in case.tags:  # the other branch too
            calls.append(tuple(-a if isinstance(a, torch.Tensor) and a.is_floating_point() else a for a in calls[0]))
        for args in calls:
            torch.testing.assert_close(
                call(lowered, case, method, args),
                call(model, case, method, args),
                msg=lambda text: f"{case.name}.{method}: {text}",
            )


# --- the loader's errors ------------------------------------------------------------

VALID = """
[[model]]
name = "nested"
class = "N"
description = "three nested modules"
tags = ["nested"]
float_dtypes = ["float32"]
ops = ["aten.mul.Tensor"]
[model.inputs]
forward = [{shape = [4, 3]}]
"""


def test_parse_models_reads_text_and_files(tmp_path):
    path = tmp_path / "models.toml"
    path.write_text(VALID)
    (from_text,) = parse_models(VALID)
    (from_file,) = parse_models(path)
    assert from_text.name == from_file.name == "nested"
    assert from_file.inputs == {"forward": (bc.TensorInput(shape=(4, 3)),)}
    assert from_file.float_dtypes == ("float32",)
    torch.testing.assert_close(from_file.build()(torch.ones(1)), torch.tensor([6.0]))


def test_parse_models_reads_varying_dimensions():
    (case,) = parse_models(
        VALID.replace("{shape = [4, 3]}", '{shape = ["batch", 3]}')
        + "[model.dims]\nbatch = {min = 1, max = 8, example = 4}\n"
    )
    (spec,) = case.inputs["forward"]
    dim = spec.shape[0]
    assert (type(dim), dim.__name__, dim.min, dim.max) == (torch.export.Dim("b", min=1, max=2).__class__, "batch", 1, 8)
    assert case.example_sizes() == {"batch": 4}
    assert spec.concrete_shape(case.example_sizes()) == (4, 3)
    assert case.dynamic_shapes("forward") == ({0: dim},)


def test_model_case_checks_its_dims():
    batch = torch.export.Dim("batch", min=1, max=16)
    case = bc.ModelCase(name="c", build=lambda: None, inputs={"forward": (bc.TensorInput(shape=(batch, 3)),)})
    assert case.example_sizes() == {"batch": 2}
    with pytest.raises(ValueError, match=r"dim_examples\['batch'\] = 40 is outside \[1, 16\]"):
        bc.ModelCase(
            name="c",
            build=lambda: None,
            inputs={"forward": (bc.TensorInput(shape=(batch, 3)),)},
            dim_examples={"batch": 40},
        )
    with pytest.raises(ValueError, match=r"Dim 'n' needs bounds"):
        bc.TensorInput(shape=(torch.export.Dim("n"), 3))
    with pytest.raises(ValueError, match=r"two Dims named 'batch' have different bounds"):
        bc.ModelCase(
            name="c",
            build=lambda: None,
            inputs={
                "forward": (
                    bc.TensorInput(shape=(batch, 3)),
                    bc.TensorInput(shape=(torch.export.Dim("batch", min=1, max=4),)),
                )
            },
        )


def test_parse_models_reads_constants_kwargs_and_default_dtypes():
    scalar, keyword = parse_models(
        """
        [[model]]
        name = "scalar"
        class = "ScalarArgument"
        [model.inputs]
        forward = [{shape = [2], dtype = "int64", low = 0, high = 3}, {value = 3}]

        [[model]]
        name = "keyword"
        class = "KeywordScale"
        [model.inputs]
        forward = [{shape = [2]}]
        [model.kwargs]
        forward = {scale = 3.0}
        """
    )
    assert scalar.inputs["forward"] == (bc.TensorInput(shape=(2,), dtype="int64", low=0, high=3), 3)
    assert scalar.float_dtypes == ("float32", "float16", "bfloat16")
    assert keyword.kwargs == {"forward": {"scale": 3.0}}


BAD_ENTRIES = [
    pytest.param(
        VALID.replace('class = "N"', 'class = "Nn"'),
        "model #1 'nested': field 'class': 'Nn' is not a Module class of pytest_backendconf.conformance.zoo "
        "(did you mean 'N'?); define it in conformance/zoo.py",
        id="unknown-class",
    ),
    pytest.param(
        VALID.replace('class = "N"', 'class = "functools"'),
        "field 'class': 'functools' is not a Module class",
        id="class-not-a-module",
    ),
    pytest.param(
        VALID.replace("tags =", "tag ="),
        "model #1 'nested': field 'tag': unknown key (did you mean 'tags'?); the keys are name, class, inputs,",
        id="unknown-key",
    ),
    pytest.param(
        VALID.replace("{shape = [4, 3]}", '{shape = [4, 3], dtype = "float64"}'),
        "model #1 'nested': field 'inputs.forward[0].dtype': 'float64' (did you mean 'float16'?) is not one of "
        "float, float32, float16, bfloat16, int64, bool",
        id="bad-input-dtype",
    ),
    pytest.param(
        VALID.replace('float_dtypes = ["float32"]', 'float_dtypes = ["float32", "half"]'),
        "model #1 'nested': field 'float_dtypes': 'half' is not one of float32, float16, bfloat16",
        id="bad-float-dtype",
    ),
    pytest.param(
        VALID + VALID,
        "model #2 'nested': field 'name': duplicate of model #1; names must be unique",
        id="duplicate-name",
    ),
    pytest.param(
        VALID.replace('name = "nested"', 'name = "Nested-Model"'),
        "field 'name': 'Nested-Model' must be lower snake case",
        id="bad-name",
    ),
    pytest.param(
        VALID.split("[model.inputs]")[0],
        "model #1 'nested': field 'inputs': missing; every model needs name, class and inputs",
        id="missing-inputs",
    ),
    pytest.param(
        VALID.replace("forward =", "encode ="),
        "model #1 'nested': field 'inputs.encode': N has no method 'encode'",
        id="unknown-method",
    ),
    pytest.param(
        VALID.replace("{shape = [4, 3]}", "{shape = [4, 3]}, {shape = [4, 3]}"),
        "model #1 'nested': field 'inputs.forward': 2 inputs do not fit N.forward(self, x)",
        id="too-many-inputs",
    ),
    pytest.param(
        VALID.replace("{shape = [4, 3]}", "{shape = [4, -3]}"),
        "field 'inputs.forward[0].shape': [4, -3] must be an array of non-negative integers",
        id="negative-shape",
    ),
    pytest.param(
        VALID.replace("{shape = [4, 3]}", "{shape = [4, 3], lowe = 0}"),
        "field 'inputs.forward[0]': unknown key 'lowe' (did you mean 'low'?)",
        id="unknown-input-key",
    ),
    pytest.param(
        VALID.replace("{shape = [4, 3]}", '{shape = [4, 3], dtype = "int64", low = 0.5}'),
        "field 'inputs.forward[0].low': 0.5 must be an integer for dtype 'int64'",
        id="float-bound-of-int",
    ),
    pytest.param(
        VALID.replace("{shape = [4, 3]}", "{shape = [4, 3], low = 2, high = 1}"),
        "field 'inputs.forward[0]': low 2 is above high 1",
        id="empty-range",
    ),
    pytest.param(
        VALID.replace("{shape = [4, 3]}", "{value = 3, shape = [1]}"),
        "field 'inputs.forward[0]': a constant input is {value = ...} alone",
        id="constant-with-shape",
    ),
    pytest.param(
        VALID + "[model.kwargs]\nencode = {scale = 2.0}\n",
        "model #1 'nested': field 'kwargs.encode': method 'encode' has no inputs; the methods are forward",
        id="kwargs-of-unknown-method",
    ),
    pytest.param(
        VALID + "[model.kwargs]\nforward = {scale = 2.0}\n",
        "field 'inputs.forward': 1 inputs do not fit N.forward(self, x): got an unexpected keyword argument 'scale'",
        id="kwarg-not-in-signature",
    ),
    pytest.param(
        VALID.replace('"aten.mul.Tensor"', '"mul"'),
        "field 'ops': 'mul' is not an overload name such as 'aten.mul.Tensor'",
        id="bad-op-name",
    ),
    pytest.param(
        VALID.replace("{shape = [4, 3]}", '{shape = ["batch", 3]}')
        + "[model.dims]\nbatch = {min = 1, max = 8, example = 1}\n",
        "field 'dims.batch.example': 1 must lie in [max(2, min), max] = [2, 8] (torch.export specialises sizes 0 and 1)",
        id="dim-example-below-two",
    ),
    pytest.param(
        VALID.replace("{shape = [4, 3]}", '{shape = ["batch", 3]}') + "[model.dims]\nbatch = {min = 4, max = 2}\n",
        "field 'dims.batch': min 4 and max 2 must be integers with 0 <= min < max",
        id="dim-empty-range",
    ),
    pytest.param(
        VALID.replace("{shape = [4, 3]}", '{shape = ["batch", 3]}') + "[model.dims]\nbatch = 8\n",
        "field 'dims.batch': must be a table {min = ..., max = ...} (example optional), got 8",
        id="dim-not-a-table",
    ),
    pytest.param(
        VALID.replace("{shape = [4, 3]}", '{shape = ["batch", 3]}') + "[model.dims]\nbatches = {min = 1, max = 8}\n",
        "field 'inputs.forward[0].shape': names dimension 'batch' (did you mean 'batches'?), which [model.dims] "
        "does not declare (declared: batches)",
        id="dim-not-declared",
    ),
    pytest.param(
        VALID + "[model.dims]\nbatch = {min = 1, max = 8}\n",
        "field 'dims.batch': is declared but no input shape names it",
        id="dim-unused",
    ),
    pytest.param(
        "[models]\nname = 1\n",
        "unknown top-level key(s) ['models']; write each model as a [[model]] table",
        id="unknown-top-level-key",
    ),
    pytest.param("[[model]\nname = 1\n", "not valid TOML", id="invalid-toml"),
]


@pytest.mark.parametrize(("text", "message"), BAD_ENTRIES)
def test_bad_entry_is_named_in_the_error(tmp_path, text, message):
    path = tmp_path / "models.toml"
    path.write_text(textwrap.dedent(text))
    with pytest.raises(ZooSpecError) as info:
        parse_models(path)
    assert str(info.value).startswith(f"{path}: ")
    assert message in str(info.value)


def test_spec_error_is_a_value_error_of_the_package():
    assert issubclass(ZooSpecError, ValueError)
    assert issubclass(ZooSpecError, bc.BackendConfError)


def test_importing_the_loader_does_not_import_torch():
    code = "import sys, pytest_backendconf.conformance._zoo_loader; print('torch' in sys.modules)"
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert result.stdout.strip() == "False"
