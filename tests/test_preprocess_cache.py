"""``--backendconf-cache``: a rerun reuses unchanged lowerings, and nothing else.

Real pytest runs of a backend that counts its ``preprocess`` calls in a file (the reference backend
otherwise), real ``torch.export`` programs for the key, and real processes for the concurrent
writers and the key's stability across processes.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from pytest_backendconf.archive import encode_cache_entry
from pytest_backendconf.debuginfo import DebugHandleRecorder
from pytest_backendconf.lowering import PreprocessCache, export_method, program_digest

ROOT = Path(__file__).resolve().parent.parent

COUNTING_BACKEND = """
from backendconf_reference import ReferenceBackend


class Counting(ReferenceBackend):
    name = "counting"

    def preprocess(self, program, compile_spec, debug_handles):
        with open({count!r}, "a") as f:
            f.write("preprocess\\n")
        return super().preprocess(program, compile_spec, debug_handles)
"""
CONFTEST = """
from counting_backend import Counting

def backendconf_register_backends(register):
    register(Counting())
"""
SELECT = ("backendconf::parity::small_cnn[[]float32]", "backendconf::ops::aten.mul.Tensor[[]float32-*")


@pytest.fixture
def counting(pytester):
    """A pytester folder with the counting backend; returns the function that runs the suite there.

    The runs check in the pytest process (tests/conftest.py sets BACKENDCONF_IN_PROCESS), except
    where a test turns that off to run them in the backend host.
    """
    count = pytester.path / "preprocess-calls.txt"
    pytester.makepyfile(counting_backend=COUNTING_BACKEND.format(count=str(count)))
    pytester.makeconftest(CONFTEST)

    def run(*more: str):
        count.write_text("")
        args = ["--backend=counting", "-p", "no:cacheprovider", *(f"--backendconf-select={s}" for s in SELECT), *more]
        # Each run in a process of its own, as runs are.
        result = pytester.runpytest_subprocess(*args)
        result.assert_outcomes(passed=3)
        return result, len(count.read_text().splitlines())

    return run


@pytest.mark.slow  # five suite runs in fresh processes: `make test-slow` (the host's reuse stays in `make test`)
def test_a_rerun_reuses_every_lowering_until_an_entry_is_damaged_or_the_backend_is_edited(counting, pytester):
    first, cold = counting("--backendconf-cache=cache")
    assert cold >= 3  # parity's lowering and each op sample's
    first.stdout.fnmatch_lines([f"*preprocess cache */cache: 0 of {cold} preprocess calls reused, {cold} stored"])
    second, warm = counting("--backendconf-cache=cache")
    assert warm == 0
    second.stdout.fnmatch_lines([f"*preprocess cache */cache: {cold} of {cold} preprocess calls reused, 0 stored"])
    assert (
        (pytester.path / "cache" / "CACHEDIR.TAG").read_text().startswith("Signature: 8a477f597d28d172789f06886806bc55")
    )

    # A torn write, a flipped blob byte, garbage: each is found by the archive's reader, and is a miss.
    for i, entry in enumerate(sorted((pytester.path / "cache").glob("*.bcpc"))):
        data = entry.read_bytes()
        entry.write_bytes([data[: len(data) // 2], data[:-40] + bytes([data[-40] ^ 1]) + data[-39:], b"junk"][i % 3])
    damaged, after_damage = counting("--backendconf-cache=cache")
    assert after_damage == cold
    damaged.stdout.fnmatch_lines(
        [f"*0 of {cold} preprocess calls reused, {cold} stored, {cold} damaged entries removed"]
    )

    path = pytester.path / "counting_backend.py"
    path.write_text(path.read_text() + "\n# a fix in the backend's compiler\n")
    _, after_edit = counting("--backendconf-cache=cache")
    assert after_edit == cold


@pytest.mark.slow
def test_the_backend_host_is_where_the_cache_works(counting, monkeypatch):
    """preprocess runs in the backend host (not the pytest process): the host reads and writes the cache."""
    monkeypatch.delenv("BACKENDCONF_IN_PROCESS", raising=False)
    _, cold = counting("--backendconf-cache=cache")
    second, warm = counting("--backendconf-cache=cache")
    assert cold >= 3 and warm == 0
    second.stdout.fnmatch_lines([f"*preprocess cache *: {cold} of {cold} preprocess calls reused, 0 stored"])


def test_the_ini_option_and_the_environment_choose_the_folder_and_without_them_there_is_none(pytester, monkeypatch):
    def run() -> None:
        result = pytester.runpytest("--backend=reference", "--backendconf-select=nothing", "-p", "no:cacheprovider")
        assert result.ret == pytest.ExitCode.NO_TESTS_COLLECTED

    run()
    assert not list(pytester.path.rglob("CACHEDIR.TAG"))  # off unless given
    pytester.makeini("[pytest]\nbackendconf_cache = from-ini\n")
    run()
    assert (pytester.path / "from-ini" / "CACHEDIR.TAG").exists()
    monkeypatch.setenv("BACKENDCONF_CACHE", str(pytester.path / "from-env"))
    pytester.makeini("[pytest]\n")
    run()
    assert (pytester.path / "from-env" / "CACHEDIR.TAG").exists()


@pytest.mark.slow
def test_the_folder_stays_under_its_size_cap(counting, pytester):
    cap_mib = 0.002  # about 2 KiB: a couple of the reference backend's small blobs
    counting("--backendconf-cache=cache", f"--backendconf-cache-size={cap_mib}")
    sizes = [p.stat().st_size for p in (pytester.path / "cache").glob("*.bcpc")]
    assert sizes and sum(sizes) <= cap_mib * 2**20


@pytest.mark.parametrize(
    "make_bad, option, expected",
    [
        (
            lambda p: (p / "cache").write_text("x"),
            "--backendconf-cache=cache",
            "*--backendconf-cache=cache: */cache is a file, not a folder; give a folder you can write to*",
        ),
        (
            lambda p: (p / "afile").write_text("x"),
            "--backendconf-cache=afile/cache",
            "*--backendconf-cache=afile/cache: cannot write to */afile/cache: *; give a folder you can write to*",
        ),
        (
            lambda p: None,
            "--backendconf-cache-size=0",
            "*--backendconf-cache-size=0: give the cache's size cap as a positive number of MiB*",
        ),
        (lambda p: None, "--backendconf-cache-size=big", "*--backendconf-cache-size=big: give the cache's size cap*"),
    ],
)
def test_a_bad_cache_option_is_a_usage_error_naming_the_option_and_the_fix(pytester, make_bad, option, expected):
    make_bad(pytester.path)
    more = () if option.startswith("--backendconf-cache=") else ("--backendconf-cache=cache",)
    result = pytester.runpytest("--backend=reference", "--backendconf-select=nothing", option, *more)
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines([f"ERROR: {expected}"])


def test_the_environment_variable_is_named_when_it_is_bad(pytester, monkeypatch):
    (pytester.path / "cache").write_text("x")
    monkeypatch.setenv("BACKENDCONF_CACHE", "cache")
    result = pytester.runpytest("--backend=reference", "--backendconf-select=nothing")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["ERROR: $BACKENDCONF_CACHE=cache: * is a file, not a folder*"])


# --- the key ----------------------------------------------------------------------------------------------

KEY_SCRIPT = """
import sys, torch
from pytest_backendconf.lowering import export_method, program_digest

