"""The attempt line (docs/contracts.md, "The attempt line") as the attempt shim appends
it to ELASTIC_ATTEMPT_LOG, and the process it names. Read by follow.py (metrics) and
liveness.py (silent-loss detection) and lifeline.py; nothing here needs prometheus-client.
"""

from __future__ import annotations

import tempfile
from dataclasses import dataclass
from pathlib import Path

ATTEMPT_LOG_ENV = "ELASTIC_ATTEMPT_LOG"


@dataclass(frozen=True)
class Attempt:
    """One attempt line (docs/contracts.md), as the shim appends it to ELASTIC_ATTEMPT_LOG."""

    run_id: str
    restart: int
    group_rank: int
    nodes: int
    world_size: int
    pid: int


ATTEMPT_PREFIX = "[elastic-worker] attempt "


def ensure_log(env: dict[str, str], prefix: str) -> tuple[Path, Path | None]:
    """The attempt log of torchrun run with `env`, set there when nobody did yet (every
    reader reads the same file), and the directory made for it (None: not ours)."""
    if env.get(ATTEMPT_LOG_ENV):
        return Path(env[ATTEMPT_LOG_ENV]), None
    own_dir = Path(tempfile.mkdtemp(prefix=prefix))
    env[ATTEMPT_LOG_ENV] = str(own_dir / "attempts")
    return Path(env[ATTEMPT_LOG_ENV]), own_dir


def parse_attempt(line: str) -> Attempt | None:
    """The fields of an attempt line; None for anything else (a torn or foreign line)."""
    if not line.startswith(ATTEMPT_PREFIX):
        return None
    fields = dict(part.split("=", 1) for part in line[len(ATTEMPT_PREFIX) :].split() if "=" in part)
    try:
        return Attempt(
            run_id=fields["run_id"],
            restart=int(fields["restart"]),
            group_rank=int(fields["group_rank"]),
            nodes=int(fields["nodes"]),
            world_size=int(fields["world_size"]),
            pid=int(fields["pid"]),
        )
    except (KeyError, ValueError):
        return None


def process_alive(pid: int) -> bool:
    """True while `pid` runs (a zombie, not yet reaped by torchrun, has ended)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    # The state is the first field after the parenthesised command, which may hold spaces.
    return stat[stat.rfind(")") + 2 :][:1] not in {"Z", "X", ""}


class Tail:
    """The complete lines appended to a file since the last call."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.offset = 0
        self.partial = b""

    def lines(self) -> list[str]:
        try:
            with self.path.open("rb") as fh:
                fh.seek(self.offset)
                data = fh.read()
        except FileNotFoundError:
            return []
        self.offset += len(data)
        chunks = (self.partial + data).split(b"\n")
        self.partial = chunks.pop()
        return [c.decode("utf-8", "replace") for c in chunks]
