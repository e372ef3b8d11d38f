"""Durability of written files: ``write_atomic`` syncs by default; ``BACKENDCONF_FSYNC=off`` skips it.

The syncs are counted through the real ``os.fsync`` (wrapped, still called),
and every file is read back: skipping them must never cost atomicity.
"""

from __future__ import annotations

import os

import pytest
import torch

import pytest_backendconf as bc
from pytest_backendconf.archive import _files, sync_files, write_atomic


@pytest.fixture
def fsyncs(monkeypatch):
    """The file descriptors ``os.fsync`` was called with, in order (the real call still runs)."""
    calls: list[int] = []
    real = os.fsync

    def counting(fd: int) -> None:
        calls.append(fd)
        real(fd)

    monkeypatch.setattr(os, "fsync", counting)
    monkeypatch.delenv(_files.SYNC_ENV, raising=False)
    return calls


def leftovers(folder) -> list[str]:
    return [n for n in os.listdir(folder) if n.endswith(".tmp")]


def test_a_write_syncs_the_file_and_its_rename_by_default(tmp_path, fsyncs):
    write_atomic(tmp_path / "a.txt", "one")
    assert len(fsyncs) == 2  # the data before the rename, the folder after it
    assert (tmp_path / "a.txt").read_text() == "one"


def test_off_skips_both_syncs_and_the_write_stays_atomic(tmp_path, fsyncs, monkeypatch):
    monkeypatch.setenv(_files.SYNC_ENV, "off")
    target = tmp_path / "a.bin"
    target.write_bytes(b"old")
    write_atomic(target, b"new" * 1000)
    assert fsyncs == []
    assert target.read_bytes() == b"new" * 1000
    assert leftovers(tmp_path) == []


def test_a_caller_that_chooses_is_not_overridden(tmp_path, fsyncs, monkeypatch):
    monkeypatch.setenv(_files.SYNC_ENV, "off")
    write_atomic(tmp_path / "a.txt", "x", sync=True)
    assert len(fsyncs) == 2
    monkeypatch.setenv(_files.SYNC_ENV, "on")
    write_atomic(tmp_path / "b.txt", "x", sync=False)
    assert len(fsyncs) == 2


def test_sync_files_follows_the_setting(tmp_path, fsyncs, monkeypatch):
    paths = [tmp_path / f"{i}.txt" for i in range(3)]
    for p in paths:
        write_atomic(p, "x", sync=False)
    assert fsyncs == []
    monkeypatch.setenv(_files.SYNC_ENV, "off")
    sync_files(paths, tmp_path)
    assert fsyncs == []
    monkeypatch.setenv(_files.SYNC_ENV, "on")
    sync_files(paths, tmp_path)
    assert len(fsyncs) == 4  # each file, then the folder


def test_an_unknown_value_is_an_error_naming_the_variable_and_nothing_is_written(tmp_path, fsyncs, monkeypatch):
    monkeypatch.setenv(_files.SYNC_ENV, "0")
    target = tmp_path / "a.txt"
    target.write_text("old")
    with pytest.raises(ValueError, match=r"BACKENDCONF_FSYNC='0': use 'on' \(the default.*or 'off'"):
        write_atomic(target, "new")
    assert target.read_text() == "old"
    assert leftovers(tmp_path) == []


class Double(torch.nn.Module):
    def forward(self, x):
        return x * 2


@pytest.mark.parametrize("setting, syncs", [(None, 2), ("on", 2), ("off", 0)])
def test_save_follows_the_setting(tmp_path, fsyncs, monkeypatch, setting, syncs):
    if setting is not None:
        monkeypatch.setenv(_files.SYNC_ENV, setting)
    x = torch.randn(3)
    lowered = bc.to_backend(Double(), "reference", {"forward": {}}, example_inputs=(x,))
    path = tmp_path / "m.bcpt"
    bc.save(lowered, path)
    assert len(fsyncs) == syncs
    torch.testing.assert_close(bc.load(path)(x), x * 2)
    assert leftovers(tmp_path) == []
