"""The attempt line (docs/contracts.md, "The attempt line"): written by the attempt shim,
the `sh -c` script torchrun runs in front of the user's program, and read back from
ELASTIC_ATTEMPT_LOG, with the process it names, by observe/attempts.py (metrics),
recovery/lossdetect.py (silent-loss detection) and recovery/lifelines/ (a new round).
The writer and the reader are both here; nothing here needs prometheus-client.
"""

from __future__ import annotations

import shlex
import tempfile
from dataclasses import dataclass
from pathlib import Path

ATTEMPT_LOG_ENV = "ELASTIC_ATTEMPT_LOG"

# Run by torchrun for every worker process of every attempt, with torchrun's documented
# worker environment (pinned by tests/worker/test_attempt_line.py): local rank 0 writes
# one line (docs/contracts.md, "The attempt line") to stderr and, when the worker serves
# metrics, appends it with its PID to ELASTIC_ATTEMPT_LOG (read below); then the shell execs
# the program, which keeps the PID torchrun started (so $$ is the program's PID), its
# signals, exit code, output and environment. No shell variable is assigned: one the user
# exported would reach the program changed. A failed append never stops the program.
# The PID is written `${$}`, not `$$`: torchrun passes each argument through its
# `${local_rank}` macro substitution (string.Template), which turns `$$` into `$`.
_ATTEMPT_FORMAT = (
    "[elastic-worker] attempt run_id=%s restart=%s group_rank=%s nodes=%s world_size=%s"
)
_ATTEMPT_ARGS = (
    '"${TORCHELASTIC_RUN_ID:-}" "${TORCHELASTIC_RESTART_COUNT:-}" '
    '"${GROUP_RANK:-}" "$(( ${WORLD_SIZE:-0} / ${LOCAL_WORLD_SIZE:-1} ))" "${WORLD_SIZE:-}"'
)
ATTEMPT_LINE = (
    'if [ "${LOCAL_RANK:-}" = 0 ]; then '
    f"printf '{_ATTEMPT_FORMAT}\\n' {_ATTEMPT_ARGS} >&2; "
    'if [ -n "${ELASTIC_ATTEMPT_LOG:-}" ]; then '
    f"printf '{_ATTEMPT_FORMAT} pid=%s\\n' {_ATTEMPT_ARGS} \"${{$}}\" "
    '2>/dev/null >>"$ELASTIC_ATTEMPT_LOG" || :; fi; fi; '
)
ATTEMPT_ARGV0 = "elastic-worker-attempt"


def attempt_script(pwd: str | None) -> str:
    """The shim's script. `pwd` is PWD in torchrun's environment (None: unset): the shell
    sets PWD to its working directory when it is unset or stale, so the script puts back
    what the program would have inherited from torchrun."""
    restore = "unset PWD; " if pwd is None else f"PWD={shlex.quote(pwd)}; "
    return ATTEMPT_LINE + restore + 'exec "$@"'


@dataclass(frozen=True)
class AttemptLine:
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


def parse_attempt(line: str) -> AttemptLine | None:
    """The fields of an attempt line; None for anything else (a torn or foreign line)."""
    if not line.startswith(ATTEMPT_PREFIX):
        return None
    fields = dict(part.split("=", 1) for part in line[len(ATTEMPT_PREFIX) :].split() if "=" in part)
    try:
        return AttemptLine(
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
