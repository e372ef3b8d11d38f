"""The inputs a command calls an archive's methods with: an ``--inputs`` JSON file, or example inputs
made from the methods' input specs (``run-target`` and ``profile`` read them here)."""

from __future__ import annotations

from ..errors import BackendConfError


def calls_from_file(archive: object, path: str) -> dict:
    """The calls of an ``--inputs`` JSON file (``run-target`` and ``profile``)."""
    from ..archive import DEFAULT_LIMITS, FileTooLargeError, read_regular_file
    from ..report import load_json

    cap = DEFAULT_LIMITS.max_example_input_bytes
    try:  # the file the user named (a link is followed); never a FIFO or a device, never past the cap
        text = read_regular_file(path, cap, follow_symlinks=True).decode("utf-8")
    except FileTooLargeError:
        raise BackendConfError(f"--inputs {path!r} is larger than {cap} bytes, the example inputs' limit") from None
    except UnicodeDecodeError:
        raise BackendConfError(f"--inputs {path!r} is not UTF-8 text; write JSON") from None
    # Bounded nesting: Python's parser recurses once per level, and a tensor needs one per dimension.
    document = load_json(text, f"--inputs {path!r}", 'write {"method": [[arg, ...], ...]}', BackendConfError)
    return calls_from_json(archive, document, path)


def calls_from_json(archive: object, document: object, name: str) -> dict:
    import torch

    from ..allowlist import dtype_named
    from ..errors import BackendConfError

    if not isinstance(document, dict):
        raise BackendConfError(f"--inputs {name!r} must hold a JSON object {{method: [[arg, ...], ...]}}")
    calls = {}
    for method, arg_lists in document.items():
        spec = archive.methods.get(method)  # type: ignore[attr-defined]
        if spec is None:
            raise BackendConfError(
                f"--inputs {name!r} names method {method!r}; the archive's methods are {', '.join(archive.methods)}"  # type: ignore[attr-defined]
            )
        if not isinstance(arg_lists, list) or not all(isinstance(a, list) for a in arg_lists):
            raise BackendConfError(f"--inputs {name!r}: {method!r} must map to a list of argument lists")
        converted = []
        for args in arg_lists:
            call = []
            for i, value in enumerate(args):
                value_spec = spec.inputs[i] if i < len(spec.inputs) else None
                if isinstance(value, list) and value_spec is not None and value_spec.kind == "tensor":
                    try:
                        value = torch.tensor(value, dtype=dtype_named(value_spec.dtype, where="--inputs"))
                    except (TypeError, ValueError, RuntimeError) as exc:
                        raise BackendConfError(
                            f"--inputs {name!r}: argument {i} of {method!r} is not a {value_spec.dtype} tensor: {exc}"
                        ) from None
                call.append(value)
            converted.append(tuple(call))
        calls[method] = converted
    return calls


def example_calls(archive: object, limits: object = None) -> dict:
    import torch

    from ..allowlist import dtype_named
    from ..archive import check_limits
    from ..archive import ITEMSIZE
    from ..errors import ArchiveSizeError

    # The shapes come from the file: add up what they would allocate before allocating any.
    cap = check_limits(limits).max_example_input_bytes
    total = 0
    shapes = {method: example_shapes(spec) for method, spec in archive.methods.items()}  # type: ignore[attr-defined]
    for method, spec in archive.methods.items():  # type: ignore[attr-defined]
        for i, value in enumerate(spec.inputs):
            if value.kind == "tensor":
                numel = 1
                for d in shapes[method][i]:
                    numel *= d
                total += numel * ITEMSIZE[value.dtype]
                if total > cap:
                    raise ArchiveSizeError(
                        f"archive {archive.source!r}: the example inputs of its methods need more than "  # type: ignore[attr-defined]
                        f"{cap} bytes (method {method!r}, input {value.name!r} of shape {list(value.shape)}); "
                        "pass --max-example-input-bytes N if the archive is trusted, or give --inputs"
                    )
    generator = torch.Generator().manual_seed(0)
    calls = {}
    for method, spec in archive.methods.items():  # type: ignore[attr-defined]
        args = []
        for i, value in enumerate(spec.inputs):
            if value.kind != "tensor":
                args.append(value.value)
                continue
            shape = shapes[method][i]
            dtype = dtype_named(value.dtype, where=f"method {method!r}, input {value.name!r}")
            if dtype.is_floating_point or dtype.is_complex:
                args.append(torch.randn(shape, generator=generator).to(dtype))
            elif dtype == torch.bool:
                args.append(torch.rand(shape, generator=generator) > 0.5)
            else:
                args.append(torch.randint(0, 10, shape, generator=generator, dtype=dtype))
        calls[method] = [tuple(args)]
    return calls


def example_shapes(spec: object) -> list[list[int]]:
    """Each input's example shape: recorded sizes as they are, a dynamic one inside its recorded range."""
    dynamic = spec.dynamic_shapes  # type: ignore[attr-defined]
    sizes = dynamic.example_sizes() if dynamic is not None else {}
    return [
        [sizes.get((i, dim), 2) if d is None else d for dim, d in enumerate(value.shape or ())]
        for i, value in enumerate(spec.inputs)  # type: ignore[attr-defined]
    ]


def describe(value: object) -> str:
    if hasattr(value, "dtype") and hasattr(value, "shape"):
        return f"{str(value.dtype).removeprefix('torch.')}[{', '.join(map(str, value.shape))}]"
    if isinstance(value, tuple):
        return "(" + ", ".join(describe(v) for v in value) + ("," if len(value) == 1 else "") + ")"
    if isinstance(value, list):
        return "[" + ", ".join(describe(v) for v in value) + "]"
    if isinstance(value, dict):
        return "{" + ", ".join(f"{k!r}: {describe(v)}" for k, v in value.items()) + "}"
    return repr(value)
