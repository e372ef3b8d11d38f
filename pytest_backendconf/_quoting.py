"""Foreign text quoted in the language of the file it is written into: one function per language.

Every file the project writes holds text from elsewhere: a check id, a model
or backend name, an engine's error message, a field of someone else's report.
Such text is data; written raw, a ``\"\"\"`` in an error ends a script's
docstring, a newline starts a TOML entry, a ``|`` splits a Markdown cell. Each
writer passes foreign text through the function for its file's language here
and nowhere else (docs/security.md, "What a writer promises"), so the rules of
a language live in one place. Every function is total: any ``str`` (control
characters, lone surrogates, U+2028) gives well-formed output. Never imports
torch.
"""

from __future__ import annotations

import html
import json
import re
import shlex
import unicodedata
from typing import Any, Iterable

__all__ = [
    "html_text",
    "markdown_code",
    "python_comment",
    "python_literal",
    "shell_command",
    "toml_comment",
    "toml_string",
    "visible",
    "xml_text",
]

#: Categories shown as escapes in comments and code spans: controls, format characters (bidi
#: overrides), line and paragraph separators, surrogates, and unassigned code points.
_HIDDEN = frozenset({"Cc", "Cf", "Zl", "Zp", "Cs", "Co", "Cn"})


def visible(text: str) -> str:
    """``text`` on one line, every control, format or separator character as its Python escape.

    A newline becomes the two characters ``\\n``; tabs and spaces stay.
    The building block of comments and code spans: what it returns holds no
    line break of any language (``\\n``, ``\\r``, U+2028, NEL, form feed).
    """
    if text.isprintable():
        # The common case, in C: `str.isprintable` is false for every character of the hidden
        # categories (and for tabs and separators other than the space, which the walk keeps).
        return text
    return "".join(repr(ch)[1:-1] if ch != "\t" and unicodedata.category(ch) in _HIDDEN else ch for ch in text)


# --- Python -------------------------------------------------------------------------------------


def python_literal(value: Any) -> str:
    """A Python expression evaluating to ``value`` (str, numbers, None, bools, and lists, tuples and
    dicts of them): ``repr``, which escapes quotes, backslashes and every non-printable character.
    (``inf`` and ``nan`` are written as names: a script using them imports them from ``math``.)"""
    return repr(value)


def python_comment(text: str, prefix: str = "# ") -> str:
    """``text`` as Python comment lines, each starting with ``prefix`` (``#`` and a space by default).

    Every line break of ``text`` (any `str.splitlines` separator) starts a new
    comment line; the characters Python would take as a line end or refuse in
    source (NUL) are shown escaped (`visible`). A comment cannot end early, so
    nothing in ``text`` runs.
    """
    if not prefix.lstrip().startswith("#"):
        raise ValueError(f"a comment prefix starts with '#', not {prefix!r}")
    lines = text.splitlines() or [""]
    return "\n".join(prefix + visible(line) if line else prefix.rstrip() for line in lines)


# --- shell --------------------------------------------------------------------------------------


def shell_command(parts: Iterable[str]) -> str:
    """A POSIX shell command line running ``parts`` as one argument each (`shlex.quote` of every part)."""
    return " ".join(shlex.quote(str(part)) for part in parts)


# --- TOML ---------------------------------------------------------------------------------------


def toml_string(text: str) -> str:
    """``text`` as a TOML basic string (``"…"``), on one line.

    Quotes, backslashes and every control character are escaped (TOML allows
    none raw but tab). A lone surrogate, which TOML cannot hold at all, is
    written as U+FFFD.
    """
    clean = "".join("\ufffd" if 0xD800 <= ord(ch) <= 0xDFFF else ch for ch in text)
    # json.dumps escapes ", \\ and U+0000..U+001F as TOML wants; DEL and the line separators of
    # other readers are escaped on top, so the line stays one line in any editor.
    out = json.dumps(clean, ensure_ascii=False)
    return re.sub("[\x7f\x80-\x9f\u2028\u2029]", lambda m: f"\\u{ord(m.group()):04x}", out)


def toml_comment(text: str) -> str:
    """``text`` as TOML comment lines (``# …``), control characters shown escaped (`visible`)."""
    return python_comment(text)  # a TOML comment has Python's shape: '#' to the end of the line


# --- XML ----------------------------------------------------------------------------------------

_SURROGATE = re.compile("[\ud800-\udfff]")
#: What XML 1.0 forbids even as a character reference: controls but tab, CR and LF; surrogates; FFFE/FFFF.
_NOT_XML = re.compile("[\x00-\x08\x0b\x0c\x0e-\x1f\ud800-\udfff\ufffe\uffff]")


def xml_text(text: str, *, markup: bool = True) -> str:
    """``text`` for an XML 1.0 document.

    Characters XML cannot hold at all are shown as their Python escape
    (``\\x00``). With ``markup`` (the default), ``&``, ``<``, ``>`` and both
    quotes become entities, ready for text or an attribute value written by
    hand; a writer that builds the document with ElementTree, which escapes
    those itself, passes ``markup=False``.
    """
    text = _NOT_XML.sub(lambda m: repr(m.group())[1:-1], text)
    if not markup:
        return text
    return html.escape(text, quote=True).replace("\r", "&#13;").replace("\n", "&#10;").replace("\t", "&#9;")


# --- Markdown -----------------------------------------------------------------------------------


def markdown_code(text: str) -> str:
    """``text`` as a Markdown code span that is safe in a table cell (GitHub-flavoured Markdown).

    A fence of one backtick more than the longest run of backticks in the
    text (padded with spaces when the text starts or ends with one), line
    breaks and control characters shown escaped (`visible`), and ``|``
    escaped as ``\\|``, which a table reads before the code span.
    """
    text = visible(text).replace("|", "\\|")
    longest = max((len(run) for run in re.findall("`+", text)), default=0)
    fence = "`" * (longest + 1)
    pad = " " if text.startswith(("`", " ")) or text.endswith(("`", " ")) or not text else ""
    return f"{fence}{pad}{text}{pad}{fence}"


# --- HTML ---------------------------------------------------------------------------------------


def html_text(value: Any) -> str:
    """``value`` as HTML text or a quoted attribute value: ``& < > " '`` as entities (None is empty).

    A lone surrogate, which no encoding of the page can hold, is shown as its escape (``\\ud800``).
    """
    text = _SURROGATE.sub(lambda m: repr(m.group())[1:-1], "" if value is None else str(value))
    return html.escape(text, quote=True)
