"""tests/usercache.py: what the tests keep under ~/.cache/elastic-job (the user image's venv,
the release's wheels) is made once per key, and the entries of other keys go once unused
for a while, so that the cache holds what the checkout pins and not every pin it had."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest
import usercache


@pytest.fixture(autouse=True)
def cache_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    return tmp_path / "elastic-job"


def made(log: list[Path]):  # type: ignore[no-untyped-def]
    def make(work: Path) -> None:
        work.mkdir()
        (work / "data").write_text(work.name)
        log.append(work)

    return make


def age(entry: Path, seconds: float) -> None:
    """Last used `seconds` ago."""
    then = time.time() - seconds
    for path in (entry / usercache.STAMP, entry):
        if path.exists():
            os.utime(path, (then, then))


def test_an_entry_is_made_once_per_key_and_taken_whole(cache_home: Path) -> None:
    log: list[Path] = []
    first = usercache.entry("wheels", "release-1", made(log))
    again = usercache.entry("wheels", "release-1", made(log))
    assert first == again == cache_home / "wheels" / "release-1"
    assert len(log) == 1 and (first / "data").read_text() == ".release-1.tmp"
    assert sorted(p.name for p in first.parent.iterdir()) == [".lock", "release-1"]


def test_writing_a_key_prunes_the_other_keys_unused_for_a_day(cache_home: Path) -> None:
    log: list[Path] = []
    old = usercache.entry("user-images", "trainer-old", made(log))
    recent = usercache.entry("user-images", "trainer-recent", made(log))
    age(old, usercache.KEEP_UNUSED + 60)
    age(recent, 60)  # another checkout may be running with it now
    leftover = cache_home / "user-images" / ".trainer-killed.tmp"  # a maker that was killed
    leftover.mkdir()
    age(leftover, usercache.KEEP_UNUSED + 60)
    other_kind = usercache.entry("wheels", "release-1", made(log))
    age(other_kind, usercache.KEEP_UNUSED + 60)

    new = usercache.entry("user-images", "trainer-new", made(log))

    assert new.is_dir() and recent.is_dir() and other_kind.is_dir()
    assert not old.exists() and not leftover.exists()
    # Once the other key is a day unused, even taking (not writing) an entry prunes it.
    age(recent, usercache.KEEP_UNUSED + 60)
    assert usercache.entry("user-images", "trainer-new", made(log)) == new
    assert sorted(p.name for p in new.parent.iterdir()) == [".lock", "trainer-new"]
    assert len(log) == 4  # nothing was made twice


def test_taking_an_entry_marks_it_used(cache_home: Path) -> None:
    entry = usercache.entry("wheels", "release-1", made([]))
    age(entry, usercache.KEEP_UNUSED + 60)
    usercache.entry("wheels", "release-1", made([]))
    assert time.time() - (entry / usercache.STAMP).stat().st_mtime < 60
    assert usercache.prune(entry.parent, "release-2") == []


def test_a_failed_make_leaves_no_entry(cache_home: Path) -> None:
    def fail(work: Path) -> None:
        work.mkdir()
        raise RuntimeError("pip failed")

    with pytest.raises(RuntimeError):
        usercache.entry("wheels", "release-1", fail)
    assert not (cache_home / "wheels" / "release-1").exists()
    log: list[Path] = []
    assert (usercache.entry("wheels", "release-1", made(log)) / "data").is_file()
    assert len(log) == 1
