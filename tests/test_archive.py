"""Archives: save/load round trips, determinism, versioning, and every kind of bad file."""

from __future__ import annotations

import json
import os
import sys

import pytest
import torch

import pytest_backendconf as bc
from pytest_backendconf.errors import BackendError, UnsupportedNodeError

FAULT = "__backendconf_fault__"
_KERNELS = {"mul": torch.mul, "add": torch.add, "sub": torch.sub}
_OPS = {
    torch.ops.aten.mul.Tensor: "mul",
    torch.ops.aten.add.Tensor: "add",
    torch.ops.aten.sub.Tensor: "sub",
}


class TinyBackend:
    """A real, small backend: preprocess writes a JSON op list, execute interprets it."""

    def __init__(
        self,
        name: str = "tiny",
        *,
        available: bool = True,
        leaky: bool = False,
        runtime_modules: tuple[str, ...] = (),
        traces: str = "",
    ) -> None:
        self.name = name
        self.available = available
        self.leaky = leaky
        # "compile" or "execute": that step calls torch.compile / torch.export.export (a bug on a target).
        self.traces = traces
        # colorsys stands in for a vendor's compiler: only preprocess may import it. (torch._dynamo
        # imports it through sympy and mpmath: a runtime importing torch._dynamo gets tabnanny instead.)
        self.capabilities = bc.Capabilities(
            host_only_modules=("tabnanny",) if runtime_modules else ("colorsys",),
            fault_injection=True,
            target_runtime_modules=runtime_modules,
        )

    def is_available(self) -> bool:
        return self.available

    def unavailable_reason(self) -> str:
        return "the tiny test device is switched off"

    def preprocess(self, program, compile_spec, debug_handles) -> bytes:
        import colorsys  # noqa: F401  (host-only, see capabilities)

        inputs = [s.arg.name for s in program.graph_signature.input_specs if s.kind.name == "USER_INPUT"]
        ops, outputs = [], []
        for node in program.graph.nodes:
            if node.op == "placeholder":
                continue
            if node.op == "output":
                outputs = [a.name for a in node.args[0]]
            elif node.op == "call_function" and node.target in _OPS:
                args = [["n", a.name] if isinstance(a, torch.fx.Node) else ["c", a] for a in node.args]
                ops.append([_OPS[node.target], node.name, args, debug_handles[node]])
            else:
                raise UnsupportedNodeError(node, "tiny runs only mul, add and sub")
        fault = compile_spec.get(FAULT, {}).get("node")
        return json.dumps({"inputs": inputs, "ops": ops, "outputs": outputs, "fault": fault}, sort_keys=True).encode()

    def compile(self, processed, method_compile_spec):
        if self.leaky:  # a bug: compile uses host-only modules, which the target lacks
            failures = []
            for module in ("colorsys", "torch.export._trace", "torch._dynamo"):
                try:
                    __import__(module)
                except ImportError as exc:
                    failures.append(str(exc))
            if failures:
                raise ImportError("; ".join(failures))
        if self.capabilities.target_runtime_modules:
            import torch._dynamo
        if self.traces == "compile":
            try:  # "warm up with torch.compile when it is there": the error is swallowed, the call still counts
                torch.compile(torch.nn.ReLU())(torch.ones(1))
            except Exception:
                pass
        return {name: json.loads(blob) for name, blob in processed.items()}

    def execute(self, handle, inputs):
        if self.traces == "execute":  # "check against a fresh trace"
            torch.export.export(torch.nn.ReLU(), (torch.ones(1),))
        env = dict(zip(handle["inputs"], inputs))
        for op, name, args, debug_handle in handle["ops"]:
            if name == handle["fault"]:
                raise BackendError(f"tiny: injected fault at node {name!r}", debug_handle=debug_handle)
            env[name] = _KERNELS[op](*[env[v] if kind == "n" else v for kind, v in args])
        return [env[o] for o in handle["outputs"]]


TINY = TinyBackend()
TINY_OFF = TinyBackend("tiny_off", available=False)
TINY_LEAKY = TinyBackend("tiny_leaky", leaky=True)
# Runtimes that import torch._dynamo and declare it: the first is fine on a target, the others trace there.
TINY_RUNTIME = TinyBackend("tiny_runtime", runtime_modules=("torch._dynamo",))
TINY_COMPILES = TinyBackend("tiny_compiles", runtime_modules=("torch._dynamo",), traces="compile")
TINY_EXPORTS = TinyBackend("tiny_exports", runtime_modules=("torch._dynamo",), traces="execute")


def backendconf_register_backends(register):
    for backend in (TINY, TINY_OFF, TINY_LEAKY, TINY_RUNTIME, TINY_COMPILES, TINY_EXPORTS):
        register(backend)


class L(torch.nn.Module):
    def forward(self, x):
        return x * 5


