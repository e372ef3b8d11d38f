"""The diagnostic line of an error's text: the line a person reads first, not the wrapper around it.

An engine's compiler error often arrives wrapped: ``CompilerToolError: Error
invoking IREE compiler tool iree-compile`` on the first line, the compiler's
own diagnostic (``<stdin>:5:10: error: 'arith.constant' op failed to verify
…``) lines below. A known-failures reason and `FailingNodes`' ``diagnostic``
are that diagnostic. Never imports torch.
"""

from __future__ import annotations

import re

# A compiler's diagnostic: "file:line:col: error: …", "ld.lld: error: …", "fatal error: …" (MLIR,
# LLVM, clang and lld all write it so); what follows "error:" is the diagnostic itself.
_ERROR = re.compile(r"(?:^|[\s:])(?:fatal )?error:\s+(?P<text>\S.*)$")
# A line naming an op in an engine's own words: MLIR's "'arith.constant' op …", or a torch op.
_OP = re.compile(r"'[A-Za-z_][\w.]*' op\b|\baten(?:\.|::)\w+|\bprims(?:\.|::)\w+")


def diagnostic_line(text: str) -> str:
    """The first line of ``text`` that is a diagnostic, else its first line (stripped; ``""`` for none).

    A diagnostic is a line that names an op (MLIR's ``'arith.constant' op``,
    ``aten.tanh``/``aten::tanh``) or that is a compiler's error
    (``…: error: undefined symbol: log10f``: what follows ``error:`` is taken).
    The first line is taken when it is one itself, or when no line is.
    """
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    for line in lines:
        found = _ERROR.search(line)
        if found:
            return found.group("text").strip()
        if _OP.search(line):
            return line
    return lines[0] if lines else ""
