"""A minimal reproduction as a standalone script: the graph as Python, its inputs in a tensor file beside it.

The script is for the backend's compiler engineers: plain ``python
repro_x.py`` in its folder registers the backend the way the run did (its
``-p`` plugin modules and ``conftest.py`` files; an installed backend needs
nothing), lowers the graph with ``bc.to_backend`` and runs it, and so fails
the same way: it crashes or hangs, raises the same exception, or raises an
``AssertionError`` naming the operator whose outputs diverge from eager.
The inputs are a tensor file: raw tensor bytes, no code in it.
"""

from __future__ import annotations

import importlib.util
import os
import re
import textwrap
from pathlib import Path
from typing import TYPE_CHECKING, Sequence

from .._quoting import python_comment, python_literal

if TYPE_CHECKING:
    import torch

    from torch.export import ExportedProgram

    from ._minify import Candidate, Outcome, Reproduction

_HEADER = '''\
"""Minimal reproduction of a backend's failure, cut by pytest-backendconf: what fails is said below."""

{about}

import sys
from math import inf, nan  # noqa: F401  (the graph's code may name them)
from pathlib import Path

import torch
from torch import device  # noqa: F401

import pytest_backendconf as bc
from pytest_backendconf.archive import read_tensors

HERE = Path(__file__).resolve().parent
BACKEND = {backend}
#: How the run registered the backend: its -p plugin modules and conftest files (an installed backend's
#: entry point needs nothing here), and the folders they were imported from.
PLUGINS = {plugins}
PLUGIN_PATHS = {paths}
#: What to check after the call: "diverged" compares with eager PyTorch; otherwise the call itself fails.
FAILURE = {kind}
#: Per output: the operator it comes from, and the tolerance (rtol, atol) it is compared with.
OUTPUT_OPS = {output_ops}
TOLERANCES = {tolerances}


class Repro(torch.nn.Module):
{forward}

def register_backend():
    sys.path[:0] = [p for p in PLUGIN_PATHS if p not in sys.path]
    if PLUGINS:
        from pytest_backendconf.target import import_plugins

        import_plugins(PLUGINS)


def main():
    register_backend()
    tensors, _ = read_tensors(HERE / {tensors})
    inputs = tuple(tensors[f"input{{i}}"] for i in range(len(tensors)))
    model = Repro().eval()
    lowered = bc.to_backend(model, BACKEND, {{"forward": {{}}}}, example_inputs=inputs)
    with torch.no_grad():
        actual = lowered(*inputs)
        if FAILURE == "diverged":
            from pytest_backendconf.numerics import Tolerance, compare_outputs

            expected = model(*inputs)
            for i, (op, got, want) in enumerate(zip(OUTPUT_OPS, actual, expected)):
                rtol, atol = TOLERANCES[i]
                bad = [c for c in compare_outputs([got], [want], Tolerance(rtol, atol, "the check's")) if not c.passed]
                if bad:
                    raise AssertionError(
                        f"output {{i}} ({{op}}) on backend {{BACKEND!r}} diverges from eager PyTorch:\\n"
                        + "\\n".join(c.text() for c in bad)
                    )
    print(f"no failure: backend {{BACKEND!r}} ran this program without the failure this time")


if __name__ == "__main__":
    main()
'''


def script_stem(check_id: str) -> str:
    """``repro_parity_small_cnn_float16`` for ``parity::small_cnn[float16]``: a plain file name."""
    return "repro_" + re.sub(r"[^A-Za-z0-9]+", "_", check_id).strip("_")


