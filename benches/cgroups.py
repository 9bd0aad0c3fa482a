"""A cgroup of the bench's own, to run a measured process under a CPU or memory limit as
Kubernetes would impose it (root; cgroup v2, else v1)."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence
from pathlib import Path

#: (hierarchy, the limit's file, its value, the file a process joins by): one candidate.
Candidate = tuple[Path, str, str, str]


@contextlib.contextmanager
def own_cgroup(name: str, candidates: Sequence[Candidate]) -> Iterator[Path | None]:
    """A cgroup `name` with its limit set, under the first hierarchy that lets us make one;
    yields the file a process writes its pid to (None: no writable hierarchy here), and
    removes the cgroup afterwards."""
    for hierarchy, knob, value, procs in candidates:
        if not hierarchy.is_dir() or not (hierarchy / "cgroup.procs").exists():
            continue
        path = hierarchy / name
        try:
            path.mkdir()
        except OSError:
            continue
        try:
            (path / knob).write_text(value)
            yield path / procs
            return
        finally:
            with contextlib.suppress(OSError):
                path.rmdir()
    yield None


def joined(procs: Path, cmd: list[str]) -> list[str]:
    """`cmd` run so that it joins the cgroup first, then execs: all of it counts."""
    return ["/bin/sh", "-c", 'echo $$ > "$0" && exec "$@"', str(procs), *cmd]
