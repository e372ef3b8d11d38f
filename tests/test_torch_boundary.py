"""The torch boundary: private torch names are reached only through the `_compat` modules.

A torch release that moves a private name then breaks one module, whose
docstrings say which versions each shim was checked on. Strings that *name*
torch modules (the tracing modules a target blocks) are data, not uses, and
are not flagged.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ["pytest_backendconf", "conformance", "backends"]


def _private(dotted: str) -> bool:
    parts = dotted.split(".")
    if parts[0] != "torch" or parts[1:2] == ["ops"]:  # torch.ops.aten._softmax: an operator's own name
        return False
    return any(p.startswith("_") and not p.startswith("__") for p in parts[1:])


def _dotted(node: ast.AST) -> str | None:
    names = []
    while isinstance(node, ast.Attribute):
        names.append(node.attr)
        node = node.value
    if isinstance(node, ast.Name):
        return ".".join([node.id, *reversed(names)])
    return None


def private_uses(source: str) -> list[tuple[int, str]]:
    """``(line, name)`` of every private torch name the code imports or reads."""
    found = []
    tree = ast.parse(source)
    inner = {id(n.value) for n in ast.walk(tree) if isinstance(n, ast.Attribute)}  # report whole chains once
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found += [
                (node.lineno, f"{node.module}.{a.name}") for a in node.names if _private(f"{node.module}.{a.name}")
            ]
        elif isinstance(node, ast.Import):
            found += [(node.lineno, a.name) for a in node.names if _private(a.name)]
        elif isinstance(node, ast.Attribute):
            dotted = _dotted(node)
            if node.attr == "_schema":  # OpOverload._schema, on any expression
                found.append((node.lineno, "._schema"))
            elif id(node) not in inner and dotted is not None and _private(dotted):
                found.append((node.lineno, dotted))
    return sorted(set(found))


def test_the_check_finds_each_kind_of_private_use():
    source = (
        "import torch.utils._pytree\n"
        "from torch._subclasses.fake_tensor import FakeTensorMode\n"
        "from torch.utils import _pytree as pytree\n"
        "x = torch._ops.OpOverload\n"
        "y = target._schema.is_mutable\n"
        "z = torch.ops.aten._softmax.default\n"
        "names = ('torch._dynamo',)\n"
    )
    assert private_uses(source) == [
        (1, "torch.utils._pytree"),
        (2, "torch._subclasses.fake_tensor.FakeTensorMode"),
        (3, "torch.utils._pytree"),
        (4, "torch._ops.OpOverload"),
        (5, "._schema"),
    ]


def test_private_torch_names_only_in_compat_modules():
    outside = []
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            if path.name == "_compat.py" or ".venv" in path.parts or "build" in path.parts:
                continue
            for line, name in private_uses(path.read_text(encoding="utf-8")):
                outside.append(f"{path.relative_to(ROOT)}:{line}: {name}")
    assert not outside, "private torch names outside _compat (add a shim there):\n" + "\n".join(outside)
