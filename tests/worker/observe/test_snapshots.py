"""observe/snapshots.py: the snapshot lines a script writes to the progress file
(docs/contracts.md, "Progress") and what the loss detection waits on."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest
from elastic_worker.observe import snapshots
from elastic_worker.observe.attempts import AttemptFollower


@pytest.mark.parametrize(
    ("line", "want"),
    [
        ("restored=12 source=peer-memory lost=1", snapshots.Restored(12, "peer-memory", 1)),
        ("restored=0 source=none lost=-", snapshots.Restored(0, "none", None)),
        ("saved=7 files=2 seconds=0.25", snapshots.Saved(7, 2, 0.25)),
        ("saved=- files=0 seconds=0.01", snapshots.Saved(None, 0, 0.01)),
        ("step=4", None),
        ("restored=3 source=somewhere lost=0", None),  # not a source we know: not counted
        ("restored=3 sou", None),  # torn
        ("saved=x files=1 seconds=0", None),
    ],
)
def test_parse(line: str, want: object) -> None:
    assert snapshots.parse(line) == want


def test_saves_wait_for_a_save_after_the_one_counted() -> None:
    saves = snapshots.Saves()
    saves.heard(snapshots.Restored(1, "none", None))
    assert saves.keeps and not saves.wait_saved(0, timeout=0.05)
    threading.Timer(0.05, saves.heard, (snapshots.Saved(1, 1, 0.1),)).start()
    assert saves.wait_saved(0, timeout=5)
    assert saves.last == snapshots.Saved(1, 1, 0.1)
    assert not saves.wait_saved(1, timeout=0.01)


def test_a_save_awaited_is_read_from_the_progress_file_without_waiting_for_the_reader(
    tmp_path: Path,
) -> None:
    """A silent loss SIGTERMs a training process that keeps snapshots and SIGKILLs it once
    its save is reported: the wait reads the progress file itself, so the save counts
    without waiting for the reader's next interval (here an hour)."""
    follower = AttemptFollower(None, interval=3600, progress_file=tmp_path / "progress")
    follower.start()
    try:
        with (tmp_path / "progress").open("a") as progress:
            progress.write("restored=3 source=local-memory lost=0\nsaved=4 files=1 seconds=0\n")
        assert follower.saves.wait_saved(0, timeout=30)
        assert follower.saves.keeps and follower.saves.last == snapshots.Saved(4, 1, 0.0)
    finally:
        follower.stop()
