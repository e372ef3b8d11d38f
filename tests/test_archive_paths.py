"""The source paths an archive stores (``debug.json``'s file table) and how they read back.

These pin the stored path of each kind of source file, so that how the
writer finds them (an index of the loaded modules, kept up to date as
modules are added or removed) can change without changing one stored byte.
"""

from __future__ import annotations

import importlib
import importlib.util
import json
import os
import sys
import textwrap
import uuid

import pytest
import torch

import pytest_backendconf as bc
from pytest_backendconf.archive import PortablePaths
from pytest_backendconf.conformance import zoo

HERE = os.path.dirname(os.path.abspath(__file__))


def stored(file: str) -> str:
    """The path a fresh writer stores for ``file`` (each save makes a new one)."""
    return PortablePaths().relative(file)


@pytest.fixture
def fresh_modules():
    """Unique module names under a temporary import root; every module they name is unloaded afterwards."""
    added: list[str] = []

    def name(stem: str) -> str:
        unique = f"{stem}_{uuid.uuid4().hex[:8]}"
        added.append(unique)
        return unique

    yield name
    for loaded in list(sys.modules):
        if loaded.split(".")[0] in added:
            del sys.modules[loaded]


def write(path, text: str = "VALUE = 1\n") -> str:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return str(path)


def load_as(name: str, file: str):
    """Import ``file`` under the module name ``name`` (as a plugin loader or ``runpy`` might)."""
    spec = importlib.util.spec_from_file_location(name, file)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def test_an_installed_module_is_stored_as_its_module_path():
    assert stored(os.path.abspath(torch.nn.modules.linear.__file__)) == "torch/nn/modules/linear.py"
    assert stored(os.path.abspath(torch.__file__)) == "torch/__init__.py"
    # Installed from conformance/ in this checkout, imported as pytest_backendconf.conformance.zoo.
    assert stored(os.path.abspath(zoo.__file__)) == "pytest_backendconf/conformance/zoo.py"


def test_this_test_file_is_stored_by_its_module_name():
    assert __name__ == "test_archive_paths"  # pytest imports the tests folder's files by their names
    assert stored(os.path.abspath(__file__)) == "test_archive_paths.py"


def test_a_user_module_in_a_temporary_folder(tmp_path, monkeypatch, fresh_modules):
    package = fresh_modules("userpkg")
    model = write(tmp_path / package / "model.py")
    init = write(tmp_path / package / "__init__.py", "")
    monkeypatch.syspath_prepend(str(tmp_path))
    importlib.import_module(f"{package}.model")
    assert stored(model) == f"{package}/model.py"
    assert stored(init) == f"{package}/__init__.py"


def test_the_module_name_decides_not_the_folder(tmp_path, monkeypatch, fresh_modules):
    # Loaded under a name of its own: the name's package path and the file's own name.
    alias = fresh_modules("alias")
    file = write(tmp_path / "elsewhere" / "real.py")
    monkeypatch.syspath_prepend(str(tmp_path))
    load_as(f"{alias}.inner.mod", file)
    assert stored(file) == f"{alias}/inner/real.py"  # not elsewhere/real.py, its place under the root


def test_a_file_imported_under_two_names_keeps_the_first(tmp_path, monkeypatch, fresh_modules):
    first, second = fresh_modules("first"), fresh_modules("second")
    file = write(tmp_path / "shared.py")
    load_as(f"{first}.a", file)
    load_as(f"{second}.b.c", file)
    assert stored(file) == f"{first}/shared.py"
    del sys.modules[f"{first}.a"]  # unloaded: the other name holds it now
    assert stored(file) == f"{second}/b/shared.py"


def test_a_module_imported_after_an_earlier_save_is_found(tmp_path, fresh_modules):
    paths = PortablePaths()
    assert paths.relative(os.path.abspath(torch.__file__)) == "torch/__init__.py"
    late = fresh_modules("late")
    file = write(tmp_path / "late_file.py")
    assert stored(file) == "late_file.py"  # not a module yet, under no root: its name
    load_as(f"{late}.pkg.m", file)
    assert stored(file) == f"{late}/pkg/late_file.py"


