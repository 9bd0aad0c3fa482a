"""What the tests make once and keep under the user's cache, ~/.cache/elastic-job/KIND/KEY
(XDG_CACHE_HOME honoured): one entry per key (a pinned version, a digest of what the entry is
made from), made by one process at a time, and the kind's entries of other keys removed, so
that the cache holds what the checkout pins and not every pin it ever had.

An entry of another key is kept while it was used within KEEP_UNUSED: the checkouts of one
machine (each helper's worktree, CI's fresh clone) share the cache and may pin different keys
at the same time; one must not delete the venv another is running."""

from __future__ import annotations

import fcntl
import os
import shutil
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

#: A finished entry holds this file; its mtime is the entry's last use.
STAMP = ".complete"
#: Seconds an entry of another key outlives its last use (see the module's docstring).
KEEP_UNUSED = 24 * 3600.0


def kind_dir(kind: str) -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "elastic-job" / kind


@contextmanager
def _locked(root: Path) -> Iterator[None]:
    root.mkdir(parents=True, exist_ok=True)
    with open(root / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        yield


def prune(root: Path, keep: str, *, now: float | None = None) -> list[Path]:
    """Remove `root`'s entries other than `keep` unused for KEEP_UNUSED, and work dirs
    (`.NAME.tmp`) a killed maker left; what was removed. Call it holding the lock."""
    now = time.time() if now is None else now
    removed = []
    for entry in sorted(root.iterdir()) if root.is_dir() else []:
        if entry.name in (keep, ".lock") or not entry.is_dir():
            continue
        stamp = entry / STAMP
        used = (stamp if stamp.exists() else entry).stat().st_mtime
        if now - used > KEEP_UNUSED:
            shutil.rmtree(entry, ignore_errors=True)
            removed.append(entry)
    return removed


def entry(
    kind: str,
    key: str,
    make: Callable[[Path], None],
    *,
    moved: Callable[[Path, Path], None] | None = None,
) -> Path:
    """KIND/KEY, made by `make(work_dir)` when missing (in a work dir then renamed into
    place, `moved(work_dir, entry)` then fixing what names the work dir, so a half-made
    entry is never taken; one maker at a time, the others wait); marked used; the kind's
    stale entries pruned."""
    root = kind_dir(kind)
    dest = root / key
    stamp = dest / STAMP
    if stamp.exists():
        stamp.touch()
        if len(os.listdir(root)) <= 2:  # this entry and .lock: nothing to prune
            return dest
    with _locked(root):
        if not stamp.exists():
            work = root / f".{key}.tmp"
            shutil.rmtree(work, ignore_errors=True)
            make(work)
            shutil.rmtree(dest, ignore_errors=True)
            work.rename(dest)
            if moved is not None:
                moved(work, dest)
            (dest / STAMP).touch()
        prune(root, key)
    return dest
