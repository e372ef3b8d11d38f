"""Dynamic shapes: lowering with ``dynamic_shapes``, the checks of every call, archives, the suite."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest
import torch
from torch.export import Dim

import pytest_backendconf as bc
from pytest_backendconf.lowering import _saving
from pytest_backendconf.conformance import zoo
from pytest_backendconf.errors import ArchiveError

TESTS_DIR = os.path.dirname(os.path.abspath(__file__))


@pytest.fixture(scope="module")
def cnn():
    return zoo.build(zoo.SmallCNN)


@pytest.fixture(scope="module")
def lowered_cnn(cnn):
    x4 = torch.randn(4, 3, 8, 8)
    return bc.to_backend(
        cnn, "reference", {"forward": {}}, example_inputs=(x4,), dynamic_shapes={"x": {0: Dim("b", min=1, max=64)}}
    )


def test_one_lowered_module_matches_eager_across_the_range(cnn, lowered_cnn):
    for batch in (1, 33, 64):
        x = torch.randn(batch, 3, 8, 8)
        torch.testing.assert_close(lowered_cnn(x), cnn(x), rtol=0, atol=0)


def test_a_size_outside_the_range_names_input_dimension_and_range(lowered_cnn):
    with pytest.raises(bc.InputSpecError, match=r"input 'x': dimension 0 is 65, outside the range \[1, 64\]"):
        lowered_cnn(torch.randn(65, 3, 8, 8))
    # A static dimension is still checked as before.
    with pytest.raises(bc.InputSpecError, match=r"float32\[\?, 3, 8, 8\]"):
        lowered_cnn(torch.randn(2, 3, 9, 8))


@pytest.mark.slow
def test_the_archive_keeps_the_ranges_in_its_own_json_and_a_fresh_process_checks_them(lowered_cnn, cnn, tmp_path):
    path = tmp_path / "cnn.bcpt"
    bc.save(lowered_cnn, path)
    manifest = bc.read_archive(path.read_bytes()).manifest
    method = next(m for m in manifest["methods"] if m["name"] == "forward")
    assert method["dynamic_shapes"] == {
        "symbols": [{"min": 1, "max": 64}],
        "inputs": [{"input": 0, "dim": 0, "symbol": 0}],
        "outputs": [{"output": 0, "dim": 0, "symbol": 0}],
    }
    assert "s7" not in json.dumps(method["dynamic_shapes"])  # no torch symbol names
    torch.save({b: (torch.randn(b, 3, 8, 8)) for b in (1, 33, 64)}, tmp_path / "inputs.pt")
    expected = {b: cnn(x) for b, x in torch.load(tmp_path / "inputs.pt").items()}
    torch.save(expected, tmp_path / "expected.pt")
    script = textwrap.dedent(
        f"""
        import torch, pytest_backendconf as bc
        m = bc.load({str(path)!r})
        inputs, expected = torch.load({str(tmp_path / "inputs.pt")!r}), torch.load({str(tmp_path / "expected.pt")!r})
        for b, x in inputs.items():
            torch.testing.assert_close(m(x), expected[b], rtol=0, atol=0)
        try:
            m(torch.randn(65, 3, 8, 8))
        except bc.InputSpecError as exc:
            print("REJECTED", exc)
        """
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert "REJECTED method 'forward' input 'x': dimension 0 is 65, outside the range [1, 64]" in done.stdout


class Pair(torch.nn.Module):
    def forward(self, x, y, z):
        return x + y, torch.cat([x, z], 0)


@pytest.fixture(scope="module")
def lowered_pair():
    b = Dim("b", min=2, max=8)
    return bc.to_backend(
        Pair(),
        "reference",
        {"forward": {}},
        example_inputs=(torch.randn(3, 4), torch.randn(3, 4), torch.randn(4, 4)),
        dynamic_shapes=({0: b}, {0: b}, {0: b + 1}),
    )


def test_equal_and_derived_dimensions_are_checked(lowered_pair):
    out = lowered_pair(torch.randn(5, 4), torch.randn(5, 4), torch.randn(6, 4))
    assert [o.shape[0] for o in out] == [5, 11]
    with pytest.raises(
        bc.InputSpecError, match=r"input 'y': dimension 0 is 4, but it must equal input 'x' dimension 0, which is 5"
    ):
        lowered_pair(torch.randn(5, 4), torch.randn(4, 4), torch.randn(6, 4))
    with pytest.raises(
        bc.InputSpecError, match=r"input 'z': dimension 0 is 5, but it must be \(input 'x' dimension 0\) \+ 1 = 6"
    ):
        lowered_pair(torch.randn(5, 4), torch.randn(5, 4), torch.randn(5, 4))


def test_outputs_must_follow_the_call_sizes(lowered_pair):
    class KeepsFirstShape(type(lowered_pair.lowered.backend)):
        name = "keeps_first"

        def execute(self, handle, inputs):
            outputs = super().execute(handle, inputs)
            return [o[:2] for o in outputs]

    module = lowered_pair.lowered
    broken = type(module)(KeepsFirstShape(), module.methods, module.blobs, module.debug)
    with pytest.raises(bc.OutputSpecError, match=r"output 0: dimension 0 is 2 .* this call's input sizes make it 5"):
        broken.run("forward", (torch.randn(5, 4), torch.randn(5, 4), torch.randn(6, 4)), {})


class TwoMethods(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.linear = torch.nn.Linear(4, 2)

    def encode(self, x):
        return self.linear(x)

    def decode(self, z):
        return z * 2


def test_several_methods_take_dynamic_shapes_per_method():
    model = TwoMethods().eval()
    lowered = bc.to_backend(
        model,
        "reference",
        {"encode": {}, "decode": {}},
        example_inputs={"encode": (torch.randn(3, 4),), "decode": (torch.randn(3, 2),)},
        dynamic_shapes={"encode": {"x": {0: Dim("n", min=1, max=10)}}},
    )
    assert lowered.encode(torch.randn(7, 4)).shape == (7, 2)
    with pytest.raises(bc.InputSpecError, match=r"float32\[3, 2\]"):  # decode stayed static
        lowered.decode(torch.randn(7, 2))


def test_one_method_may_be_keyed_by_its_name():
    lowered = bc.to_backend(
        zoo.build(zoo.MLP),
        "reference",
        {"forward": {}},
        example_inputs=(torch.randn(4, 8),),
        dynamic_shapes={"forward": {"x": {0: Dim("n", min=1, max=10)}}},
    )
    assert lowered(torch.randn(9, 8)).shape == (9, 3)


def test_bad_dynamic_shapes_are_lowering_errors():
    model = TwoMethods().eval()
    examples = {"encode": (torch.randn(3, 4),), "decode": (torch.randn(3, 2),)}
    with pytest.raises(
        bc.LoweringError, match=r"dynamic_shapes must be a dict \{method_name: .*\['z'\] are not among them"
    ):
        bc.to_backend(
            model,
            "reference",
            {"encode": {}, "decode": {}},
            example_inputs=examples,
            dynamic_shapes={"encode": {}, "z": {}},
        )
    with pytest.raises(bc.LoweringError, match=r"could not export method 'forward'"):
        # Export proves the batch must be 3 here: torch says which Dim and why.
        bc.to_backend(
            Pair(),
            "reference",
            {"forward": {}},
            example_inputs=(torch.randn(3, 4), torch.randn(3, 4), torch.randn(4, 4)),
            dynamic_shapes=({0: Dim("a", min=2, max=8)}, None, None),
        )


@pytest.mark.parametrize(
    "edit, message",
    [
        (lambda m: m["dynamic_shapes"]["symbols"][0].update(min=9, max=3), r"range \[9, 3\]"),
        (lambda m: m["dynamic_shapes"]["inputs"][0].update(dim=1), r"dimension 1 of input 0, which is not a symbolic"),
        (lambda m: m["dynamic_shapes"]["inputs"][0].update(symbol=4), r"names symbol 4"),
        (lambda m: m["dynamic_shapes"].pop("outputs"), r"symbols, inputs and outputs"),
    ],
)
def test_a_bad_dynamic_shapes_record_in_an_archive_is_refused(lowered_cnn, edit, message):
    from test_archive import edit_manifest

    def edit_forward(manifest):
        edit(next(m for m in manifest["methods"] if m["name"] == "forward"))

    data = edit_manifest(_saving.to_bytes(lowered_cnn), edit_forward)
    with pytest.raises(ArchiveError, match=rf"methods\[0\] is not a valid method spec .*{message}"):
        bc.load(data)


def test_example_inputs_draw_dynamic_sizes_inside_their_recorded_ranges(cnn, tmp_path, capsys):
    from pytest_backendconf.cli import _inputs, _main as cli

    # The example batch is 4, the range starts at 3: the size 2 that suits most archives is outside it.
    lowered = bc.to_backend(
        cnn,
        "reference",
        {"forward": {}},
        example_inputs=(torch.randn(4, 3, 8, 8),),
        dynamic_shapes={"x": {0: Dim("b", min=3, max=64)}},
    )
    path = tmp_path / "min3.bcpt"
    bc.save(lowered, path)
    ((x,),) = _inputs.example_calls(_saving.read_archive(path))["forward"]
    assert tuple(x.shape) == (3, 3, 8, 8)
    assert cli.main(["run-target", str(path), "--example-inputs"]) == 0
    assert capsys.readouterr().out.rstrip().endswith("target: ok")
