"""The package's annotations say what a value is: at most 12% of them may say ``Any``.

``Any`` turns mypy off for the value it types. Where it stands for a torch type imported lazily, a
``TYPE_CHECKING`` import says the real one; what stays is JSON read or written (``dict[str, Any]``),
values of libraries that ship no types, and what a model returns. The share is counted over every
annotation of a parameter, a return or a variable, as pytest's (5%) and Hypothesis's (8%) would be.
"""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).parent.parent / "pytest_backendconf"
#: The share of annotations that may mention ``Any``.
AT_MOST = 0.12


def any_share(root: Path) -> tuple[int, int]:
    """(annotations, those whose text mentions ``Any``) of every module under ``root``."""
    total = with_any = 0
    for path in root.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            annotations: list[ast.expr] = []
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                arguments = node.args
                every = [*arguments.posonlyargs, *arguments.args, *arguments.kwonlyargs]
                every += [a for a in (arguments.vararg, arguments.kwarg) if a is not None]
                annotations += [a.annotation for a in every if a.annotation is not None]
                annotations += [node.returns] if node.returns is not None else []
            elif isinstance(node, ast.AnnAssign):
                annotations.append(node.annotation)
            total += len(annotations)
            with_any += sum("Any" in ast.unparse(a) for a in annotations)
    return total, with_any


def test_at_most_a_share_of_the_package_annotations_say_any():
    total, with_any = any_share(PACKAGE)
    assert total > 3000  # the whole package was read
    assert with_any / total <= AT_MOST, f"{with_any} of {total} annotations say Any ({with_any / total:.1%})"


def test_the_share_counts_every_kind_of_annotation(tmp_path):
    (tmp_path / "m.py").write_text(
        "from typing import Any\n"
        "def f(a: Any, *b: int, c: 'dict[str, Any]', **d: str) -> Any: ...\n"
        "x: list[Any] = []\n"
        "y: int = 1\n"
    )
    assert any_share(tmp_path) == (7, 4)