def test_a_module_replaced_under_the_same_name_is_followed(tmp_path, fresh_modules):
    name = fresh_modules("swap")
    one, two = write(tmp_path / "one" / "code.py"), write(tmp_path / "two" / "other.py")
    load_as(f"{name}.x", one)
    assert stored(one) == f"{name}/code.py"
    assert stored(two) == "other.py"
    load_as(f"{name}.x", two)  # the same name, now another file: sys.modules' length is unchanged
    assert stored(two) == f"{name}/other.py"
    assert stored(one) == "code.py"
    load_as(f"{name}.x", one)
    three = write(tmp_path / "three" / "later.py")
    after = fresh_modules("after")
    load_as(f"{after}.y", three)  # imported later: name.x is no longer the last entry
    assert stored(three) == f"{after}/later.py" and stored(one) == f"{name}/code.py"
    load_as(f"{name}.x", two)  # replaced in the middle of sys.modules
    assert stored(one) == "code.py"  # the module found for it is no longer loaded under its name
    assert stored(two) == f"{name}/other.py"
    sys.modules[f"{name}.x"] = sys.modules[f"{name}.x"]  # set again in place: nothing changed
    assert stored(two) == f"{name}/other.py"


def test_pseudo_files_and_relative_paths_are_stored_as_they_are():
    assert stored("<string>") == "<string>"
    assert stored("<eval_with_key>.3") == "<eval_with_key>.3"
    assert stored("pkg/relative.py") == "pkg/relative.py"


def test_a_file_under_an_import_root_but_not_imported(tmp_path, monkeypatch):
    file = write(tmp_path / "sub" / "thing.py")
    monkeypatch.syspath_prepend(str(tmp_path))
    assert stored(file) == "sub/thing.py"
    monkeypatch.syspath_prepend(str(tmp_path / "sub"))  # the deepest root holding it wins
    assert stored(file) == "thing.py"


def test_a_file_under_no_import_root_is_stored_by_its_name(tmp_path):
    file = write(tmp_path / "nowhere" / "orphan.py")
    assert not any(file.startswith(os.path.abspath(p or os.curdir) + os.sep) for p in sys.path)
    assert stored(file) == "orphan.py"


def test_stored_paths_read_back_as_the_local_files(tmp_path, monkeypatch, fresh_modules):
    paths = PortablePaths()
    assert paths.absolute("torch/nn/modules/linear.py") == os.path.abspath(torch.nn.modules.linear.__file__)
    assert paths.absolute("test_archive_paths.py") == os.path.abspath(__file__)
    assert paths.absolute("<string>") == "<string>"
    assert paths.absolute("no_such_package/gone.py") == "no_such_package/gone.py"
    assert paths.absolute("../escape.py") == "../escape.py"
    file = write(tmp_path / "sub" / "thing.py")
    monkeypatch.syspath_prepend(str(tmp_path))
    assert PortablePaths().absolute("sub/thing.py") == file  # under a root, not imported
    name = fresh_modules("back")
    load_as(f"{name}.m", file)
    assert PortablePaths().absolute(f"{name}/thing.py") == file


def test_a_saved_model_defined_in_a_user_module(tmp_path, monkeypatch, fresh_modules):
    package = fresh_modules("usermodel")
    write(tmp_path / package / "__init__.py", "")
    write(
        tmp_path / package / "net.py",
        textwrap.dedent(
            """
            import torch

            class Net(torch.nn.Module):
                def forward(self, x):
                    return torch.relu(x) * 2
            """
        ),
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    net = importlib.import_module(f"{package}.net")
    lowered = bc.to_backend(net.Net(), "reference", {"forward": {}}, example_inputs=(torch.randn(3),))
    archive = tmp_path / "net.bcpt"
    bc.save(lowered, archive)
    import zipfile

    with zipfile.ZipFile(archive) as z:
        files = json.loads(z.read("debug.json"))["files"]
    assert files == [f"{package}/net.py"]
    frames = [f for info in bc.read_archive(archive).debug.values() for f in info.frames]
    assert frames and {f.file for f in frames} == {str(tmp_path / package / "net.py")}
