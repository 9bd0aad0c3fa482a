"""A container's log file as the kubelet keeps it here, and what the log endpoint reads.

One file per pod name and container (`logs/<pod>/<container>.log`), kept across restarts
and incarnations: the kubelet writes a start line before every start (`start_line`), so the
file splits into one segment per container run. `kubectl logs` shows the current run's
segment of the current incarnation; `--previous` the one before it, in the same pod.
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

_START = re.compile(
    r"^==== elastic-local: (?P<container>\S+) start \(pod incarnation (?P<inc>\d+), "
    r"restarts (?P<restarts>\d+)\) at [0-9:]+ ====$"
)


def start_line(container: str, incarnation: int, restarts: int, clock: str) -> str:
    """The line written before each start of a container (`clock` is HH:MM:SS)."""
    return (
        f"==== elastic-local: {container} start (pod incarnation {incarnation}, "
        f"restarts {restarts}) at {clock} ====\n"
    )


@dataclass(frozen=True)
class Segment:
    incarnation: int
    restarts: int
    text: str


def segments(data: str) -> list[Segment]:
    """The runs of a log file, in order (lines before any start line are dropped)."""
    out: list[Segment] = []
    cur: tuple[int, int] | None = None
    lines: list[str] = []
    for line in data.splitlines(keepends=True):
        m = _START.match(line.rstrip("\n"))
        if m:
            if cur is not None:
                out.append(Segment(cur[0], cur[1], "".join(lines)))
            cur, lines = (int(m["inc"]), int(m["restarts"])), []
        elif cur is not None:
            lines.append(line)
    if cur is not None:
        out.append(Segment(cur[0], cur[1], "".join(lines)))
    return out


class NoLog(Exception):
    """No such run to show; the message is the real server's."""


def read(path: Path, incarnation: int, previous: bool) -> tuple[str, int]:
    """The text of the current (or previous) run of `incarnation`, and the byte offset in
    the file where the current run's text ends (to follow from)."""
    try:
        data = path.read_bytes().decode("utf-8", "replace")
    except FileNotFoundError:
        data = ""
    runs = [s for s in segments(data) if s.incarnation == incarnation]
    if previous:
        if len(runs) < 2:
            raise NoLog("previous terminated container not found")
        return runs[-2].text, len(data.encode())
    return (runs[-1].text if runs else ""), len(data.encode())


def follow(
    path: Path,
    offset: int,
    *,
    running: Callable[[], bool],
    stopped: Callable[[], bool],
    poll: float = 0.2,
) -> Iterator[str]:
    """Text appended after `offset`, until a new run starts (its start line), the container
    stops running, or `stopped()`; as `kubectl logs -f` ends when its container ends."""
    partial = b""
    last = False
    while not stopped():
        try:
            with path.open("rb") as fh:
                fh.seek(offset)
                data = fh.read()
        except FileNotFoundError:
            data = b""
        offset += len(data)
        chunks = (partial + data).split(b"\n")
        partial = chunks.pop()
        for chunk in chunks:
            line = chunk.decode("utf-8", "replace")
            if _START.match(line):
                return
            yield line + "\n"
        if last:
            return
        if not data:
            # One more read after the container stopped: what it wrote last is shown.
            last = not running()
            if not last:
                time.sleep(poll)
