"""The archive's own structure format, reading 0.1.0 archives, and loading that imports nothing.

Schema 1.0 archives (pytest-backendconf 0.1.0) stored torch's private
``treespec_dumps`` strings, whose reader imports modules named in them. The
committed ``tests/data/archive-0.1.0.bcpt`` (made by
``tests/data/make_archive_0_1_0.py`` with 0.1.0) must keep loading; crafted
1.0 archives naming modules must be refused without importing anything.
"""

from __future__ import annotations

import collections
import copy
import hashlib
import io
import json
import sys
import zipfile
from pathlib import Path

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import pytest_backendconf as bc
from pytest_backendconf.archive import _archive, _zip as _archive_zip, _structure
from pytest_backendconf.lowering import _saving
from pytest_backendconf.errors import ArchiveManifestError, InputSpecError, LoweringError

DATA = Path(__file__).parent / "data"
OLD = DATA / "archive-0.1.0.bcpt"


def entries_of(data: bytes) -> dict[str, bytes]:
    with zipfile.ZipFile(io.BytesIO(data)) as z:
        return {info.filename: z.read(info) for info in z.infolist()}


def repack(entries: dict[str, bytes]) -> bytes:
    """The entries in the archive layout, with a manifest whose sizes and hashes fit them."""
    manifest = json.loads(entries["manifest.json"])
    manifest["entries"] = {
        n: {"size": len(d), "sha256": hashlib.sha256(_archive_zip.stored_bytes(n, d)).hexdigest()}
        for n, d in sorted(entries.items())
        if n != "manifest.json"
    }
    entries = {**entries, "manifest.json": json.dumps(manifest, indent=1).encode()}
    order = ["manifest.json"] + sorted(n for n in entries if n != "manifest.json")
    return _archive_zip.pack([(n, entries[n]) for n in order])


def edit_manifest(data: bytes, edit) -> bytes:
    entries = entries_of(data)
    manifest = json.loads(entries["manifest.json"])
    edit(manifest)
    entries["manifest.json"] = json.dumps(manifest).encode()
    return repack(entries)


def old_node(kind=None, context=None, children=()):
    return {"type": kind, "context": context, "children_spec": list(children)}


LEAF_1_0 = old_node()


def as_treespec_1_0(structure) -> str:
    """The ``treespec_dumps`` string 0.1.0 wrote for a structure of leaves, tuples, lists and dicts."""

    def node(s):
        if s == "leaf":
            return LEAF_1_0
        ((tag, body),) = s.items()
        if tag == "dict":
            return old_node("builtins.dict", json.dumps([k for k, _ in body]), [node(c) for _, c in body])
        return old_node(f"builtins.{tag}", "null", [node(c) for c in body])

    return json.dumps([1, node(structure)])


def as_schema_1_0(manifest: dict) -> None:
    """Rewrite a manifest's method structures as schema 1.0 wrote them."""
    manifest["schema_version"] = [1, 0]
    for method in manifest["methods"]:
        method["in_spec"] = as_treespec_1_0(method.pop("in_structure"))
        method["out_spec"] = as_treespec_1_0(method.pop("out_structure"))


def with_old_in_spec(node) -> bytes:
    """The 0.1.0 fixture with its forward method's in_spec replaced (checksums kept valid)."""

    def edit(manifest):
        manifest["methods"][0]["in_spec"] = json.dumps([1, node])

    return edit_manifest(OLD.read_bytes(), edit)


# --- archives written by 0.1.0 -------------------------------------------------------------------


def test_an_archive_written_by_0_1_0_loads_and_runs():
    archive = bc.read_archive(OLD)
    assert archive.schema_version == (1, 0)
    assert archive.writer == "pytest-backendconf 0.1.0"
    forward = archive.methods["forward"]
    assert forward.in_structure == {
        "tuple": [
            {"tuple": ["leaf", {"tuple": ["leaf", {"list": ["leaf", "leaf"]}]}]},
            {"dict": [["opts", {"dict": [["scale", "leaf"]]}]]},
        ]
    }
    assert forward.out_structure == {
        "dict": [
            ["sum", "leaf"],
            ["parts", {"tuple": ["leaf", {"list": ["leaf", "leaf"]}]}],
        ]
    }
    module = bc.load(OLD)
    got = module(*module.fixture_args, opts=module.fixture_kwargs)
    torch.testing.assert_close(got, module.fixture_expected)
    assert type(got["parts"]) is tuple and type(got["parts"][1]) is list


