"""Backend versions at load (accepts_blob_version) and source locations of models without files."""

from __future__ import annotations

import linecache

import pytest
import torch
from backendconf_reference import ReferenceBackend

import pytest_backendconf as bc
from pytest_backendconf.conformance.serialization.backend_versions import FUTURE_VERSION, with_backend_version
from pytest_backendconf.errors import ArchiveError, ArchiveVersionError, BackendContractError, BackendVersionError
from pytest_backendconf.lowering import _saving

from lowering_models import N


class NoVersionPolicy(ReferenceBackend):
    """The reference backend without accepts_blob_version: every version is accepted."""

    accepts_blob_version = None


class AnswersNone(ReferenceBackend):
    def accepts_blob_version(self, version):
        if version == self.version:
            return True


class Raises(ReferenceBackend):
    def accepts_blob_version(self, version):
        raise ValueError("cannot parse")


@pytest.fixture(scope="module")
def archive() -> bytes:
    lowered = bc.to_backend(N(), "reference", {"forward": {}}, example_inputs=(torch.randn(2, 3),))
    from pytest_backendconf.lowering._saving import to_bytes

    return to_bytes(lowered)


def test_the_backend_declared_version_is_recorded(archive):
    assert bc.read_archive(archive).backend_version == ReferenceBackend.version


def test_a_far_future_archive_is_refused_naming_both_versions_and_the_fix(archive):
    future = with_backend_version(archive, FUTURE_VERSION)
    with pytest.raises(BackendVersionError) as info:
        bc.load(future)
    text = str(info.value)
    assert isinstance(info.value, ArchiveVersionError) and isinstance(info.value, ArchiveError)
    assert f"backend 'reference' version {FUTURE_VERSION}" in text
    assert f"backend 'reference' version {ReferenceBackend.version} does not accept them" in text
    assert f"Re-lower the model with backend reference {ReferenceBackend.version}" in text
    assert f"install backend reference version {FUTURE_VERSION}" in text
    assert (info.value.archive_version, info.value.backend_version) == (FUTURE_VERSION, ReferenceBackend.version)


def test_an_older_minor_of_the_same_major_loads(archive):
    loaded = bc.load(with_backend_version(archive, "0.0.9"))
    x = torch.randn(2, 3)
    torch.testing.assert_close(loaded(x), N()(x))


def test_a_backend_without_a_version_policy_accepts_any_version(archive):
    archive_obj = bc.read_archive(with_backend_version(archive, FUTURE_VERSION))
    loaded = _saving.instantiate(archive_obj, NoVersionPolicy())
    assert loaded.lowered.backend_version == FUTURE_VERSION


@pytest.mark.parametrize(
    "backend, says",
    [
        (AnswersNone(), "returned None; it must return True or False"),
        (Raises(), "raised ValueError: cannot parse; it must return True or False for any version string"),
    ],
)
def test_a_broken_version_policy_is_a_contract_error_naming_it(archive, backend, says):
    archive_obj = bc.read_archive(with_backend_version(archive, FUTURE_VERSION))
    with pytest.raises(BackendContractError, match=f"accepts_blob_version\\('{FUTURE_VERSION}'\\) {says}"):
        _saving.instantiate(archive_obj, backend)


def test_a_version_that_is_not_a_string_is_refused_at_lowering():
    class IntVersion(ReferenceBackend):
        version = 3

    with pytest.raises(
        BackendContractError, match="declares version 3; a backend's `version` must be a non-empty string"
    ):
        bc.to_backend(N(), IntVersion(), {"forward": {}}, example_inputs=(torch.randn(2, 3),))


# --- models without a file: exec'd strings, notebook cells ------------------------------------

SOURCE = """import torch
class Exec(torch.nn.Module):
    def forward(self, x):
        y = x + 1
        return torch.ops.backendconf_probe.mystery(y) * 5
"""


def _exec_model(file: str, register: bool) -> torch.nn.Module:
    import pytest_backendconf.conformance._probe_models  # noqa: F401  (registers backendconf_probe::mystery)

    namespace: dict = {}
    exec(compile(SOURCE, file, "exec"), namespace)
    if register:  # what IPython does for every cell
        linecache.cache[file] = (len(SOURCE), None, SOURCE.splitlines(True), file)
    return namespace["Exec"]()


def test_a_model_defined_with_exec_shows_its_string_frame_and_op():
    with pytest.raises(bc.UnsupportedNodeError) as info:
        bc.to_backend(
            _exec_model("<string>", register=False), "reference", {"forward": {}}, example_inputs=(torch.randn(2, 3),)
        )
    lines = str(info.value).splitlines()
    assert lines[:3] == [
        "The node of backendconf_probe::mystery is not supported in this compiler. Source code:",
        '  File "<string>", line 5, in forward',
        "    (no source text for this file; the node is backendconf_probe::mystery)",
    ]
    assert info.value.debug_info.file == "<string>" and info.value.debug_info.line == 5


def test_a_notebook_cell_gets_its_source_and_carets_from_linecache():
    cell = "<ipython-input-7-0123456789ab>"
    try:
        with pytest.raises(bc.UnsupportedNodeError) as info:
            bc.to_backend(
                _exec_model(cell, register=True), "reference", {"forward": {}}, example_inputs=(torch.randn(2, 3),)
            )
    finally:
        linecache.cache.pop(cell, None)
    assert str(info.value).splitlines()[1:4] == [
        f'  File "{cell}", line 5, in forward',
        "    return torch.ops.backendconf_probe.mystery(y) * 5",
        "           ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~ <--- HERE",
    ]


def test_the_public_version_policy_takes_the_same_major_up_to_our_minor():
    from pytest_backendconf.backend import same_major_not_newer

    assert same_major_not_newer("1.2.0", "1.4.0") and same_major_not_newer("1.4.0rc1", "1.4.0")
    assert not same_major_not_newer("1.5.0", "1.4.0")  # a newer minor may write what we cannot run
    assert not same_major_not_newer("0.9.0", "1.4.0") and not same_major_not_newer("nightly", "1.4.0")