class M(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.l = L()

    def forward(self, x):
        return self.l(x) - 2


class N(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.m = M()

    def forward(self, x):
        return self.m(x) + 3

    def pair(self, x, y):
        return x + y, {"prod": x * y}

    def boom(self, x):
        return x * 2 + 1


# --- helpers ------------------------------------------------------------------------------

import hashlib  # noqa: E402
import io  # noqa: E402
import subprocess  # noqa: E402
import warnings  # noqa: E402
import zipfile  # noqa: E402

from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from pytest_backendconf.archive import _archive, _zip as _archive_zip  # noqa: E402
from pytest_backendconf.lowering import _saving  # noqa: E402
from pytest_backendconf.registry import BackendRegistry, Source, active_registry, set_active_registry  # noqa: E402
from pytest_backendconf.errors import (  # noqa: E402
    ArchiveBackendError,
    ArchiveChecksumError,
    ArchiveEntryError,
    ArchiveError,
    ArchiveFormatError,
    ArchiveManifestError,
    ArchiveSizeError,
    ArchiveVersionError,
    BackendRuntimeError,
    BackendUnavailableError,
    BackendUnavailableWarning,
)

# Profiles are registered in conftest.py, before Hypothesis loads the chosen one.
MUTATIONS = 2000 if settings.get_current_profile_name() == "thorough" else 100

X = torch.arange(6, dtype=torch.float32).reshape(2, 3) / 7
Y = torch.linspace(-1, 1, 6).reshape(2, 3)
ALL_METHODS = {"forward": {}, "pair": {}, "boom": {FAULT: {"node": "mul"}}}
ALL_INPUTS = {"forward": (X,), "pair": (X, Y), "boom": (X,)}


def lower(backend=TINY, spec=None, inputs=None):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", BackendUnavailableWarning)
        return bc.to_backend(N(), backend, spec or {"forward": {}}, example_inputs=inputs or (X,))


@pytest.fixture(scope="module", autouse=True)
def registry():
    """This module's backends, as a conftest's would be, for load() to find."""
    registry = BackendRegistry()
    registry.add_plugin(sys.modules[__name__], Source(f"test module {__name__}"))
    previous = active_registry()
    set_active_registry(registry)
    yield registry
    set_active_registry(previous)


@pytest.fixture(scope="module")
def small():
    """A small archive: N/M/L, forward only."""
    return _saving.to_bytes(lower())


def entries_of(data: bytes) -> dict[str, bytes]:
    with zipfile.ZipFile(io.BytesIO(data)) as z:
        return {info.filename: z.read(info) for info in z.infolist()}


def repack(entries: dict[str, bytes], *, checksums: bool = True, order=None) -> bytes:
    """Pack entries in this format's layout; by default with a manifest whose checksums fit."""
    entries = dict(entries)
    if checksums:
        manifest = json.loads(entries["manifest.json"])
        manifest["entries"] = {
            n: {"size": len(d), "sha256": hashlib.sha256(_archive_zip.stored_bytes(n, d)).hexdigest()}
            for n, d in sorted(entries.items())
            if n != "manifest.json"
        }
        entries["manifest.json"] = json.dumps(manifest, indent=1).encode()
    order = order or ["manifest.json"] + sorted(n for n in entries if n != "manifest.json")
    return _archive_zip.pack([(n, entries[n]) for n in order])


def edit_manifest(data: bytes, edit, *, checksums: bool = True) -> bytes:
    entries = entries_of(data)
    manifest = json.loads(entries["manifest.json"])
    edit(manifest)
    entries["manifest.json"] = json.dumps(manifest, indent=1).encode()
    return repack(entries, checksums=checksums)


def edit_json(data: bytes, name: str, edit) -> bytes:
    entries = entries_of(data)
    document = json.loads(entries[name])
    edit(document)
    entries[name] = json.dumps(document).encode()
    return repack(entries)


def raw_zip(items: list[tuple[bytes, bytes]]) -> bytes:
    """Stored entries with arbitrary raw names, in this format's header layout."""
    import zlib

    chunks, central, offset = [], [], 0
    for name, data in items:
        crc = zlib.crc32(data)
        header = _archive_zip.local_header(name, 0, crc, len(data), len(data))
        central.append(_archive_zip.central_header(name, 0, crc, len(data), len(data), offset))
        chunks += [header, data]
        offset += len(header) + len(data)
    directory = b"".join(central)
    end = _archive_zip._END.pack(_archive_zip._END_SIG, 0, 0, len(items), len(items), len(directory), offset, 0)
    return b"".join(chunks) + directory + end


def assert_only_archive_error(data: bytes, **kwargs) -> None:
    try:
        _saving.load(data, **kwargs)
    except ArchiveError:
        pass


# --- round trips --------------------------------------------------------------------------


def test_round_trip_keeps_outputs_debug_info_compile_spec_and_attributes(tmp_path):
    model = N()
    lowered = lower(spec=ALL_METHODS, inputs=ALL_INPUTS)
    lowered.scale = torch.tensor([[1.5, 2.0]])
    lowered.settings = {"name": "n", 3: [True, None, float("inf")], "pair": (1, 2.5)}
    lowered.register_buffer("offset", torch.arange(4), persistent=False)
    lowered.register_parameter("weight", torch.nn.Parameter(torch.ones(2), requires_grad=True))
    path = tmp_path / "n.bcpt"
    bc.save(lowered, path)
    again = bc.load(path)

    torch.testing.assert_close(again(X), model(X))
    torch.testing.assert_close(again.pair(X, Y), model.pair(X, Y))
    assert isinstance(again.pair(X, Y)[1], dict)
    with pytest.raises(BackendRuntimeError) as loaded_error:
        again.boom(X)
    with pytest.raises(BackendRuntimeError) as original_error:
        lowered.boom(X)
    assert str(loaded_error.value) == str(original_error.value)
    assert "return x * 2 + 1" in str(loaded_error.value)

    assert bc.debug_info(again) == bc.debug_info(lowered)
    assert {n: m.compile_spec for n, m in again.lowered.methods.items()} == ALL_METHODS
    assert again.lowered.methods == lowered.lowered.methods
    torch.testing.assert_close(again.scale, lowered.scale)
    assert again.settings == lowered.settings
    assert "offset" in again._buffers and "offset" in again._non_persistent_buffers_set
    assert isinstance(again.weight, torch.nn.Parameter) and again.weight.requires_grad
    assert path.read_bytes() == _saving.to_bytes(again)  # save(load(a)) == a


def test_layout_manifest_first_sorted_fixed_timestamps_and_readable_by_zipfile(small):
    with zipfile.ZipFile(io.BytesIO(small)) as z:
        assert z.testzip() is None
        infos = z.infolist()
        names = [i.filename for i in infos]
        manifest = json.loads(z.read("manifest.json"))
    assert names[0] == "manifest.json" and names[1:] == sorted(names[1:])
    assert names == ["manifest.json", "attributes.json", "blobs/forward.bin", "debug.json"]
    assert {i.date_time for i in infos} == {(1980, 1, 1, 0, 0, 0)}
    assert {i.external_attr for i in infos} == {0o100644 << 16}
    assert manifest["format"] == "backendconf-archive"
    assert manifest["schema_version"] == [1, 2]
    assert manifest["backend"] == {"name": "tiny", "version": None}
    assert manifest["torch_version"] == torch.__version__
    assert manifest["method_compile_spec"] == {"forward": {}}
    assert manifest["methods"][0]["inputs"][0]["shape"] == [2, 3]
    assert set(manifest["entries"]) == set(names[1:])


def test_file_objects_and_bytes(small):
    buffer = io.BytesIO()
    bc.save(bc.load(io.BytesIO(small)), buffer)
    assert buffer.getvalue() == small
    torch.testing.assert_close(bc.load(small)(X), N()(X))


def test_lowered_module_without_wrapper_saves():
    lowered = lower()
    assert _saving.to_bytes(lowered.lowered) == _saving.to_bytes(lowered)


def test_same_tensor_twice_is_stored_once_and_restored_as_one_object():
    lowered = lower()
    t = torch.ones(3)
    lowered.both = [t, t]
    entries = entries_of(_saving.to_bytes(lowered))
    assert [n for n in entries if n.startswith("tensors/")] == ["tensors/0.bin"]
    again = bc.load(_saving.to_bytes(lowered))
    assert again.both[0] is again.both[1]


@pytest.mark.parametrize(
    "value, culprit",
    [
        (object(), "attribute 'bad'"),
        ({"k": [1, {2}]}, "attribute 'bad'['k'][1]"),
        ({(1, 2): 3}, "key of type tuple"),
        (lambda: torch.zeros(2, dtype=torch.float8_e4m3fn), "dtype float8_e4m3fn"),
        (lambda: torch.ones(2).to_sparse(), "sparse"),
    ],
)
def test_unsupported_attribute_names_it_and_writes_nothing(tmp_path, value, culprit):
    lowered = lower()
    lowered.bad = value() if callable(value) else value
    path = tmp_path / "m.bcpt"
    with pytest.raises(ArchiveError, match="bad") as error:
        bc.save(lowered, path)
    assert culprit in str(error.value)
    assert os.listdir(tmp_path) == []


def test_failed_save_keeps_the_old_file_and_leaves_no_temporary(tmp_path, monkeypatch):
    path = tmp_path / "m.bcpt"
    path.write_bytes(b"old archive")
    lowered = lower()
    lowered.bad = lambda: None
    with pytest.raises(ArchiveError, match="attribute 'bad'"):
        bc.save(lowered, path)
    del lowered.bad

    def refuse(src, dst):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "replace", refuse)
    with pytest.raises(OSError, match="No space left"):
        bc.save(lowered, path)
    assert path.read_bytes() == b"old archive"
    assert os.listdir(tmp_path) == ["m.bcpt"]
    monkeypatch.undo()
    bc.save(lowered, path)
    assert os.listdir(tmp_path) == ["m.bcpt"]
    assert bc.load(path) is not None


def test_unavailable_backend_saves_but_load_says_not_available(tmp_path):
    with pytest.warns(BackendUnavailableWarning, match=r"Backend \[tiny_off\] is not available"):
        lowered = bc.to_backend(N(), TINY_OFF, {"forward": {}}, example_inputs=(X,))
    bc.save(lowered, tmp_path / "off.bcpt")
    with pytest.raises(BackendUnavailableError, match=r"^Backend is not available\. .*tiny_off.*switched off"):
        bc.load(tmp_path / "off.bcpt")


def test_unknown_backend_names_it_and_how_to_install():
    lowered = lower(TinyBackend("tiny_ghost"))
    with pytest.raises(ArchiveBackendError, match=r"manifest\.json.*backend 'tiny_ghost'.*Install a package"):
        bc.load(_saving.to_bytes(lowered))


def test_two_lowerings_in_one_process_give_the_same_archive():
    # Debug handles are numbered per lowering: the second lowering is the first, byte for byte.
    first, second = _saving.to_bytes(lower()), _saving.to_bytes(lower())
    assert first == second
    assert json.loads(entries_of(first)["debug.json"])["nodes"][0][0] == 0


WRITE_ARCHIVE = """
import sys, warnings
sys.path.insert(0, {tests!r})
import torch
import pytest_backendconf as bc
import test_archive as t
lowered = bc.to_backend(t.N(), t.TINY, {{"forward": {{}}}}, example_inputs=(t.X,))
lowered.scale = torch.tensor([1.0, 2.0])
bc.save(lowered, sys.argv[1])
"""


@pytest.fixture(scope="module", autouse=True)
def fresh_writers(tmp_path_factory):
    """Two fresh processes lowering and saving the same model, started with this module

    so that they run on the other core while the in-process tests run."""
    script = WRITE_ARCHIVE.format(tests=os.path.dirname(os.path.abspath(__file__)))
    directory = tmp_path_factory.mktemp("fresh")
    paths = [directory / "one.bcpt", directory / "two.bcpt"]
    children = [
        subprocess.Popen([sys.executable, "-c", script, str(p)], stderr=subprocess.PIPE, text=True) for p in paths
    ]
    yield list(zip(children, paths))
    for child in children:
        if child.poll() is None:
            child.kill()
        child.communicate()


@pytest.mark.slow
def test_two_fresh_processes_write_identical_archives(fresh_writers):
    for child, _ in fresh_writers:
        _, err = child.communicate(timeout=120)
        assert child.returncode == 0, err
    (_, one), (_, two) = fresh_writers
    assert one.read_bytes() == two.read_bytes()
    assert bc.load(one).scale.tolist() == [1.0, 2.0]


# --- versions ---------------------------------------------------------------------------------


def test_newer_minor_loads_ignoring_unknown_keys_and_entries(small):
    entries = entries_of(small)
    entries["extras/notes.txt"] = b"written by schema 1.7"
    manifest = json.loads(entries["manifest.json"])
    manifest["schema_version"] = [1, 7]
    manifest["future_field"] = {"anything": [1, 2]}
    entries["manifest.json"] = json.dumps(manifest).encode()
    loaded = bc.load(repack(entries))
    torch.testing.assert_close(loaded(X), N()(X))


def test_unknown_entry_in_the_same_minor_is_refused(small):
    entries = entries_of(small)
    entries["extras/notes.txt"] = b"?"
    with pytest.raises(ArchiveEntryError, match=r"entry 'extras/notes\.txt'.*not an entry of schema 1\.2"):
        bc.load(repack(entries))


@pytest.mark.parametrize(
    "version, advice",
    [([3, 0], "upgrade pytest-backendconf to a release that reads schema 3.x"), ([0, 9], "re-lower the model")],
)
def test_other_major_names_both_versions_and_what_to_do(small, version, advice):
    def edit(m):
        m["schema_version"] = version
        m["methods"] = "a different layout"

    data = edit_manifest(small, edit)
    with pytest.raises(ArchiveVersionError) as error:
        bc.load(data)
    text = str(error.value)
    assert f"schema version {version[0]}.{version[1]}" in text
    assert "reads schema 1.x (it writes 1.2) and 2.x (for a module with state)" in text
    assert advice in text and "manifest.json" in text


# --- hostile and broken archives ------------------------------------------------------------


def _torch_export_file() -> bytes:
    buffer = io.BytesIO()
    torch.export.save(torch.export.export(L(), (X,)), buffer)
    return buffer.getvalue()


def _zipfile_repack(data: bytes) -> bytes:
    out = io.BytesIO()
    with zipfile.ZipFile(out, "w") as z:
        for name, content in entries_of(data).items():
            z.writestr(name, content)
    return out.getvalue()


def _swap_order(data: bytes) -> bytes:
    entries = entries_of(data)
    names = list(entries)
    return repack(entries, order=[names[0], names[2], names[1]] + names[3:])


def _without(name):
    def mutate(data):
        entries = entries_of(data)
        del entries[name]
        return repack(entries, checksums=False)

    return mutate


def _with(name, content=b"x"):
    def mutate(data):
        entries = entries_of(data)
        entries[name] = content
        return repack(entries, checksums=False)

    return mutate


def _renamed(data):
    entries = entries_of(data)
    entries["blobs/forwarc.bin"] = entries.pop("blobs/forward.bin")
    return repack(entries, checksums=False)


def _changed_content_same_crc_layout(data):
    entries = entries_of(data)
    entries["blobs/forward.bin"] = entries["blobs/forward.bin"].replace(b'"mul"', b'"add"')
    return repack(entries, checksums=False)  # a valid zip, but the SHA-256 no longer fits


def _flip_in(name):
    def mutate(data):
        with zipfile.ZipFile(io.BytesIO(data)) as z:
            info = z.getinfo(name)
        at = info.header_offset + 30 + len(name) + 2
        return data[:at] + bytes([data[at] ^ 0x20]) + data[at + 1 :]

    return mutate


def _raw_names(*names):
    def mutate(data):
        entries = entries_of(data)
        items = [(n.encode(), d) for n, d in entries.items()]
        items += [(n if isinstance(n, bytes) else n.encode(), b"evil") for n in names]
        return raw_zip(items)

    return mutate


def _duplicate(data):
    entries = entries_of(data)
    items = [(n.encode(), d) for n, d in entries.items()]
    return raw_zip(items[:3] + [items[2]] + items[3:])


def _declared_size(size):
    def mutate(data):
        entries = entries_of(data)
        items = [(n.encode(), d) for n, d in entries.items()]
        out = bytearray(raw_zip(items))
        # Patch the blob's sizes in both headers consistently: a hostile writer's "valid" zip.
        with zipfile.ZipFile(io.BytesIO(bytes(out))) as z:
            info = z.getinfo("blobs/forward.bin")
        _patch_sizes(out, info.header_offset, size, local=True)
        cd_offset = _archive_zip._END.unpack_from(out, len(out) - 22)[6]
        pos = cd_offset
        while True:
            name_len = int.from_bytes(out[pos + 28 : pos + 30], "little")
            if bytes(out[pos + 46 : pos + 46 + name_len]) == b"blobs/forward.bin":
                _patch_sizes(out, pos, size, local=False)
                break
            pos += 46 + name_len
        return bytes(out)

    return mutate


def _patch_sizes(buffer, at, size, *, local):
    start = at + (18 if local else 20)
    buffer[start : start + 8] = size.to_bytes(4, "little") * 2


def _bomb(data):
    """debug.json replaced by 8 MB of zeros, deflated, declared as 1 KB."""
    import zlib

    entries = entries_of(data)
    zeros = b"0" * (8 << 20)
    deflated = _archive_zip.deflate(zeros)
    # A checksum is no signature: the attacker records the bomb's own hash.
    manifest = json.loads(entries["manifest.json"])
    manifest["entries"]["debug.json"] = {"size": 1024, "sha256": hashlib.sha256(deflated).hexdigest()}
    entries["manifest.json"] = json.dumps(manifest, indent=1).encode()
    items = [(n.encode(), d) for n, d in entries.items() if n != "debug.json"]
    chunks, central, offset = [], [], 0
    for name, content, method, size in [(n, d, 0, len(d)) for n, d in items] + [(b"debug.json", deflated, 8, 1024)]:
        crc = zlib.crc32(zeros[:1024]) if method else zlib.crc32(content)
        header = _archive_zip.local_header(name, method, crc, len(content), size)
        central.append(_archive_zip.central_header(name, method, crc, len(content), size, offset))
        chunks += [header, content]
        offset += len(header) + len(content)
    directory = b"".join(central)
    n = len(items) + 1
    return (
        b"".join(chunks)
        + directory
        + _archive_zip._END.pack(_archive_zip._END_SIG, 0, 0, n, n, len(directory), offset, 0)
    )


def _many_entries(data):
    entries = entries_of(data)
    for i in range(10_001):
        entries[f"tensors/{i}.bin"] = b""
    return repack(entries)


def _set(path, value):
    def edit(m):
        target = m
        for key in path[:-1]:
            target = target[key]
        target[path[-1]] = value

    # An edit of the checksum table is kept as written; any other gets fitting checksums.
    return lambda data: edit_manifest(data, edit, checksums=path[0] != "entries")


def _manifest_bytes(raw):
    def mutate(data):
        entries = entries_of(data)
        entries["manifest.json"] = raw
        return repack(entries, checksums=False)

    return mutate


def _manifest_text(old, new):
    def mutate(data):
        entries = entries_of(data)
        assert old in entries["manifest.json"]
        entries["manifest.json"] = entries["manifest.json"].replace(old, new, 1)
        return repack(entries, checksums=False)

    return mutate


def _json_entry(name, raw):
    def mutate(data):
        entries = entries_of(data)
        entries[name] = raw
        return repack(entries)

    return mutate


def _attributes(document):
    return _json_entry("attributes.json", json.dumps(document).encode())


def _tensor_attribute(dtype="float32", shape=(2,), content=b"\0" * 8):
    def mutate(data):
        entries = entries_of(data)
        entries["attributes.json"] = json.dumps(
            {
                "attributes": [{"name": "t", "kind": "attribute", "value": {"tensor": 0}}],
                "tensors": [{"dtype": dtype, "shape": list(shape)}],
            }
        ).encode()
        entries["tensors/0.bin"] = content
        return repack(entries)

    return mutate


def _debug(edit):
    return lambda data: edit_json(data, "debug.json", edit)


HOSTILE = {
    # not an archive at all
    "empty file": (lambda d: b"", ArchiveFormatError, "not a zip file"),
    "text file": (lambda d: b"hello, world\n" * 20, ArchiveFormatError, "not a zip file"),
    "torch.export file": (lambda d: _torch_export_file(), ArchiveEntryError, "torch.export.load"),
    # truncated, extended, re-packed
    "truncated": (lambda d: d[: len(d) // 2], ArchiveFormatError, "truncated"),
    "last byte cut": (lambda d: d[:-1], ArchiveFormatError, "truncated"),
    "data appended": (lambda d: d + b"\0" * 40, ArchiveFormatError, "appended"),
    "zip comment": (lambda d: d[:-2] + b"\x05\x00hello", ArchiveFormatError, "zip comment"),
    "re-packed by zipfile": (_zipfile_repack, ArchiveFormatError, "entry 'manifest.json'.*re-packed by another tool"),
    # checksums
    "blob byte flipped": (
        _flip_in("blobs/forward.bin"),
        ArchiveChecksumError,
        "entry 'blobs/forward.bin'.*(CRC-32|SHA-256)",
    ),
    "manifest byte flipped": (_flip_in("manifest.json"), ArchiveChecksumError, "entry 'manifest.json'.*CRC-32"),
    "blob changed, zip valid": (
        _changed_content_same_crc_layout,
        ArchiveChecksumError,
        "entry 'blobs/forward.bin'.*SHA-256",
    ),
    "wrong recorded checksum": (
        _set(["entries", "debug.json", "sha256"], "0" * 64),
        ArchiveChecksumError,
        "entry 'debug.json'.*SHA-256",
    ),
    "wrong recorded size": (
        _set(["entries", "attributes.json", "size"], 3),
        ArchiveSizeError,
        "entry 'attributes.json'.*records 3",
    ),
    # entries
    "missing blob": (_without("blobs/forward.bin"), ArchiveEntryError, "entry 'blobs/forward.bin'.*missing"),
    "missing debug": (_without("debug.json"), ArchiveEntryError, "entry 'debug.json'.*missing"),
    "extra entry": (_with("blobs/zzz.bin"), ArchiveEntryError, "entry 'blobs/zzz.bin'.*not listed"),
    "renamed entry": (_renamed, ArchiveEntryError, "entry 'blobs/forwarc.bin'"),
    "blob for unknown method": (
        lambda d: repack({**entries_of(d), "blobs/other.bin": b"?"}),
        ArchiveEntryError,
        "method 'other'",
    ),
    "out of order": (_swap_order, ArchiveEntryError, "sorted order"),
    "manifest not first": (
        lambda d: repack(entries_of(d), order=["attributes.json", "manifest.json", "blobs/forward.bin", "debug.json"]),
        ArchiveEntryError,
        "first entry is 'attributes.json'",
    ),
    "duplicate entry": (_duplicate, ArchiveEntryError, "entry 'blobs/forward.bin'.*appears twice"),
    "parent traversal": (_raw_names("../evil"), ArchiveEntryError, r"entry '\.\./evil'.*unsafe"),
    "nested traversal": (_raw_names("blobs/../../evil"), ArchiveEntryError, "unsafe"),
    "absolute name": (_raw_names("/etc/passwd"), ArchiveEntryError, "entry '/etc/passwd'.*unsafe"),
    "backslash name": (_raw_names("blobs\\..\\evil"), ArchiveEntryError, "unsafe"),
    "drive name": (_raw_names("C:/evil"), ArchiveEntryError, "unsafe"),
    "non-ASCII name": (_raw_names("blobs/f\u00f6rward.bin".encode()), ArchiveEntryError, "not ASCII"),
    # sizes and bombs
    "oversized declared size": (_declared_size(2**31), ArchiveSizeError, "entry 'blobs/forward.bin'.*past the end"),
    "size over the limit": (_declared_size(2**32 - 1), ArchiveSizeError, "entry 'blobs/forward.bin'"),
    "zip bomb": (_bomb, ArchiveSizeError, "entry 'debug.json'.*(inflates to more|deflate can produce)"),
    "too many entries": (_many_entries, ArchiveSizeError, "declares 10005 entries, more than the limit of 10000"),
    # manifest shapes
    "format name": (_set(["format"], "other-format"), ArchiveFormatError, "entry 'manifest.json'.*other-format"),
    "version a string": (_set(["schema_version"], "1.0"), ArchiveManifestError, "schema_version must be"),
    "version of bools": (_set(["schema_version"], [True, False]), ArchiveManifestError, "schema_version must be"),
    "methods not a list": (_set(["methods"], {"forward": {}}), ArchiveManifestError, "methods must be a list"),
    "methods empty": (_set(["methods"], []), ArchiveManifestError, "methods is empty"),
    "method not an object": (_set(["methods"], [3]), ArchiveManifestError, r"methods\[0\] must be an object"),
    "method spec incomplete": (
        _set(["methods", 0, "inputs"], None),
        ArchiveManifestError,
        r"methods\[0\] is not a valid method spec",
    ),
    "bad input dtype": (
        _set(["methods", 0, "inputs", 0, "dtype"], "float8"),
        ArchiveManifestError,
        "unknown dtype 'float8'",
    ),
    "bad parameter name": (
        _set(["methods", 0, "params", 0, "name"], "not a name"),
        ArchiveManifestError,
        r"methods\[0\]",
    ),
    "reserved method name": (
        lambda d: _set(["method_compile_spec"], {"lowered": {}})(_set(["methods", 0, "name"], "lowered")(d)),
        ArchiveManifestError,
        "name 'lowered'",
    ),
    "compile spec mismatch": (
        _set(["method_compile_spec", "forward"], {"x": 1}),
        ArchiveManifestError,
        r"method_compile_spec\['forward'\]",
    ),
    "unreadable in_structure": (
        _set(["methods", 0, "in_structure"], "garbage"),
        ArchiveManifestError,
        "in_structure: structure is 'garbage', not a structure node",
    ),
    "in_structure of wrong arity": (
        _set(["methods", 0, "inputs"], []),
        ArchiveManifestError,
        "in_structure has 1 leaves but the method has 0 flat inputs",
    ),
    "backend name a number": (_set(["backend", "name"], 7), ArchiveManifestError, "name must be a string"),
    "backend name bad": (_set(["backend", "name"], "../x"), ArchiveManifestError, "is not a backend name"),
    "torch version missing": (_set(["torch_version"], None), ArchiveManifestError, "torch_version must be a string"),
    "entries record wrong": (_set(["entries", "debug.json"], "abc"), ArchiveManifestError, r"entries\['debug.json'\]"),
    "manifest lists itself": (
        _set(["entries", "manifest.json"], {"size": 1, "sha256": "0"}),
        ArchiveManifestError,
        "lists manifest.json itself",
    ),
    "manifest not JSON": (_manifest_bytes(b"{not json"), ArchiveManifestError, "entry 'manifest.json'.*not valid JSON"),
    "manifest not UTF-8": (
        _manifest_bytes(b'{"format": "\xff\xfe"}'),
        ArchiveManifestError,
        "entry 'manifest.json'.*not UTF-8",
    ),
    "manifest a list": (_manifest_bytes(b"[1, 2]"), ArchiveManifestError, "must be a JSON object"),
    "duplicate JSON keys": (
        _manifest_bytes(b'{"format": "backendconf-archive", "format": "x"}'),
        ArchiveManifestError,
        "duplicate key 'format'",
    ),
    "NaN in JSON": (_manifest_bytes(b'{"format": NaN}'), ArchiveManifestError, "NaN is not allowed"),
    "infinite number in JSON": (
        _manifest_text(b'"compile_spec": {}', b'"compile_spec": {"x": 1e999}'),
        ArchiveManifestError,
        "number 1e999 is out of range",
    ),
    "deeply nested JSON": (
        _manifest_bytes(b"[" * 100_000 + b"]" * 100_000),
        ArchiveManifestError,
        "entry 'manifest.json'",
    ),
    # debug.json and attributes.json
    "debug not UTF-8": (_json_entry("debug.json", b"\xff"), ArchiveManifestError, "entry 'debug.json'.*not UTF-8"),
    "debug index out of range": (
        _debug(lambda d: d["nodes"][1].__setitem__(1, 999)),
        ArchiveManifestError,
        r"entry 'debug.json'.*nodes\[1\] op refers to 999",
    ),
    "debug handles not increasing": (
        _debug(lambda d: d["nodes"][2].__setitem__(0, 0)),
        ArchiveManifestError,
        "handles must increase",
    ),
    "debug table of numbers": (
        _debug(lambda d: d.__setitem__("files", [1])),
        ArchiveManifestError,
        r"files\[0\] must be a string",
    ),
    "debug unknown method": (
        _debug(lambda d: d["names"].__setitem__(d["nodes"][0][3], "nope")),
        ArchiveManifestError,
        "method 'nope'",
    ),
    "attributes wrong shape": (_attributes({"attributes": {}}), ArchiveManifestError, "entry 'attributes.json'"),
    "attribute dunder name": (
        _attributes({"attributes": [{"name": "__class__", "kind": "attribute", "value": 1}], "tensors": []}),
        ArchiveManifestError,
        "name '__class__'",
    ),
    "attribute shadows member": (
        _attributes({"attributes": [{"name": "cuda", "kind": "attribute", "value": 1}], "tensors": []}),
        ArchiveManifestError,
        "attribute 'cuda' would replace",
    ),
    "attribute bad tag": (
        _attributes({"attributes": [{"name": "a", "kind": "attribute", "value": {"code": "x"}}], "tensors": []}),
        ArchiveManifestError,
        "is not an encoded value",
    ),
    "attribute tensor index": (
        _attributes({"attributes": [{"name": "a", "kind": "attribute", "value": {"tensor": 4}}], "tensors": []}),
        ArchiveManifestError,
        "tensor reference 4",
    ),
    "bad tensor dtype": (_tensor_attribute(dtype="object"), ArchiveManifestError, "unknown tensor dtype 'object'"),
    "tensor bytes short": (_tensor_attribute(content=b"\0" * 7), ArchiveSizeError, r"entry 'tensors/0.bin'.*needs 8"),
    "tensor shape negative": (_tensor_attribute(shape=(-1,)), ArchiveManifestError, "not a list of sizes"),
    "tensor without entry": (
        lambda d: _without("tensors/0.bin")(_tensor_attribute()(d)),
        ArchiveEntryError,
        "entry 'tensors/0.bin'",
    ),
    "unknown backend": (_set(["backend", "name"], "nowhere"), ArchiveBackendError, "backend 'nowhere'"),
}


@pytest.mark.parametrize("case", sorted(HOSTILE))
def test_hostile_archive_gives_a_specific_error_naming_the_entry(small, case):
    mutate, error, pattern = HOSTILE[case]
    data = mutate(small)
    with pytest.raises(error, match=pattern) as caught:
        bc.load(data)
    assert "archive '<bytes>'" in str(caught.value)


def test_limits_can_be_tightened():
    data = _saving.to_bytes(lower())
    with pytest.raises(ArchiveSizeError, match="more than the limit of 100"):
        bc.load(data, limits=_archive.Limits(max_archive_bytes=100))
    with pytest.raises(ArchiveSizeError, match="4 entries, more than the limit of 3"):
        bc.load(data, limits=_archive.Limits(max_entries=3))
    with pytest.raises(ArchiveSizeError, match="entry 'manifest.json': declares .* more than the limit of 10;"):
        bc.load(data, limits=_archive.Limits(max_entry_bytes=10))
    with pytest.raises(ArchiveSizeError, match="entry 'manifest.json': .* bytes of JSON, more than the limit of 100"):
        bc.load(data, limits=_archive.Limits(max_json_bytes=100))


def test_a_flipped_padding_bit_of_the_deflated_debug_info_is_caught(small):
    # The last byte of a deflate stream has unused bits: flipping one changes
    # nothing that inflates, so only a hash of the stored bytes can see it.
    entries = {info.filename: info for info in zipfile.ZipFile(io.BytesIO(small)).infolist()}
    debug = entries["debug.json"]
    local_header = 30 + len("debug.json")
    last = debug.header_offset + local_header + debug.compress_size - 1
    for bit in range(8):
        changed = bytearray(small)
        changed[last] ^= 1 << bit
        with pytest.raises(ArchiveError):
            _archive.read_archive(bytes(changed))


def test_every_single_byte_change_is_an_archive_error(small):
    survivors = []
    for i in range(len(small)):
        for mask in (0x01, 0xFF):
            changed = small[:i] + bytes([small[i] ^ mask]) + small[i + 1 :]
            try:
                _archive.read_archive(changed)
            except ArchiveError:
                continue
            survivors.append((i, mask))
    assert survivors == []


@settings(max_examples=MUTATIONS, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.data())
def test_mutated_archives_raise_only_archive_errors(small, data):
    blob = bytearray(small)
    for _ in range(data.draw(st.integers(1, 4), label="mutations")):
        kind = data.draw(st.sampled_from(["flip", "truncate", "splice", "insert", "delete"]), label="kind")
        at = data.draw(st.integers(0, max(len(blob) - 1, 0)), label="at")
        if kind == "flip" and blob:
            blob[at] ^= data.draw(st.integers(1, 255), label="mask")
        elif kind == "truncate":
            del blob[at:]
        elif kind == "splice":
            start = data.draw(st.integers(0, len(small) - 1), label="from")
            length = data.draw(st.integers(1, 64), label="length")
            blob[at : at + length] = small[start : start + length]
        elif kind == "insert":
            blob[at:at] = data.draw(st.binary(min_size=1, max_size=32), label="bytes")
        elif kind == "delete":
            del blob[at : at + data.draw(st.integers(1, 64), label="length")]
    assert_only_archive_error(bytes(blob))


def test_archive_code_never_unpickles_or_evaluates():
    package = os.path.dirname(bc.__file__)
    archive_modules = [
        os.path.join("archive", n) for n in os.listdir(os.path.join(package, "archive")) if n.endswith(".py")
    ]
    archive_modules += [
        os.path.join("debuginfo", "_symbolication.py"),
        os.path.join("target", "_target.py"),
        os.path.join("lowering", "_saving.py"),
    ]
    assert len(archive_modules) >= 12, archive_modules
    for name in archive_modules:
        source = open(os.path.join(package, name), encoding="utf-8").read()
        for forbidden in ("pickle", "torch.load(", "eval(", "exec(", "marshal"):
            assert forbidden not in source, f"{name} contains {forbidden!r}"


# --- symbolication and debug info size ----------------------------------------------------------


def test_symbolicate_from_path_bytes_archive_and_module(tmp_path):
    lowered = lower(spec=ALL_METHODS, inputs=ALL_INPUTS)
    path = tmp_path / "n.bcpt"
    bc.save(lowered, path)
    info = next(i for i in bc.debug_info(lowered).values() if i.node == "mul" and i.method == "forward")
    expected = f"debug handle {info.handle} (method 'forward', node 'mul', aten::mul):\n{info}"
    assert "Module hierarchy:top(N)::forward.m(M)::forward.l(L)::forward.aten::mul" in expected
    assert "    return x * 5\n           ~~~~~ <--- HERE" in expected
    missing = "Debug info for handle(s): debug_handles:{-1}, was not found."
    for source in (path, str(path), path.read_bytes(), _archive.read_archive(path), lowered, lowered.lowered):
        assert bc.symbolicate(source, [info.handle, -1]) == f"{expected}\n{missing}"
    assert bc.symbolicate(path, info.handle) == expected
    with pytest.raises(TypeError, match="debug handles are integers, got '17'"):
        bc.symbolicate(path, ["17"])


def test_symbolicate_needs_no_backend():
    data = _saving.to_bytes(lower(TinyBackend("tiny_ghost")))
    with pytest.raises(ArchiveBackendError):
        bc.load(data)
    assert "aten::sub" in bc.symbolicate(data, [min(_archive.read_archive(data).debug) + 2])


def test_symbolicate_many_handles_gives_each_handles_text(tmp_path):
    # Speed is the benchmark's job (benchmarks/, "symbolication"); here many
    # repeated handles must give exactly the per-handle texts, in order.
    path = tmp_path / "n.bcpt"
    bc.save(lower(spec=ALL_METHODS, inputs=ALL_INPUTS), path)
    unique = sorted(_archive.read_archive(path).debug)
    handles = unique * 2_000
    many = bc.symbolicate(path, handles)
    one_by_one = [bc.symbolicate(path, [h]) for h in unique]
    assert many.count("Module hierarchy") == len(handles)
    for text in one_by_one:
        assert text in many


class Block(torch.nn.Module):
    def forward(self, x):
        y = x * 2 + 1
        z = y - x * 3
        return z + y * 0.5


class Deep(torch.nn.Module):
    """About 50 nodes: seven blocks of the same source lines."""

    def __init__(self):
        super().__init__()
        self.blocks = torch.nn.ModuleList(Block() for _ in range(7))

    def forward(self, x):
        for block in self.blocks:
            x = block(x) - 1
        return x


def test_debug_info_is_a_third_of_torch_export_stack_traces():
    lowered = bc.to_backend(Deep(), TINY, {"forward": {}}, example_inputs=(X,))
    program = torch.export.export(Deep(), (X,))
    assert len(program.graph.nodes) >= 50
    sizes = _archive.debug_info_sizes(lowered, program)
    assert sizes.torch_stack_trace_bytes > 0
    assert sizes.ratio <= 1 / 3, sizes
    assert sizes == _archive.debug_info_sizes(_saving.to_bytes(lowered), [program])