def test_saving_a_0_1_0_archive_writes_the_new_schema_without_torch_strings(tmp_path):
    module = bc.load(OLD)
    bc.save(module, tmp_path / "new.bcpt")
    archive = bc.read_archive(tmp_path / "new.bcpt")
    assert archive.schema_version == _archive.SCHEMA_VERSION == (1, 2)
    manifest = entries_of((tmp_path / "new.bcpt").read_bytes())["manifest.json"].decode()
    for private in ("in_spec", "out_spec", "children_spec", "builtins.", "treespec"):
        assert private not in manifest
    assert archive.methods["forward"].in_structure == bc.read_archive(OLD).methods["forward"].in_structure
    again = bc.load(tmp_path / "new.bcpt")
    torch.testing.assert_close(again(*module.fixture_args, opts=module.fixture_kwargs), module.fixture_expected)


class Point(collections.namedtuple("Point", ["x", "y"])):
    pass


class TwoWays(torch.nn.Module):
    def forward(self, p, scale: float = 2.0):
        return Point(p.x * scale, p.y + p.x), None


def test_named_tuples_are_kept_by_their_name_and_fields(tmp_path):
    p = Point(torch.ones(2), torch.arange(2.0))
    lowered = bc.to_backend(TwoWays(), "reference", {"forward": {}}, example_inputs=(p,))
    bc.save(lowered, tmp_path / "p.bcpt")
    manifest = json.loads(entries_of((tmp_path / "p.bcpt").read_bytes())["manifest.json"])
    assert "Point" in json.dumps(manifest["methods"][0]["in_structure"])
    assert __name__ not in json.dumps(manifest)  # a class is never named by its module
    for module in (lowered, bc.load(tmp_path / "p.bcpt")):
        out, none = module(p)
        assert none is None
        assert type(out).__name__ == "Point" and out._fields == ("x", "y")
        torch.testing.assert_close(tuple(out), (p.x * 2, p.y + p.x))
    with pytest.raises(
        InputSpecError, match=r"shaped like \(\(Point\(x=\*, y=\*\), \*\), \{\}\).*called with \(\(\(\*, \*\), \*\)"
    ):
        lowered(tuple(p))


class OrderedOut(torch.nn.Module):
    def forward(self, x):
        return collections.OrderedDict(a=x + 1)


def test_a_container_the_archive_cannot_record_is_a_lowering_error():
    with pytest.raises(LoweringError, match=r"outputs of method 'forward' holds a collections.OrderedDict"):
        bc.to_backend(OrderedOut(), "reference", {"forward": {}}, example_inputs=(torch.ones(2),))


# --- loading imports nothing --------------------------------------------------------------------------

CANARY = "backendconf_canary_mod"


