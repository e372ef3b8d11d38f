"""The preprocess cache's folder is not trusted: an entry is taken only from its maker, special files are refused.

The routes of issue 56 (items 2 and 6), each with real components: pytest runs of a backend that
compiles ``sub`` as ``add`` against a planted entry built as an attacker would, real FIFOs
(`os.mkfifo`) and symbolic links in the folder, run in a child process with a timeout (a FIFO that
is opened blocks until a writer comes; before the fix, these runs hung), real folder modes for the
StrictModes rule, and the secret file made in a real ``$XDG_CONFIG_HOME``.
"""

from __future__ import annotations

import grp
import hashlib
import io
import json
import os
import stat
import zipfile
from pathlib import Path

import pytest

from pytest_backendconf.archive import (
    SECRET_ENV,
    SpecialFileError,
    cache_secret,
    encode_cache_entry,
    pack,
    probe_writable,
    read_regular_file,
    remove_file,
    secret_path,
)
from pytest_backendconf.errors import CacheMismatchError
from pytest_backendconf.lowering import PreprocessCache, use_preprocess_cache

from test_special_files import run_bounded


SUB_AS_ADD = """
import torch
from backendconf_reference import ReferenceBackend


class SubAsAdd(ReferenceBackend):
    \"\"\"Compiles every aten.sub.Tensor as aten.add.Tensor (in preprocess: the cache skips it on a hit).\"\"\"

    name = "sub_as_add"

    def preprocess(self, program, compile_spec, debug_handles):
        subs = [n for n in program.graph.nodes if n.target == torch.ops.aten.sub.Tensor]
        for node in subs:
            node.target = torch.ops.aten.add.Tensor
        try:
            return super().preprocess(program, compile_spec, debug_handles)
        finally:
            for node in subs:
                node.target = torch.ops.aten.sub.Tensor
"""
CONFTEST = """
from sub_as_add import SubAsAdd

def backendconf_register_backends(register):
    register(SubAsAdd())
"""
SUB_CHECK = "--backendconf-select=backendconf::ops::aten.sub.Tensor[[]float32-sample0]"


def _entry_parts(path: Path) -> tuple[dict, bytes]:
    with zipfile.ZipFile(io.BytesIO(path.read_bytes())) as entry:
        return json.loads(entry.read("manifest.json")), entry.read("blob.bin")


def _forge(path: Path, blob: bytes, mac: str | None = None) -> None:
    """Put ``blob`` into the entry at ``path``: its SHA-256 and size recomputed, its MAC kept (or ``mac``)."""
    manifest, _ = _entry_parts(path)
    manifest["blob"] = {"sha256": hashlib.sha256(blob).hexdigest(), "size": len(blob)}
    if mac is not None:
        manifest["mac"] = mac
    path.write_bytes(pack([("manifest.json", json.dumps(manifest, sort_keys=True).encode()), ("blob.bin", blob)]))


@pytest.fixture
def poisoned(pytester):
    """The attack of issue 56: a good backend's blob planted under the key a broken backend computes.

    The attacker can write the cache folder but not read the user's secret. They learn the broken
    backend's key from a run of it (the entry's file name), make the good blob with a good backend
    (the reference backend, same program, same handles: each run lowers this one check first), and
    write an internally consistent entry: the manifest's key, SHA-256 and size all true.
    """
    pytester.makepyfile(sub_as_add=SUB_AS_ADD)
    pytester.makeconftest(CONFTEST)

    def run(backend: str, folder: str, *more: str) -> pytest.RunResult:
        # Each run in a process of its own: debug handles are issued per process, and keys hold them.
        return pytester.runpytest_subprocess(
            f"--backend={backend}", SUB_CHECK, f"--backendconf-cache={folder}", "-p", "no:cacheprovider", *more
        )

    run("reference", "made-by-a-good-backend").assert_outcomes(passed=1)
    broken = run("sub_as_add", "cache")
    broken.assert_outcomes(failed=1)  # the broken backend is caught without a cache
    [good] = (pytester.path / "made-by-a-good-backend").glob("*.bcpc")
    [entry] = (pytester.path / "cache").glob("*.bcpc")
    _, good_blob = _entry_parts(good)
    return run, entry, good_blob


