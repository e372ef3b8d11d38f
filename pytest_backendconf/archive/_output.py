"""Where a command's output document goes: the one check of an output option, and the one way it is written.

Every option that names a document to write (the report commands' ``-o``, ``--markdown``, ``replay
--report``/``--junitxml``, ``profile --chrome-trace``, the suite's ``--backendconf-report``,
``--backendconf-html`` and ``--backendconf-write-known-failures``) is checked by `output_file` before
the work starts, and written by `OutputFile.write` after it. It lives beside `write_atomic`, whose
writes it chooses between, in the lowest room that both the suite and the CLI may import.

What the path is decides how the document is written:

- ``-``, or a path that is this process's standard output (``/dev/stdout``): standard output, as
  Unix tools do; what else the command prints then goes to standard error.
- a FIFO, a terminal or another device: opened and written as a stream. A rename would put a
  regular file in its place, and every later writer to that name would write into the file.
- a regular file, a new name, or a symlink to one: replaced atomically (`write_atomic`). A symlink's
  target is replaced, not the link, so the link stays a link.
"""

from __future__ import annotations

import os
import stat
import sys
from dataclasses import dataclass
from pathlib import Path

from ..errors import BackendConfError
from ._files import write_atomic

#: The value that names standard output.
STDOUT = "-"


class OutputPathError(BackendConfError, ValueError):
    """An output option that cannot be written; the text names the option, its value and the fix.

    The package's own error, so the ``backendconf`` command reports it as it reports the others
    (one line, exit status 1); the suite raises it again as a `pytest.UsageError`. Neither repeats the words.
    """


@dataclass(frozen=True)
class OutputFile:
    """An output option's checked value: `output_file` makes it, `write` writes the document."""

    #: The option, as errors name it (``-o``, ``--backendconf-report``).
    option: str
    #: The value as given.
    value: str
    #: The file, or None for standard output.
    path: Path | None

    @property
    def name(self) -> str:
        """What status lines call the destination ("written to ...")."""
        return "standard output" if self.value == STDOUT else self.value

    @property
    def to_stdout(self) -> bool:
        return self.path is None

    @property
    def old_file(self) -> Path | None:
        """The regular file (or a symlink's regular target) this write replaces, whose entries an update
        may keep; None for standard output, a stream (reading a pipe would block or eat its input) or a new name."""
        return self.path if self.path is not None and self.path.is_file() else None

    def write(self, text: str) -> None:
        """Write ``text`` (UTF-8) where the value names; raises `OutputPathError` when the file cannot be written."""
        if self.path is None:
            # A closed pipe raises BrokenPipeError here, for the command to end quietly (`cli.file_errors`).
            sys.stdout.flush()  # what was printed before comes first
            binary = getattr(sys.stdout, "buffer", None)
            if binary is None:
                sys.stdout.write(text)
                sys.stdout.flush()
            else:  # UTF-8 as in a file, whatever the terminal's encoding (the page's ✓)
                binary.write(text.encode("utf-8"))
                binary.flush()
            return
        try:
            try:
                mode: int | None = os.stat(self.path).st_mode
            except FileNotFoundError:  # a new name, or a symlink to one
                mode = None
            if mode is not None and not stat.S_ISREG(mode):
                with open(self.path, "w", encoding="utf-8", newline="\n") as stream:
                    stream.write(text)
            else:
                write_atomic(os.path.realpath(self.path), text)
        except OSError as exc:
            raise OutputPathError(f"cannot write {self.option} {self.value!r}: {exc.strerror or exc}") from None


def output_file(
    option: str, value: str, *, base: str | os.PathLike | None = None, stdout_carries: str = ""
) -> OutputFile:
    """``value`` of ``option`` checked before the work, so that a typo does not cost the whole run.

    :param base: the folder a relative ``value`` is in (the suite's invocation folder); default the
        current one.
    :param stdout_carries: what the command itself prints, when standard output is not free for the
        document (pytest's own output): ``-`` and ``/dev/stdout`` are then refused.
    :raises OutputPathError: a directory, a folder that does not exist, or a refused standard output.
    """
    path = Path(base, value) if base is not None else Path(value)
    if value == STDOUT or _is_stdout(path):
        if stdout_carries:
            raise OutputPathError(
                f"{option} {value!r}: that is standard output, which carries {stdout_carries}; give a file name"
            )
        return OutputFile(option, value, None)
    if path.is_dir():
        raise OutputPathError(f"{option} {value!r}: that is a directory; give a file name in it")
    # A symlink's target is what gets written: its folder must exist too.
    parent = path.parent if not path.parent.is_dir() else Path(os.path.realpath(path)).parent
    if not parent.is_dir():
        raise OutputPathError(f"{option} {value!r}: the directory {str(parent)!r} does not exist; create it first")
    return OutputFile(option, value, path)


def _is_stdout(path: Path) -> bool:
    """Whether ``path`` is the file this process's standard output is (``/dev/stdout``, or ``out.txt``
    under ``> out.txt``): written in place, never replaced under the shell that opened it."""
    try:
        return os.path.samestat(os.stat(path), os.fstat(1))
    except (OSError, ValueError):
        return False