@pytest.fixture
def canary(tmp_path, monkeypatch):
    """A module next to the archives that records being imported; its directory is on sys.path."""
    marker = tmp_path / "imported"
    (tmp_path / f"{CANARY}.py").write_text(
        "import enum, pathlib\n"
        f"pathlib.Path({str(marker)!r}).write_text('imported')\n"
        "class Color(enum.Enum):\n    RED = 1\n"
        "def factory():\n    return 1\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    sys.modules.pop(CANARY, None)
    yield tmp_path, marker
    sys.modules.pop(CANARY, None)


HOSTILE_1_0 = {
    # {"__enum__": ...} as a dict key: treespec_loads imports the module to find the enum.
    "enum key": old_node(
        "builtins.tuple",
        "null",
        [
            old_node(
                "builtins.tuple",
                "null",
                [
                    LEAF_1_0,
                    old_node(
                        "builtins.tuple", "null", [LEAF_1_0, old_node("builtins.list", "null", [LEAF_1_0, LEAF_1_0])]
                    ),
                ],
            ),
            old_node(
                "builtins.dict",
                json.dumps([{"__enum__": True, "fqn": f"{CANARY}:Color", "name": "RED"}]),
                [old_node("builtins.dict", json.dumps(["scale"]), [LEAF_1_0])],
            ),
        ],
    ),
    # A defaultdict whose factory is looked up by module and name (os.abort in the crafted case).
    "defaultdict factory": old_node(
        "builtins.tuple",
        "null",
        [
            old_node(
                "collections.defaultdict",
                {"default_factory_module": CANARY, "default_factory_name": "factory", "dict_context": ["a"]},
                [LEAF_1_0],
            ),
        ],
    ),
    "os.abort factory": old_node(
        "collections.defaultdict",
        {"default_factory_module": "os", "default_factory_name": "abort", "dict_context": []},
        [],
    ),
    "registered type name": old_node(f"{CANARY}.Thing", "null", [LEAF_1_0]),
    "named tuple": old_node("collections.namedtuple", f"{CANARY}.Point", [LEAF_1_0]),
}


@pytest.mark.parametrize("case", sorted(HOSTILE_1_0))
def test_a_crafted_0_1_0_archive_is_refused_without_importing_anything(canary, case, tmp_path):
    directory, marker = canary
    path = directory / "crafted.bcpt"
    path.write_bytes(with_old_in_spec(HOSTILE_1_0[case]))
    bc.load(OLD)  # the backend and torch are imported by an honest archive first
    before = set(sys.modules)
    with pytest.raises(
        ArchiveManifestError, match=r"entry 'manifest.json': method 'forward' has an unreadable in_spec"
    ):
        bc.load(path)
    assert set(sys.modules) == before
    assert not marker.exists()


def test_loading_honest_archives_imports_no_module(canary, tmp_path):
    _, marker = canary
    bc.load(OLD)
    fresh = tmp_path / "fresh.bcpt"
    bc.save(
        bc.to_backend(TwoWays(), "reference", {"forward": {}}, example_inputs=(Point(torch.ones(2), torch.ones(2)),)),
        fresh,
    )
    bc.load(fresh)
    before = set(sys.modules)
    for path in (OLD, fresh):
        bc.load(path)
        bc.read_archive(path)
        bc.symbolicate(path, [1, 2])
    assert set(sys.modules) == before
    assert not marker.exists()


def test_the_old_reader_keeps_what_0_1_0_wrote_and_names_what_it_refuses():
    assert _structure.from_treespec_1_0(json.dumps([1, LEAF_1_0])) == "leaf"
    keys = old_node("builtins.dict", json.dumps(["a", 7, None, True, 2.5]), [LEAF_1_0] * 5)
    assert _structure.from_treespec_1_0(json.dumps([1, keys])) == {
        "dict": [["a", "leaf"], [7, "leaf"], [None, "leaf"], [True, "leaf"], [2.5, "leaf"]]
    }
    refused = {
        "not JSON": ("{", "is not JSON"),
        "protocol 2": (json.dumps([2, LEAF_1_0]), "not a protocol-1 treespec"),
        "tuple key": (json.dumps([1, old_node("builtins.dict", json.dumps([[1, 2]]), [LEAF_1_0])]), "has key [1, 2]"),
        "repeated key": (
            json.dumps([1, old_node("builtins.dict", json.dumps([1, True]), [LEAF_1_0] * 2)]),
            "repeats the key",
        ),
        "OrderedDict": (
            json.dumps([1, old_node("collections.OrderedDict", json.dumps(["a"]), [LEAF_1_0])]),
            "type 'collections.OrderedDict', which this release does not read",
        ),
        "leaf with children": (json.dumps([1, old_node(None, None, [LEAF_1_0])]), "a leaf with a context or children"),
        "extra field": (json.dumps([1, {**LEAF_1_0, "x": 1}]), "not a treespec node"),
        "deep": (json.dumps([1, _deep_old(100)]), "nested more than 64 levels"),
        "not a string": (5, "not a treespec string"),
    }
    for text, message in refused.values():
        with pytest.raises(_structure.StructureError, match=message.replace("[", r"\[").replace("]", r"\]")):
            _structure.from_treespec_1_0(text)


def _deep_old(n):
    node = LEAF_1_0
    for _ in range(n):
        node = old_node("builtins.list", "null", [node])
    return node


def test_new_archives_name_the_field_of_a_bad_structure():
    data = _saving.to_bytes(
        bc.to_backend(TwoWays(), "reference", {"forward": {}}, example_inputs=(Point(torch.ones(2), torch.ones(2)),))
    )
    cases = {
        "old key in a new archive": (lambda m: m["methods"][0].pop("in_structure"), "in_structure is missing"),
        "unknown kind": (lambda m: m["methods"][0].update(out_structure={"set": []}), "unknown kind 'set'"),
        "too few leaves": (
            lambda m: m["methods"][0].update(out_structure="leaf"),
            "out_structure has 1 leaves but the method has 3 flat outputs",
        ),
        "bad field": (
            lambda m: m["methods"][0]["in_structure"]["tuple"][0]["tuple"][0]["namedtuple"].update(fields=["x", "_y"]),
            "must be distinct identifiers",
        ),
        "object key": (
            lambda m: m["methods"][0]["in_structure"]["tuple"][1].update(dict=[[{"a": 1}, "leaf"]]),
            "has key {'a': 1}",
        ),
    }
    for name, (edit, message) in cases.items():
        with pytest.raises(
            ArchiveManifestError, match=r"entry 'manifest.json': methods\[0\] is not a valid method spec"
        ) as e:
            bc.read_archive(edit_manifest(data, edit))
        assert message in str(e.value), name


# --- the format, property-tested -------------------------------------------------------------------------

keys = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-(2**63), 2**63 - 1),
    st.text(max_size=4),
    st.floats(allow_nan=False, allow_infinity=False),
)
structures = st.recursive(
    st.sampled_from(["leaf", "none"]),
    lambda inner: st.one_of(
        st.builds(lambda xs: {"tuple": xs}, st.lists(inner, max_size=3)),
        st.builds(lambda xs: {"list": xs}, st.lists(inner, max_size=3)),
        st.builds(lambda d: {"dict": [[k, v] for k, v in d.items()]}, st.dictionaries(keys, inner, max_size=3)),
        st.builds(
            lambda xs: {"namedtuple": {"name": "T", "fields": [f"f{i}" for i in range(len(xs))], "items": xs}},
            st.lists(inner, max_size=3),
        ),
    ),
    max_leaves=12,
)


