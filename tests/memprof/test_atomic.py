"""One atomic writer: the old file or the complete new one, never half of one, and no temporary left."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from memprof.atomic import atomic_path, write_atomically


def _names(directory: Path) -> list[str]:
    return sorted(p.name for p in directory.iterdir())  # hidden temporary files included


def test_write_creates_and_replaces(tmp_path):
    target = tmp_path / "meta.json"
    assert write_atomically(target, "first ünïcode\n") == target
    assert target.read_text(encoding="utf-8") == "first ünïcode\n"
    write_atomically(str(target), b"\x00second", durable=True)
    assert target.read_bytes() == b"\x00second"
    write_atomically(target, memoryview(b"third"))
    assert target.read_bytes() == b"third" and _names(tmp_path) == ["meta.json"]


def test_the_temporary_path_is_hidden_beside_the_target(tmp_path):
    target = tmp_path / "part-000001.parquet"
    with atomic_path(target) as temporary:
        assert temporary.parent == tmp_path and temporary.name.startswith(".part-000001.parquet.")
        assert not temporary.exists() and not target.exists()
        temporary.write_bytes(b"data")
    assert target.read_bytes() == b"data" and _names(tmp_path) == [target.name]


def test_a_failure_keeps_the_old_file_and_leaves_no_temporary(tmp_path):
    target = tmp_path / "schedule.json"
    target.write_text("old")
    with pytest.raises(RuntimeError, match="half way"), atomic_path(target) as temporary:
        temporary.write_text("half a new fi")
        raise RuntimeError("half way")
    assert target.read_text() == "old" and _names(tmp_path) == ["schedule.json"]

    with pytest.raises(TypeError):
        write_atomically(target, 12345)  # type: ignore[arg-type]  # fails after the file was opened
    assert target.read_text() == "old" and _names(tmp_path) == ["schedule.json"]


def test_a_failed_rename_keeps_the_old_file_and_leaves_no_temporary(tmp_path, monkeypatch):
    target = tmp_path / "schedule.json"
    target.write_text("old")

    def disk_gone(source, destination):
        raise OSError(5, os.strerror(5))

    monkeypatch.setattr("memprof.atomic.os.replace", disk_gone)
    with pytest.raises(OSError, match="Input/output error"):
        write_atomically(target, "new")
    monkeypatch.undo()
    assert target.read_text() == "old" and _names(tmp_path) == ["schedule.json"]


def test_a_caller_that_writes_nothing_fails_cleanly(tmp_path):
    target = tmp_path / "lib.so"
    with pytest.raises(FileNotFoundError), atomic_path(target):
        pass
    assert _names(tmp_path) == []


def test_an_existing_files_mode_is_kept(tmp_path):
    target = tmp_path / "apply_schedule.py"
    target.write_text("old")
    target.chmod(0o750)
    write_atomically(target, "new")
    assert target.read_text() == "new" and (target.stat().st_mode & 0o7777) == 0o750


def test_a_new_file_keeps_the_mode_it_was_made_with(tmp_path):
    umask = os.umask(0o022)
    try:
        write_atomically(tmp_path / "new.json", "{}")
        with atomic_path(tmp_path / "tool") as temporary:
            temporary.write_text("#!/bin/sh\n")
            temporary.chmod(0o755)  # as a compiler makes a shared library
    finally:
        os.umask(umask)
    assert ((tmp_path / "new.json").stat().st_mode & 0o777) == 0o644
    assert ((tmp_path / "tool").stat().st_mode & 0o777) == 0o755


def test_a_missing_directory_is_an_os_error(tmp_path):
    with pytest.raises(FileNotFoundError):
        write_atomically(tmp_path / "missing" / "x.json", "{}")
    assert _names(tmp_path) == []
