"""Mountpoints on the host: kept while any run uses them, removed by the last run."""

from __future__ import annotations

from pathlib import Path

import pytest

from localrun.host import mountpoints


def test_mountpoints_are_kept_while_used_and_removed_by_the_last_run(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(mountpoints, "STATE_DIR", tmp_path / "state")
    target = tmp_path / "etc" / "inject"
    mp = mountpoints.Mountpoints()
    mp.ensure(str(target))
    assert target.is_dir()
    # another tool removing "its" directory cannot: the keeper file holds it
    with pytest.raises(OSError):
        target.rmdir()
    mp.release_all()
    assert not target.exists()
    assert not (tmp_path / "etc").exists()  # every directory the run created is gone


def test_existing_mountpoints_are_left_in_place(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(mountpoints, "STATE_DIR", tmp_path / "state")
    target = tmp_path / "shm"
    target.mkdir()
    (target / "data").write_text("x")
    mp = mountpoints.Mountpoints()
    mp.ensure(str(target))
    mp.release_all()
    assert (target / "data").read_text() == "x"
    assert [p.name for p in target.iterdir()] == ["data"]