@settings(max_examples=200, deadline=None)
@given(structures)
def test_rebuilding_then_flattening_gives_back_the_leaves(structure):
    n = _structure.check(structure)
    leaves = [object() for _ in range(n)]
    value = _structure.rebuilder(structure)(leaves)
    assert _structure.flatten(structure, value) == leaves
    assert _structure.check(json.loads(json.dumps(structure))) == n
    _structure.describe(structure)


json_values = st.recursive(
    st.one_of(st.none(), st.booleans(), st.integers(), st.text(max_size=5), st.sampled_from(["leaf", "none"])),
    lambda inner: st.one_of(
        st.lists(inner, max_size=3),
        st.dictionaries(
            st.sampled_from(
                [
                    "tuple",
                    "list",
                    "dict",
                    "namedtuple",
                    "name",
                    "fields",
                    "items",
                    "type",
                    "context",
                    "children_spec",
                    "x",
                ]
            ),
            inner,
            max_size=3,
        ),
    ),
    max_leaves=15,
)


@settings(max_examples=300, deadline=None)
@given(json_values)
def test_any_json_is_a_structure_or_a_structure_error(value):
    for read in (_structure.check, lambda v: _structure.from_treespec_1_0(json.dumps([1, v]))):
        try:
            read(copy.deepcopy(value))
        except _structure.StructureError:
            pass
