"""Counts in words: a count and its noun agree ("1 known failure", "30 known failures").

One helper for every summary line, note and HTML card of the report and the suite, so that a count
of one is never said in the plural nor a count of thirty in the singular.
"""

from __future__ import annotations


def counted(n: object, noun: str, plural: str | None = None) -> str:
    """``n`` and ``noun``, the noun in the plural unless ``n`` is 1.

    The plural of the last word is regular (``archive`` → ``archives``, ``pass`` → ``passes``) unless
    ``plural`` gives it whole; a participle (``failed``, ``skipped``, ``unsupported``) stays as it is,
    so that an outcome's words can be counted the same way.
    """
    return f"{n} {noun if n == 1 else plural or plural_of(noun)}"


def plural_of(noun: str) -> str:
    """``known failures`` for ``known failure``; participles (ending in ``ed``) are left alone."""
    head, _, last = noun.rpartition(" ")
    if last.endswith("ed"):
        return noun
    if last.endswith(("s", "x", "sh", "ch")):
        last += "es"
    else:
        last += "s"
    return f"{head} {last}" if head else last
