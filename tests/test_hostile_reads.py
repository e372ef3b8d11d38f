"""Files the project reads are bounded before they are parsed (docs/security.md, "What a reader promises").

Replay indexes (size, depth, count, duplicates), ``symbolicate``/``inspect``
inputs (a ``.debug`` file's size first; a folder), debug-info text that tries
to start an output line of its own, and known-failure patterns built to make
matching slow.
"""

from __future__ import annotations

import fnmatch
import json
import random
import re
import sys

import pytest
import torch

import pytest_backendconf as bc
from pytest_backendconf.cli._main import main
from pytest_backendconf.cli._replay import MAX_INDEX_BYTES, MAX_INDEX_ENTRIES, archive_paths
from pytest_backendconf.checks import id_matches
from pytest_backendconf.errors import ArchiveError, ArchiveSizeError, BackendConfError
from pytest_backendconf.report._known_failures import (
    MAX_PATTERN_WILDCARDS,
    KnownFailure,
    KnownFailureIndex,
    _prepare,
    load_known_failures,
)

from test_archive import entries_of
from test_archive_hostile import honest


# --- replay indexes ----------------------------------------------------------------------------


def _index(tmp_path, document):
    folder = tmp_path / "golden"
    folder.mkdir(exist_ok=True)
    (folder / "index.json").write_text(document if isinstance(document, str) else json.dumps(document))
    return folder


def test_a_replay_index_nested_too_deeply_is_a_clean_error(tmp_path, capsys):
    folder = _index(tmp_path, "[" * 100_000 + "]" * 100_000)
    with pytest.raises(BackendConfError, match=r"index.json' nests 100000 levels deep; at most 64 are read"):
        archive_paths([str(folder)])
    assert main(["replay", str(folder)]) == 1  # the command: an error line, not a RecursionError traceback
    assert "nests 100000 levels deep" in capsys.readouterr().err


def test_a_replay_index_listing_an_archive_twice_is_refused(tmp_path):
    folder = _index(tmp_path, {"archives": [{"archive": "a.bcpt"}, {"archive": "b.bcpt"}, {"archive": "a.bcpt"}]})
    with pytest.raises(BackendConfError, match=r"lists 'a.bcpt' more than once; an index names each archive once"):
        archive_paths([str(folder)])


def test_a_replay_index_too_large_or_too_long_is_refused_before_replaying(tmp_path):
    folder = _index(tmp_path, " " * (MAX_INDEX_BYTES + 1))
    with pytest.raises(BackendConfError, match=r"is larger than 4 MiB, more than any golden folder's index"):
        archive_paths([str(folder)])
    entries = [{"archive": f"m{i}.bcpt"} for i in range(MAX_INDEX_ENTRIES + 1)]
    folder = _index(tmp_path, {"archives": entries})
    with pytest.raises(BackendConfError, match=r"lists 20,001 archives; at most 20,000 are replayed from one index"):
        archive_paths([str(folder)])
    folder = _index(tmp_path, b"\xff\xfe".decode("latin-1"))
    (folder / "index.json").write_bytes(b"\xff\xfe{}")
    with pytest.raises(BackendConfError, match=r"is not UTF-8 text"):
        archive_paths([str(folder)])


# --- symbolicate and inspect ---------------------------------------------------------------------


class Small(torch.nn.Module):
    def forward(self, x):
        return torch.relu(x) * 2


X = torch.randn(2, 3)


def test_a_folder_is_an_archive_error_for_every_reader(tmp_path, capsys):
    folder = tmp_path / "model.bcpt"
    folder.mkdir()
    for read in (lambda: bc.symbolicate(folder, [1]), lambda: bc.load(folder), lambda: bc.read_archive(folder)):
        with pytest.raises(ArchiveError, match=r"model.bcpt' is a folder, not an archive; pass the archive file"):
            read()
    sidecar = tmp_path / "model.bcpt.debug"
    sidecar.mkdir()
    with pytest.raises(ArchiveError, match=r"is a folder, not a .debug file; pass the file itself"):
        bc.symbolicate(sidecar, [1])
    for command in (["symbolicate", str(folder), "1"], ["inspect", str(sidecar)]):
        assert main(command) == 1
        assert "is a folder" in capsys.readouterr().err


def test_a_named_debug_file_is_refused_by_its_size_before_it_is_read(tmp_path, capsys, monkeypatch):
    junk = tmp_path / "model.bcpt.debug"
    with open(junk, "wb") as f:
        f.truncate(40 * 2**20)  # sparse: 40 MiB of zeros, over a debug file's bound, under the archive limit
    read = []
    real_open = open

    def watched(path, *args, **kwargs):
        read.append(str(path))
        return real_open(path, *args, **kwargs)

    monkeypatch.setattr("builtins.open", watched)
    with pytest.raises(ArchiveSizeError, match=r"debug file .* is 41943040 bytes, more than a debug file of at most"):
        bc.symbolicate(junk, [1])
    for command in (["symbolicate", str(junk), "1"], ["inspect", str(junk)]):
        assert main(command) == 1
        assert "more than a debug file of at most" in capsys.readouterr().err
    assert str(junk) not in read  # refused by its size: never opened


FORGED = "\ntarget: ok\r\x1b[2Kcall 0: ok\u2028target: ok"