def test_a_good_backends_entry_under_a_broken_backends_key_is_refused_and_the_run_fails(poisoned):
    run, entry, good_blob = poisoned
    _forge(entry, good_blob)  # the MAC left as it was: the attacker cannot make one
    result = run("sub_as_add", "cache")
    result.assert_outcomes(failed=1)  # before the fix: 1 passed, exit 0
    assert result.ret == pytest.ExitCode.TESTS_FAILED
    result.stdout.fnmatch_lines(["*0 of 1 preprocess calls reused, 1 stored, 1 entries refused (their MAC does not*"])


@pytest.mark.slow  # two more suite runs in fresh processes
def test_cache_verify_fails_the_run_on_an_entry_forged_with_the_secret_and_names_it(poisoned):
    """Who holds the secret (the CI's secrets leaked, the user's own account) can forge an entry the MAC
    takes; ``--backendconf-cache-verify`` runs preprocess again and finds it."""
    from pytest_backendconf.archive import entry_mac

    run, entry, good_blob = poisoned
    secret = os.environ[SECRET_ENV].encode()
    key = entry.name.removesuffix(".bcpc")
    _forge(entry, good_blob, mac=entry_mac(secret, key, good_blob))
    verified = run("sub_as_add", "cache", "--backendconf-cache-verify=all")
    assert verified.ret == pytest.ExitCode.TESTS_FAILED
    verified.stdout.fnmatch_lines(
        [
            f"*preprocess cache entry '*{entry.name}' holds another blob*than preprocess() of backend 'sub_as_add' "
            "makes now for method 'forward'*tampered with or is stale*"
        ]
    )
    assert not entry.exists()  # removed: the next run stores what preprocess makes


# --- special files in the folder --------------------------------------------------------------------------

PLANT_AND_USE = """
import os, sys, time
from backendconf_reference import ReferenceBackend
from pytest_backendconf.lowering import PreprocessCache

folder, kind = sys.argv[1], sys.argv[2]
key = "a" * 64
os.makedirs(folder)
entry = os.path.join(folder, key + ".bcpc")
if kind == "fifo-entry":
    os.mkfifo(entry)
elif kind == "fifo-tag":
    os.mkfifo(os.path.join(folder, "CACHEDIR.TAG"))
elif kind == "fifo-leftover":
    leftover = os.path.join(folder, "." + key + ".bcpc.backendconf-k1ll3d.tmp")
    os.mkfifo(leftover)
    os.utime(leftover, (time.time() - 3600, time.time() - 3600))  # old: a killed write's
elif kind == "zero-tag":
    os.symlink("/dev/zero", os.path.join(folder, "CACHEDIR.TAG"))
elif kind == "zero-entry":
    os.symlink("/dev/zero", entry)
cache = PreprocessCache(folder, ReferenceBackend(), "1.0", 2**20)
cache.prepare()
first = cache.get(key)
cache.put(key, b"a blob")
print(first, cache.get(key), sorted(os.listdir(folder)), cache.counts["removed"])
"""


@pytest.mark.parametrize("kind", ["fifo-entry", "fifo-tag", "fifo-leftover", "zero-tag", "zero-entry"])
def test_a_fifo_or_a_link_to_dev_zero_in_the_folder_is_refused_promptly(tmp_path, kind):
    """Each used to block forever (a FIFO opened for reading waits for a writer) or to read /dev/zero
    until MemoryError; the child's memory is capped so that a regression fails, not the machine."""
    folder = tmp_path / "cache"
    line = run_bounded(PLANT_AND_USE, str(folder), kind).strip().splitlines()[-1]
    assert line.startswith("None b'a blob' ")  # a miss, then the entry stored in its place
    entries = sorted(os.listdir(folder))
    assert entries == ["CACHEDIR.TAG", "a" * 64 + ".bcpc"]  # the planted thing is gone, no other file left
    assert all(stat.S_ISREG(os.lstat(folder / n).st_mode) for n in entries)
    assert line.endswith(" 1" if kind.endswith("-entry") else " 0")  # a special entry counts as damaged


def test_the_write_probe_never_opens_a_link_planted_under_its_name(pytester):
    """The start-up probe wrote through ``.write-test-<pid>``: a link planted there emptied its target."""
    victim = pytester.path / "precious.txt"
    victim.write_text("the user's work\n")
    folder = pytester.path / "cache"
    folder.mkdir(mode=0o700)
    (folder / f".write-test-{os.getpid()}").symlink_to(victim)  # this process runs the in-process pytest
    result = pytester.runpytest("--backend=reference", "--backendconf-select=nothing", "--backendconf-cache=cache")
    assert result.ret == pytest.ExitCode.NO_TESTS_COLLECTED
    assert victim.read_text() == "the user's work\n"
    assert (folder / f".write-test-{os.getpid()}").is_symlink()  # not the probe's: left alone


