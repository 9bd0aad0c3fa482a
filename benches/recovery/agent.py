"""One torchrun agent of a bench job: its output lines, stamped with this process's
monotonic clock as they are read, and what they say (train.py's steps, the phases of a
recovery)."""

from __future__ import annotations

import re
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

#: train.py's line for each step it has done (images/worker/examples/train.py).
STEP = re.compile(r"\[train\] step=(\d+) world_size=(\d+) restart=(\d+)")
ROUND_COMPLETE = "Rendezvous complete for workers"  # torchrun's log line (LOGLEVEL=INFO)
#: The phases of a recovery, each the first line after the loss that holds its needle.
PHASES = {
    "up": "Starting elastic_operator",  # torchrun has imported torch
    "failed": "Worker group FAILED",
    "rendezvous": ROUND_COMPLETE,
    "resumed": "[train] resumed step=",
}

#: (stamp, step, world size, restart) of one step line.
StepLine = tuple[float, int, int, int]


@dataclass
class Agent:
    name: str
    proc: subprocess.Popen[str]
    lines: list[tuple[float, str]] = field(default_factory=list)
    #: Where a line goes when torchrun completes a round and starts its workers, as
    #: elastic-worker's attempt shim appends one when a worker starts (lifelines read it).
    attempt_log: Path | None = None

    def pump(self, log: Path) -> None:
        assert self.proc.stdout is not None
        with log.open("w") as out:
            for line in self.proc.stdout:
                self.lines.append((time.monotonic(), line.rstrip("\n")))
                out.write(line)
                out.flush()
                if self.attempt_log is not None and ROUND_COMPLETE in line:
                    with self.attempt_log.open("a") as attempts:
                        attempts.write("attempt\n")

    def phases(self, since: float, world: int) -> dict[str, float]:
        """Seconds from `since` to torchrun up (a node started after `since`), the first
        failure seen, the re-formed round, the new process's checkpoint loaded (process
        group joined, DDP built), and the first step at world size `world` (a step printed
        before the failure is seen is the old world's)."""
        found: dict[str, float] = {}
        for stamp, line in list(self.lines):
            for name, needle in PHASES.items():
                if stamp >= since and name not in found and needle in line:
                    found[name] = round(stamp - since, 1)
        steps = [s for s in self.steps(since) if s[2] == world]
        if steps:
            found["step"] = round(steps[0][0] - since, 1)
        return found

    def steps(self, since: float = 0.0) -> list[StepLine]:
        found = []
        for stamp, line in list(self.lines):
            match = STEP.search(line)
            if match and stamp >= since:
                found.append((stamp, int(match[1]), int(match[2]), int(match[3])))
        return found


def wait_training(agents: list[Agent], world: int, seconds: float) -> bool:
    """Until each agent has printed 10 steps at world size `world`."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if all(sum(1 for s in a.steps() if s[2] == world) >= 10 for a in agents):
            return True
        time.sleep(0.2)
    return False