def write_script(
    repro: Reproduction,
    directory: Path,
    stem: str,
    *,
    backend: str,
    plugins: Sequence[str],
    title: str,
    subject: str,
    tolerances: Sequence[tuple[float, float]] | None = None,
) -> Path:
    """Write ``<stem>.py`` and its inputs ``<stem>.safetensors`` into ``directory``; the script's path.

    :param repro: a `Reproduction` with a program.
    :param plugins: module names and ``conftest.py`` paths that registered the backend.
    :param tolerances: per output, for a divergence; default: the suite's parity defaults per dtype.
    """
    from ..archive import write_atomic, write_tensors
    from ._divergence import default_tolerance

    program, candidate = repro.program, repro.candidate
    assert program is not None and candidate is not None  # a Reproduction with a program
    directory.mkdir(parents=True, exist_ok=True)
    script = directory / f"{stem}.py"
    tensors = directory / f"{stem}.safetensors"
    write_tensors(tensors, {f"input{i}": t for i, t in enumerate(repro.inputs)}, {"kind": "minimal-reproduction"})
    outputs = [n.meta.get("val") for n in program.graph_module.graph.output_node().args[0]]
    if tolerances is None:
        tolerances = [
            (default_tolerance(v.dtype).rtol, default_tolerance(v.dtype).atol) for v in outputs if v is not None
        ]
    code = program.graph_module.code.strip("\n")
    count = len(candidate.nodes)
    # Everything below but the graph's code comes from a model, a check id or an engine's error: prose
    # goes into comment lines and values into literals (`_quoting`), so no text of theirs can run.
    about = (
        f"{title}.\n\n{_failure_line(candidate.outcome)}\n"
        f"{count} operator node{'' if count == 1 else 's'} ({', '.join(candidate.ops)}), cut by "
        f"pytest-backendconf from the program of\n{subject}; the values flowing into them are inputs, "
        f"read from {tensors.name}.\n{_node_lines(program, candidate)}\nRun it from any folder:  python {script.name}"
    )
    text = _HEADER.format(
        about=python_comment(about),
        tensors=python_literal(tensors.name),
        backend=python_literal(backend),
        plugins=python_literal(list(plugins)),
        paths=python_literal(_plugin_paths(plugins)),
        kind=python_literal(candidate.outcome.kind),
        output_ops=python_literal(list(repro.output_ops)),
        tolerances=python_literal([tuple(t) for t in tolerances]),
        forward=textwrap.indent(code, "    "),
    )
    write_atomic(script, text)
    return script


def _failure_line(outcome: Outcome) -> str:
    if outcome.kind == "crashed":
        return f"It crashes the process running it ({outcome.message})."
    if outcome.kind == "timed_out":
        return "It hangs: the backend does not return."
    if outcome.kind == "diverged":
        return f"Its outputs diverge from eager PyTorch at {outcome.op}."
    first = (outcome.message.splitlines() or [""])[0]
    return f"It raises {outcome.error_type}: {first[:300]}"


def _node_lines(program: ExportedProgram, candidate: Candidate) -> str:
    """One line per node: its name, operator and the model's source line it came from."""
    nodes = {n.name: n for n in program.graph_module.graph.nodes}
    lines = []
    for name, op in zip(candidate.nodes, candidate.ops):
        where = _source_of(nodes.get(name))
        lines.append(f"  {name}: {op}" + (f"  ({where})" if where else ""))
    return "\n" + "\n".join(lines) + "\n" if lines else ""


def _source_of(node: torch.fx.Node | None) -> str:
    trace = (node.meta.get("stack_trace") or "") if node is not None else ""
    found = re.findall(r'File "([^"]+)", line (\d+)', trace)
    if not found:
        return ""
    file, line = found[-1]
    return f"{os.path.basename(file)}:{line}"


def _plugin_paths(plugins: Sequence[str]) -> list[str]:
    """The folders the plugin modules import from (conftest files add their own folder)."""
    paths = []
    for plugin in plugins:
        if plugin.endswith(".py") or os.sep in plugin:
            continue
        try:
            spec = importlib.util.find_spec(plugin)
        except (ImportError, ValueError):
            spec = None
        if spec is None or not spec.origin or not os.path.isabs(spec.origin):
            continue
        root = Path(spec.origin).parent
        for _ in range(plugin.count(".") + (spec.submodule_search_locations is not None)):
            root = root.parent
        if str(root) not in paths:
            paths.append(str(root))
    return paths