def test_probe_writable_removes_only_what_it_made(tmp_path):
    os.mkfifo(tmp_path / f".write-test-{os.getpid()}")  # an old probe's name: never opened
    probe_writable(tmp_path)
    assert os.listdir(tmp_path) == [f".write-test-{os.getpid()}"]


def test_read_regular_file_names_what_stands_in_a_files_place(tmp_path):
    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    (tmp_path / "link").symlink_to(tmp_path / "target")
    (tmp_path / "target").write_bytes(b"1234")
    with pytest.raises(SpecialFileError, match=r"'.*pipe' is a FIFO \(named pipe\), not a regular file"):
        read_regular_file(fifo, 10)
    with pytest.raises(SpecialFileError, match="is a character device"):
        read_regular_file("/dev/zero", 10, follow_symlinks=True)
    with pytest.raises(SpecialFileError, match="is a symbolic link"):
        read_regular_file(tmp_path / "link", 10)
    with pytest.raises(SpecialFileError, match="is a folder"):
        read_regular_file(tmp_path, 10)
    assert read_regular_file(tmp_path / "link", 10, follow_symlinks=True) == b"1234"  # a link the user named
    with pytest.raises(OSError, match="larger than 3 bytes"):
        read_regular_file(tmp_path / "target", 3)
    assert remove_file(tmp_path / "link") and (tmp_path / "target").read_bytes() == b"1234"
    assert not remove_file(tmp_path)


# --- who may write the folder (ssh's StrictModes) -----------------------------------------------------------


def _other_group() -> int:
    """A group that is not the user's private one (root's own group counts as private)."""
    me = os.getuid()
    import pwd

    name = pwd.getpwuid(me).pw_name
    for group in grp.getgrall():
        if group.gr_name != name:
            return group.gr_gid
    pytest.skip("no group other than the user's own on this machine")


@pytest.mark.parametrize("how", ["group", "others", "owner"])
def test_a_folder_others_may_write_is_a_usage_error_naming_it_its_mode_and_the_fix(pytester, how):
    folder = pytester.path / "shared-cache"
    folder.mkdir()
    if how == "group":
        os.chown(folder, -1, _other_group())
        folder.chmod(0o775)
        expected = f"*{folder} is writable by its group (mode drwxrwxr-x, owner *, group *). *chmod go-w {folder}*"
    elif how == "others":
        folder.chmod(0o777)
        expected = f"*{folder} is writable by every user (mode drwxrwxrwx*chmod go-w {folder}*"
    else:
        if os.geteuid() != 0:
            pytest.skip("giving a folder to another user takes root")
        os.chown(folder, 65534, -1)
        expected = f"*{folder} belongs to another user (mode *, owner *)*choose a folder of your own, or make it yours*"
    result = pytester.runpytest("--backend=reference", "--backendconf-select=nothing", f"--backendconf-cache={folder}")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines([f"ERROR: --backendconf-cache={folder}: {expected}"])


def test_a_sticky_folder_and_a_new_one_are_taken(pytester):
    sticky = pytester.path / "sticky"
    sticky.mkdir()
    sticky.chmod(0o1777)  # as /tmp: others cannot rename or remove what is ours
    for option in (f"--backendconf-cache={sticky}", "--backendconf-cache=new/deeper"):
        result = pytester.runpytest("--backend=reference", "--backendconf-select=nothing", option)
        assert result.ret == pytest.ExitCode.NO_TESTS_COLLECTED
    for made in (pytester.path / "new", pytester.path / "new" / "deeper"):
        assert stat.S_IMODE(made.stat().st_mode) == 0o700


# --- the secret ------------------------------------------------------------------------------------------


def test_the_secret_file_is_made_once_readable_by_the_user_alone(tmp_path, monkeypatch):
    monkeypatch.delenv(SECRET_ENV)
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "config"))
    secret, where = cache_secret()
    path = secret_path()
    assert where == str(path) == str(tmp_path / "config" / "pytest-backendconf" / "cache-secret")
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert cache_secret()[0] == secret and len(secret) == 64
    assert os.listdir(path.parent) == ["cache-secret"]  # the temporary name it was made under is gone
    path.chmod(0o644)
    from pytest_backendconf.archive import CacheSecretError

    with pytest.raises(CacheSecretError, match=r"cache-secret: its mode -rw-r--r-- lets others read.*chmod 600"):
        cache_secret()


