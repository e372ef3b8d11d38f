"""Rerun one saved comparison from the inputs file a failing check wrote.

    python -m pytest_backendconf.rerun INPUTS.safetensors --backend=NAME [-p MODULE]

A failing ``ops`` check saves its inputs and the op call (a tensor file: no
code in it) under pytest's temporary directory and prints this command; a
failing ``parity`` check (static or dynamic shapes) saves its inputs the same way. It
lowers the same single-op program to the backend again, compares it with the
same reference and tolerance, and prints the same statistics; the exit
status is 0 when it passes, 1 when it fails, 2 on a usage error.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m pytest_backendconf.rerun", description=__doc__.splitlines()[0])
    parser.add_argument("inputs", type=Path, help="the inputs file a failing check saved")
    parser.add_argument("--backend", required=True, help="the registered backend to run it on")
    parser.add_argument(
        "-p",
        dest="plugins",
        metavar="MODULE",
        action="append",
        default=[],
        help="a module that registers backends (as with pytest -p); repeatable",
    )
    options = parser.parse_args(argv)

    from ..registry import BackendRegistry
    from ..archive import TensorFileError, read_tensors
    from ..errors import RegistryError
    from ._rerun_file import RerunFileError, checked_sample

    try:
        tensors, metadata = read_tensors(options.inputs)
    except TensorFileError as exc:
        return _usage_error(str(exc))  # it names the file
    except OSError as exc:
        return _usage_error(f"cannot read {options.inputs}: {exc}")
    kind = metadata.get("kind")
    if kind not in ("ops", "parity"):
        return _usage_error(f"{options.inputs} is not an inputs file of an ops or parity check (kind {_short(kind)})")
    sample = None
    if kind == "ops":
        # Checked before any plugin is imported or anything built: the file names the operator.
        try:
            sample = checked_sample(options.inputs, metadata, tensors)
        except RerunFileError as exc:
            return _usage_error(str(exc))
    registry = BackendRegistry()
    try:
        for name in options.plugins:
            import importlib

            from ..registry import source_of_module

            module = importlib.import_module(name)  # named on the command line, never by the file
            registry.add_plugin(module, source_of_module(module, f"plugin {name}"))
        registry.load_entry_points(select=options.backend)
        registered = registry.get(options.backend)
    except RegistryError as exc:
        return _usage_error(str(exc))
    try:
        if sample is None:
            return _rerun_parity(options.inputs, metadata, tensors, registered, registry)
        return _rerun_op(options.inputs, sample, registered, metadata.get("low_precision_reference") == "True")
    except RerunFileError as exc:
        return _usage_error(str(exc))


def _usage_error(text: str) -> int:
    print(f"error: {text}", file=sys.stderr)
    return 2


def _short(value: object, limit: int = 60) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _rerun_parity(path: Path, metadata: dict, tensors: dict, registered: object, registry: object) -> int:
    import tempfile

    import torch
    from .. import _compat

    from ..suite import SuiteContext
    from ..errors import OutputSpecError
    from ..numerics import InvalidIndices, compare_outputs
    from ..conformance import load_zoo, section
    from ..conformance.parity import tie_judge, tolerance_for, truth_for
    from ._rerun_file import checked_parity

    ctx = SuiteContext(
        registered,  # type: ignore[arg-type]
        load_zoo() + registry.cases(),  # type: ignore[attr-defined]
        tmp_dir=lambda name: Path(tempfile.mkdtemp(prefix=name)),
    )
    # The case, dtype, method and sizes are checked against the case, and the file's tensors
    # against the shapes they give, before an example is made: nothing is allocated from the file.
    case, dtype, method, sizes = checked_parity(path, metadata, tensors, ctx)
    args, kwargs = ctx.example(case, dtype, method, sizes=sizes)
    leaves, spec = _compat.tree_flatten((args, kwargs))
    saved = iter(tensors[f"input{i}"] for i in range(len(tensors)))
    args, kwargs = _compat.tree_unflatten([next(saved) if isinstance(x, torch.Tensor) else x for x in leaves], spec)
    ties = tie_judge(ctx, case, dtype, method, args, kwargs, dynamic=sizes is not None)
    expected = getattr(ctx.module(case, dtype), method)(*args, **kwargs)
    truth = truth_for(ctx, case, dtype)
    wide = truth(method, args, kwargs, expected) if truth is not None else None
    how = f", lowered with dynamic shapes, at {', '.join(f'{k}={v}' for k, v in sizes.items())}" if sizes else ""
    headline = f"{case}.{method} in {dtype}{how} on backend {ctx.name!r}"
    try:
        actual = getattr(ctx.lower(case, dtype, dynamic=sizes is not None), method)(*args, **kwargs)
    except OutputSpecError as exc:  # an output of the wrong dtype, shape or count: nothing to compare
        print(f"{headline}: FAILED, its outputs are not as the exported program says:\n  {exc}")
        return 1
    if ties is not None:  # index outputs whose ties are open: valid, or the first wrong index
        try:
            actual, _ = ties(list(_compat.tree_leaves(actual)), list(wide or _compat.tree_leaves(expected)))
        except InvalidIndices as exc:
            print(f"{headline} against eager: FAILED")
            print(exc)
            return 1
    if wide is not None:  # three ways, as the parity check judges (docs/conformance-suite.md)
        multiple = float(section("parity").get("eager_multiple", 2.0))
        results = compare_outputs(actual, wide, tolerance_for(ctx, dtype, case), expected, multiple)
    else:
        results = compare_outputs(actual, expected, tolerance_for(ctx, dtype, case))
    failed = any(not r.passed for r in results)
    print(f"{headline} against eager: {'FAILED' if failed else 'passed'}")
    for r in results:
        print(r.text())
    return 1 if failed else 0


def _rerun_op(path: Path, sample: object, registered: object, low_precision: bool) -> int:

    from ..lowering import lower_programs
    from ..numerics import StructureMismatch
    from ..capabilities import capabilities_of
    from ..conformance.ops import InvalidIndices, WritesInPlace, build_program, judge, op_call_class

    from ._rerun_file import RerunFileError, check_output_sizes

    try:
        # Fake tensors: the call's output shapes are known before anything is allocated.
        program = build_program(sample, sample.inputs)  # type: ignore[arg-type, attr-defined]
    except (RuntimeError, TypeError, ValueError, IndexError) as exc:
        raise RerunFileError(f"{path}: the sample's call cannot be built: {type(exc).__name__}: {exc}") from None
    check_output_sizes(path, program)
    backend = registered.backend  # type: ignore[attr-defined]
    lowered = lower_programs(
        {"forward": program},
        backend,
        {"forward": {}},
        module_type=op_call_class(len(sample.inputs)),  # type: ignore[attr-defined]
    )

    class _Ctx:  # what tolerance_for reads of a suite context
        capabilities = capabilities_of(backend)

    import torch

    from .. import _compat

    inputs = [t.clone() for t in sample.inputs]  # type: ignore[attr-defined]
    try:
        with torch.no_grad():
            actual = _compat.tree_leaves(lowered(*inputs))
        results, reference = judge(_Ctx(), sample, program, actual, inputs, low_precision)  # type: ignore[arg-type]
    except (StructureMismatch, InvalidIndices, WritesInPlace) as exc:
        print(f"{sample.name}: {exc}")  # type: ignore[attr-defined]
        return 1
    how = reference.how
    failed = any(not r.passed for r in results)
    print(f"{sample.name} on backend {registered.name!r} against {how}: {'FAILED' if failed else 'passed'}")  # type: ignore[attr-defined]
    for r in results:
        print(r.text())
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
