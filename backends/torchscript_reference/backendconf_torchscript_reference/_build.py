"""Building the C++ library, once per source and torch version, into a cache folder.

The cache folder is ``$BACKENDCONF_TORCHSCRIPT_CACHE`` if set, else
``$XDG_CACHE_HOME/backendconf/torchscript`` (``~/.cache/...``); under it, one
folder per (torch version, hash of the C++ source), so that an edit of the
source or another torch builds afresh and nothing stale is ever loaded.

The build runs ``torch.utils.cpp_extension.load`` in a child process
(``python -m backendconf_torchscript_reference._build``): ``load`` also loads
the library into the process that builds it, and the process asking for the
path (pytest's) must not load it (the backend host and the target do). A
file lock lets two processes (pytest-xdist workers) ask at once: one builds,
the other waits and finds it built.
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import subprocess
import sys
from pathlib import Path

#: The name the library registers its backend under.
BACKEND_NAME = "torchscript_reference"
#: The environment variable naming the cache folder.
CACHE_ENV = "BACKENDCONF_TORCHSCRIPT_CACHE"
SOURCE = Path(__file__).parent / "csrc" / "reference_backend.cpp"
#: The library names: the reference, and the tests' broken variants (built from the same source).
REFERENCE_LIBRARY = "backendconf_ts_reference"
BROKEN_LIBRARY = "backendconf_ts_broken"
_FLAGS = {REFERENCE_LIBRARY: ["-O2"], BROKEN_LIBRARY: ["-O2", "-DBACKENDCONF_TS_BROKEN"]}


def cache_root() -> Path:
    """``$BACKENDCONF_TORCHSCRIPT_CACHE``, else ``backendconf/torchscript`` in the user's cache folder."""
    return Path(
        os.environ.get(CACHE_ENV)
        or os.path.join(
            os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "backendconf", "torchscript"
        )
    )


def cache_dir() -> Path:
    """The folder this torch and this source build into."""
    root = cache_root()
    import torch

    digest = hashlib.sha256(SOURCE.read_bytes()).hexdigest()[:12]
    return Path(root) / f"torch-{torch.__version__}-{digest}"


def library_path() -> str:
    """The reference backend's shared library, built first if it is not in the cache."""
    return _ensure(REFERENCE_LIBRARY)


def broken_library_path() -> str:
    """The library of the deliberately broken variants (``ts_broken_*``), for the project's tests."""
    return _ensure(BROKEN_LIBRARY)


def _ensure(name: str) -> str:
    folder = cache_dir()
    library = folder / f"{name}.so"
    if library.is_file():
        return str(library)
    folder.mkdir(parents=True, exist_ok=True)
    with open(folder / f"{name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # another process may be building it: wait for it
        if not library.is_file():
            print(f"backendconf: building {library} (once; about 30 s)", file=sys.stderr, flush=True)
            done = subprocess.run(
                [sys.executable, "-m", __name__, name, str(folder)], capture_output=True, text=True, check=False
            )
            if done.returncode != 0 or not library.is_file():
                raise RuntimeError(
                    f"building the TorchScript reference backend ({SOURCE}) into {folder} failed "
                    f"(exit {done.returncode}); it needs a C++ compiler (g++) and ninja. Output:\n"
                    f"{done.stdout[-4000:]}{done.stderr[-4000:]}"
                )
    return str(library)


def _build(name: str, folder: str) -> None:
    from torch.utils import cpp_extension

    cpp_extension.load(
        name=name,
        sources=[str(SOURCE)],
        extra_cflags=_FLAGS[name],
        build_directory=folder,
        is_python_module=False,
        verbose=True,
    )


if __name__ == "__main__":
    _build(sys.argv[1], sys.argv[2])
