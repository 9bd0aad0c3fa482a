"""What the library tells people and the worker.

- Lines on stderr, `[elastic-snapshot] ...`, from local rank 0 only (one per node), and
  warnings from any rank.
- The progress contract (docs/contracts.md, "Progress"): when ELASTIC_PROGRESS_FILE is set
  (elastic-worker sets it for the training processes), local rank 0 appends one line after
  each restore and one after each save:

      restored=<step> source=<peer-memory|local-memory|checkpoint|none> lost=<steps|->
      saved=<step|-> files=<n> seconds=<s>

  `restored` is the step every rank loaded, `source` where this node's state came from
  (another node's memory, this node's memory, the shared checkpoint, or nothing: a first
  start), `lost` the newest step completed before the re-form minus `restored` (`-` when
  unknown). A `restored` line also says that this attempt keeps snapshots; `saved` that
  its save is done (`-`: it had no consistent state to save), so the worker may stop it
  now. Neither line has a `step=` word: a worker that predates them ignores them.
  A failed write costs the report, never the training.
"""

from __future__ import annotations

import contextlib
import os
import sys

PROGRESS_FILE_ENV = "ELASTIC_PROGRESS_FILE"
SOURCES = ("peer-memory", "local-memory", "checkpoint", "none")


def is_local_leader() -> bool:
    return os.environ.get("LOCAL_RANK", "0") == "0"


def say(message: str) -> None:
    if is_local_leader():
        warn(message)


def warn(message: str) -> None:
    # os.write: one line at once, also from the signal thread while the main thread may
    # hold sys.stderr's lock.
    with contextlib.suppress(OSError, ValueError):
        os.write(sys.stderr.fileno(), f"[elastic-snapshot] {message}\n".encode())


def size(nbytes: float) -> str:
    """`nbytes` for a line: 128 B, 12.3 kB, 5.2 MB, 1.24 GB."""
    for unit, scale in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if nbytes >= scale:
            return f"{nbytes / scale:.{2 if unit == 'GB' else 1}f} {unit}"
    return f"{nbytes:.0f} B"


def duration(seconds: float) -> str:
    """`seconds` for a line: 0.4 ms, 12.3 ms, 1.25 s."""
    return f"{seconds * 1e3:.1f} ms" if seconds < 1 else f"{seconds:.2f} s"


def restored_line(step: int, source: str, lost: int | None) -> str:
    if source not in SOURCES:
        raise ValueError(f"source {source!r} is not one of {', '.join(SOURCES)}")
    return f"restored={step} source={source} lost={'-' if lost is None else lost}"


def saved_line(step: int | None, files: int, seconds: float) -> str:
    return f"saved={'-' if step is None else step} files={files} seconds={seconds:.3f}"


def progress(line: str) -> None:
    path = os.environ.get(PROGRESS_FILE_ENV)
    if not path or not is_local_leader():
        return
    try:
        with open(path, "a") as f:
            f.write(line + "\n")
    except OSError:
        pass
