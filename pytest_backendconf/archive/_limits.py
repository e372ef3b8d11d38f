"""How much of each kind the archive reader accepts, and the same limits as command-line options.

An archive is untrusted input: a few kilobytes must not make the reader
allocate gigabytes. The defaults are tight relative to the file (a
deflated entry inflates to at most `Limits.max_expansion_ratio` times its
stored size) and each kind of entry has its own absolute cap; stored
entries cannot be larger than the file, which is read by its size.
"""

from __future__ import annotations

import argparse
import dataclasses
from typing import Any


@dataclasses.dataclass(frozen=True)
class Limits:
    """What the reader accepts at most; anything larger is an `ArchiveSizeError` naming the limit.

    Pass ``load(path, limits=Limits(max_debug_bytes=...))`` (or the
    ``backendconf`` command's ``--max-debug-bytes``) to read a trusted
    archive beyond a default.
    """

    #: The archive file itself (the format holds at most 4 GiB).
    max_archive_bytes: int = 2**32 - 1
    #: Zip entries in the archive.
    max_entries: int = 10_000
    #: Any one entry, inflated.
    max_entry_bytes: int = 2**32 - 1
    #: ``manifest.json`` and ``attributes.json``, each.
    max_json_bytes: int = 32 * 2**20
    #: ``debug.json``, inflated (it is the one deflated entry).
    max_debug_bytes: int = 32 * 2**20
    #: A deflated entry's inflated size over its stored size. Real debug
    #: tables deflate about 3 to 15 times; a zip bomb reaches 1000.
    max_expansion_ratio: int = 64
    #: Sum of the inflated sizes of all entries.
    max_total_bytes: int = 8 * 2**30
    #: Tensors ``backendconf run-target --example-inputs`` makes from the
    #: manifest's input shapes, in bytes for all methods together.
    max_example_input_bytes: int = 256 * 2**20

    def __post_init__(self) -> None:
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            if type(value) is not int or value < 1:
                raise ValueError(f"Limits({f.name}={value!r}): each limit is a positive integer")


DEFAULT_LIMITS = Limits()


def check_limits(limits: object) -> Limits:
    """``limits`` if it is a `Limits` (``None`` gives the defaults), else a `TypeError` saying what to pass."""
    if limits is None:
        return DEFAULT_LIMITS
    if not isinstance(limits, Limits):
        raise TypeError(
            f"limits must be a pytest_backendconf.Limits, got {type(limits).__name__}; "
            "e.g. limits=Limits(max_debug_bytes=64 * 2**20)"
        )
    return limits


def add_limit_options(parser: argparse.ArgumentParser) -> None:
    """``--max-archive-bytes`` and the rest, one per `Limits` field, with its default shown."""
    group = parser.add_argument_group("archive limits", "what the reader accepts at most (see Limits)")
    for f in dataclasses.fields(Limits):
        group.add_argument(
            "--" + f.name.replace("_", "-"),
            dest=f"limit_{f.name}",
            type=_positive,
            metavar="N",
            default=f.default,
            help=f"default {f.default}",
        )


def limits_from_options(args: argparse.Namespace) -> Limits:
    """The `Limits` of the options `add_limit_options` added."""
    values: dict[str, Any] = {f.name: getattr(args, f"limit_{f.name}", f.default) for f in dataclasses.fields(Limits)}
    return Limits(**values)


def _positive(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"{text!r} is not a positive integer")
    return value