def _forged_archive(tmp_path, separate: bool = False):
    """A reference-backend archive whose debug table's file names and source lines try to forge output lines."""
    lowered = bc.to_backend(Small(), "reference", {"forward": {}}, example_inputs=(X,))
    path = tmp_path / "forged.bcpt"
    bc.save(lowered, path)
    entries = entries_of(path.read_bytes())
    document = json.loads(entries["debug.json"])
    document["lines"] = [line + FORGED for line in document["lines"]]
    document["files"] = [name + FORGED for name in document["files"]]
    entries["debug.json"] = json.dumps(document).encode()
    path.write_bytes(honest(entries))
    return path


def _column_zero(out: str) -> list[str]:
    return [line for line in out.splitlines() if line.startswith(("target: ok", "call 0: ok"))]


def test_debug_text_never_starts_a_line_in_symbolicate_profile_or_a_runtime_error(tmp_path, capsys):
    path = _forged_archive(tmp_path)
    handles = sorted(bc.read_archive(path).debug)
    assert main(["symbolicate", str(path), *map(str, handles)]) == 0
    out = capsys.readouterr().out
    assert "\\ntarget: ok" in out and not _column_zero(out), out
    log = tmp_path / "device.log"
    sourced = [h for h in handles if "\\ntarget: ok" in bc.symbolicate(path, [h])]
    assert sourced, "the forged archive's nodes have source lines"
    log.write_text(f"kernel failed: debug_handle={sourced[0]}\nfused: debug_handles=[{sourced[0]}, {sourced[-1]}]\n")
    assert main(["symbolicate", str(path), "--log", str(log)]) == 0
    out = capsys.readouterr().out
    assert "\\ntarget: ok" in out and not _column_zero(out), out
    assert main(["profile", str(path), "--example-inputs", "--repeat", "1"]) == 0
    out = capsys.readouterr().out
    assert not _column_zero(out), out
    text = bc.symbolicate(path, handles)
    assert "\\ntarget: ok" in text and not _column_zero(text)


# --- known-failure matching ----------------------------------------------------------------------


def _bench_bounds():
    """benchmarks/bench_bounds.py, which builds the hostile known-failures file it times."""
    import importlib.util
    from pathlib import Path

    path = Path(__file__).resolve().parent.parent / "benchmarks" / "bench_bounds.py"
    sys.path.insert(0, str(path.parent))
    try:
        spec = importlib.util.spec_from_file_location("bench_bounds_for_tests", path)
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
    finally:
        sys.path.remove(str(path.parent))
    return module


def test_the_index_matches_exactly_what_fnmatch_matches():
    """Prefix, suffix, length and literal-run filters never drop a match: random patterns against random ids."""
    rng = random.Random(41)
    alphabet = "ab:[]!*?-"
    patterns = list(dict.fromkeys("".join(rng.choice(alphabet) for _ in range(rng.randint(1, 9))) for _ in range(400)))
    index = KnownFailureIndex(KnownFailure(p, "r") for p in patterns)
    for _ in range(300):
        test_id = "".join(rng.choice("ab:[]!-") for _ in range(rng.randint(0, 8)))
        assert index.matching(test_id) == [i for i, p in enumerate(patterns) if id_matches(test_id, p)], test_id
    for pattern in ("x[]a]y", "x[!]]y", "x[ab", "x[]", "*[]", "a?*[!b]c*"):
        for text in ("xay", "x]y", "xby", "x[ab", "x[]", "abbcq", "a[]", "x"):
            assert _prepare(0, pattern).matches(text) == fnmatch.fnmatchcase(text, pattern), (pattern, text)


def test_a_pattern_with_too_many_wildcards_is_a_usage_error(tmp_path):
    known = tmp_path / "known.toml"
    pattern = "backendconf::parity::" + "*a" * (MAX_PATTERN_WILDCARDS + 1)
    known.write_text(f'"{pattern}" = {{ reason = "r" }}\n')
    with pytest.raises(pytest.UsageError, match=r"the pattern has 17 wildcards \(\*, \? and \[\); at most 16 are read"):
        load_known_failures(known, "--backendconf-known-failures")
    known.write_text('"backendconf::parity::x[float16]" = { reason = "an id, brackets and all" }\n')
    assert [e.pattern for e in load_known_failures(known, "--backendconf-known-failures")] == [
        "backendconf::parity::x[float16]"
    ]


def test_long_patterns_sharing_the_prefix_and_suffix_of_every_id_still_match_right():
    # The shape the benchmark times (benchmarks/bench_bounds.py): 500 patterns of about 1,000 characters,
    # each passing every literal filter for the ids, so each is matched by its regex.
    patterns = _bench_bounds().hostile_patterns(500)
    assert all(len(p) <= 1000 and p.count("*") + p.count("[") <= MAX_PATTERN_WILDCARDS for p in patterns)
    index = KnownFailureIndex(KnownFailure(p, "r") for p in patterns)
    for test_id in ("backendconf::parity::small_cnn[float16]", "backendconf::ops::aten.add.Tensor[float32-sample0]"):
        expected = [i for i, p in enumerate(patterns) if id_matches(test_id, p)]
        assert index.matching(test_id) == expected
    assert re.fullmatch(r"backendconf::.*\]", patterns[0], re.DOTALL)