class Model(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = torch.nn.Conv2d(3, 4, 3)
        self.register_buffer("shift", torch.arange(4.0))
    def forward(self, x):
        return torch.relu(self.conv(x)).sum(dim=(2, 3)) + self.shift

torch.manual_seed(0)
model = Model().eval()
if sys.argv[1] == "edited":
    with torch.no_grad():
        model.conv.weight[0, 0, 0, 0] += 1e-3
print(program_digest(export_method(model, "forward", (torch.randn(1, 3, 8, 8),), {})))
"""


def _digest_in_a_fresh_process(variant: str) -> str:
    done = subprocess.run(
        [sys.executable, "-c", KEY_SCRIPT, variant], capture_output=True, text=True, check=True, cwd=ROOT
    )
    return done.stdout.strip().splitlines()[-1]


@pytest.mark.slow
def test_the_program_hash_is_the_same_in_two_processes_and_changes_with_a_weight():
    first, second = _digest_in_a_fresh_process("same"), _digest_in_a_fresh_process("same")
    edited = _digest_in_a_fresh_process("edited")
    assert len(first) == 64 and first == second
    assert edited != first


class _Linear(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.linear = torch.nn.Linear(4, 2)

    def forward(self, x):
        return self.linear(x) * 2


def _program_and_handles():
    torch.manual_seed(0)
    program = export_method(_Linear().eval(), "forward", (torch.randn(3, 4),), {})
    return program, DebugHandleRecorder().assign(program.graph_module)


def _cache(tmp_path, backend=None, max_bytes=2**20):
    from backendconf_reference import ReferenceBackend

    cache = PreprocessCache(tmp_path / "cache", backend or ReferenceBackend(), "1.0", max_bytes)
    cache.prepare()
    return cache


def test_the_key_covers_the_compile_spec_the_handles_the_weights_and_the_backends_version(tmp_path):
    cache = _cache(tmp_path)
    program, handles = _program_and_handles()
    key = cache.key(program, {}, handles)
    assert key is not None and key == cache.key(program, {}, handles)
    assert cache.key(program, {"opt_level": 3}, handles) != key
    # Handles are numbered per lowering: a later lowering of the program has the same ones, and the same key.
    assert cache.key(program, {}, DebugHandleRecorder().assign(program.graph_module)) == key
    other_handles = DebugHandleRecorder(first=10).assign(program.graph_module)  # blobs carry them
    assert cache.key(program, {}, other_handles) not in (None, key)
    edited, _ = _program_and_handles()
    edited.state_dict["linear.weight"].data[0, 0] += 1
    assert program_digest(edited) != program_digest(program)
    newer = PreprocessCache(tmp_path / "cache", cache.backend, "1.1", 2**20)
    assert newer.key(program, {}, handles) != key


def test_a_backend_defined_without_a_file_is_never_cached(tmp_path):
    namespace: dict = {"__name__": "__main__"}
    exec("class Nowhere:\n    name = 'nowhere'\n", namespace)
    saved = sys.modules.get("__main__")
    sys.modules["__main__"] = type(sys)("__main__")  # as under `python -c`: no __file__
    try:
        cache = _cache(tmp_path, backend=namespace["Nowhere"]())
        program, handles = _program_and_handles()
        assert cache.key(program, {}, handles) is None
    finally:
        sys.modules["__main__"] = saved


def test_an_entry_stored_under_another_key_or_of_another_format_is_a_miss(tmp_path):
    cache = _cache(tmp_path)
    cache.put("a" * 64, b"blob of a")
    assert cache.get("a" * 64) == b"blob of a"
    os.replace(cache.directory / ("a" * 64 + ".bcpc"), cache.directory / ("b" * 64 + ".bcpc"))
    assert cache.get("b" * 64) is None  # renamed: the manifest names key a
    assert not (cache.directory / ("b" * 64 + ".bcpc")).exists()
    (cache.directory / ("c" * 64 + ".bcpc")).write_bytes(encode_cache_entry("c" * 64, b"x", cache.secret)[:-1])
    assert cache.get("c" * 64) is None
    assert cache.counts == {"hits": 1, "misses": 2, "stored": 1, "removed": 2, "refused": 0, "verified": 0}


def test_eviction_removes_the_least_recently_used_entries_first(tmp_path):
    entry_size = len(encode_cache_entry("0" * 64, b"x" * 1000, b"any secret: the MAC's size is fixed"))
    cache = _cache(tmp_path, max_bytes=3 * entry_size)
    for i, key in enumerate(("1" * 64, "2" * 64, "3" * 64)):
        cache.put(key, b"x" * 1000)
        os.utime(cache.directory / (key + ".bcpc"), ns=(10**9 * (i + 1), 10**9 * (i + 1)))
    assert cache.get("1" * 64) is not None  # used now: the newest
    cache.put("4" * 64, b"x" * 1000)
    left = sorted(p.name[0] for p in cache.directory.glob("*.bcpc"))
    assert left == ["1", "3", "4"]


WRITER = """
import sys
from backendconf_reference import ReferenceBackend
from pytest_backendconf.lowering import PreprocessCache

cache = PreprocessCache(sys.argv[1], ReferenceBackend(), "1.0", 2**30)
cache.prepare()
seen = 0
for round in range(40):
    for k in range(8):
        key = str(k) * 64
        blob = (str(k) * 50_000).encode()
        got = cache.get(key)
        if got is not None:
            assert got == blob, "a reader saw another entry's or a partial blob"
            seen += 1
        cache.put(key, blob)
assert cache.counts["removed"] == 0, cache.counts
print(seen)
"""


@pytest.mark.slow
def test_two_concurrent_writers_never_corrupt_an_entry_or_show_a_partial_one(tmp_path):
    folder = tmp_path / "shared"
    writers = [
        subprocess.Popen([sys.executable, "-c", WRITER, str(folder)], stdout=subprocess.PIPE, text=True, cwd=ROOT)
        for _ in range(2)
    ]
    outputs = [w.communicate(timeout=300)[0] for w in writers]
    assert [w.returncode for w in writers] == [0, 0]
    assert all(int(out.strip()) > 0 for out in outputs)
    cache = _cache(tmp_path / "reader")
    cache.directory = folder
    for k in range(8):
        assert cache.get(str(k) * 64) == (str(k) * 50_000).encode()
    assert not [n for n in os.listdir(folder) if n.endswith(".tmp")]


def test_the_cache_entry_reader_refuses_a_manifest_that_lies_about_the_blob(tmp_path):
    from pytest_backendconf.archive import DEFAULT_LIMITS, pack, read_cache_entry
    from pytest_backendconf.errors import ArchiveError

    manifest = {
        "format": "backendconf-preprocess-cache",
        "schema_version": [2, 0],
        "key": "k",
        "blob": {"sha256": "0" * 64, "size": 4},
    }
    data = pack([("manifest.json", json.dumps(manifest, sort_keys=True).encode()), ("blob.bin", b"abcd")])
    with pytest.raises(ArchiveError, match="SHA-256 is not the one manifest.json records"):
        read_cache_entry(data, "entry", "k", DEFAULT_LIMITS, b"secret")
    assert (
        read_cache_entry(encode_cache_entry("k", b"abcd", b"secret"), "entry", "k", DEFAULT_LIMITS, b"secret")
        == b"abcd"
    )