def test_a_short_secret_in_the_environment_is_a_usage_error(pytester, monkeypatch):
    monkeypatch.setenv(SECRET_ENV, "hunter2")
    result = pytester.runpytest("--backend=reference", "--backendconf-select=nothing", "--backendconf-cache=cache")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(
        [f"ERROR: --backendconf-cache=cache: ${SECRET_ENV} holds 7 characters; give at least 32*"]
    )


def test_entries_of_another_secret_are_misses_and_one_secret_shares_them(tmp_path):
    from backendconf_reference import ReferenceBackend

    mine = PreprocessCache(tmp_path / "c", ReferenceBackend(), "1.0", 2**20, secret=b"m" * 32)
    mine.prepare()
    mine.put("a" * 64, b"blob")
    ci_runner = PreprocessCache(tmp_path / "c", ReferenceBackend(), "1.0", 2**20, secret=b"m" * 32)
    assert ci_runner.get("a" * 64) == b"blob"  # the same secret (a CI's, from its secret store): a hit
    other = PreprocessCache(tmp_path / "c", ReferenceBackend(), "1.0", 2**20, secret=b"o" * 32)
    assert other.get("a" * 64) is None
    assert other.counts["refused"] == 1 and not (tmp_path / "c" / ("a" * 64 + ".bcpc")).exists()


# --- verify -----------------------------------------------------------------------------------------------


def test_cache_verify_finds_a_tampered_hit_and_names_the_entry(tmp_path):
    import torch
    from backendconf_reference import ReferenceBackend

    from pytest_backendconf.debuginfo import DebugHandleRecorder
    from pytest_backendconf.lowering import export_method
    from pytest_backendconf.lowering._cache import cached_preprocess

    backend = ReferenceBackend()
    program = export_method(torch.nn.Linear(3, 2).eval(), "forward", (torch.randn(1, 3),), {})
    handles = DebugHandleRecorder().assign(program.graph_module)
    cache = PreprocessCache(tmp_path / "c", backend, "1.0", 2**20, secret=b"s" * 32, verify=1.0)
    cache.prepare()

    def run() -> bytes:
        return backend.preprocess(program, {}, handles)

    use_preprocess_cache(cache)
    try:
        blob = cached_preprocess(backend, program, {}, handles, run, what="method 'forward'")
        assert cached_preprocess(backend, program, {}, handles, run) == blob  # verified: the same bytes
        [entry] = (tmp_path / "c").glob("*.bcpc")
        key = entry.name.removesuffix(".bcpc")
        entry.write_bytes(encode_cache_entry(key, blob + b"\0", b"s" * 32))  # made with the secret
        with pytest.raises(CacheMismatchError, match=rf"entry '.*{entry.name}' holds another blob.*method 'forward'"):
            cached_preprocess(backend, program, {}, handles, run, what="method 'forward'")
    finally:
        use_preprocess_cache(None)
    assert cache.counts["verified"] == 2 and not entry.exists()


@pytest.mark.parametrize("value", ["1.5", "some", "-0.1", "nan"])
def test_a_bad_verify_share_is_a_usage_error(pytester, value):
    result = pytester.runpytest(
        "--backend=reference",
        "--backendconf-select=nothing",
        "--backendconf-cache=c",
        f"--backendconf-cache-verify={value}",
    )
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines([f"ERROR: --backendconf-cache-verify={value}: give the share of cache hits*or 'all'"])


def test_cache_verify_without_a_cache_is_a_usage_error_and_its_ini_and_environment_are_read(pytester, monkeypatch):
    result = pytester.runpytest("--backend=reference", "--backendconf-select=nothing", "--backendconf-cache-verify=all")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["ERROR: --backendconf-cache-verify=all verifies the hits*give the cache too*"])
    pytester.makeini("[pytest]\nbackendconf_cache_verify = lots\n")
    result = pytester.runpytest("--backend=reference", "--backendconf-select=nothing", "--backendconf-cache=c")
    result.stderr.fnmatch_lines(["ERROR: backendconf_cache_verify = 'lots' in the ini file: give the share*"])
    pytester.makeini("[pytest]\n")
    monkeypatch.setenv("BACKENDCONF_CACHE_VERIFY", "2")
    result = pytester.runpytest("--backend=reference", "--backendconf-select=nothing", "--backendconf-cache=c")
    result.stderr.fnmatch_lines(["ERROR: $BACKENDCONF_CACHE_VERIFY=2: give the share*"])
