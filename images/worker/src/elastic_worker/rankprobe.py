"""A training process's probe, for the hang watch (recovery/hangs.py): its optimizer steps,
counted without the script's help, and a stack of each of its threads on demand, taken
without stopping it. Installed by a warm child before the user's script runs
(warm/child.py); read by the worker. The format lives here, beside both ends.

In ELASTIC_PROBE_DIR (a private directory of the worker's), per training process:

    rank-<LOCAL_RANK>    one line, rewritten in place after each optimizer step:
                         pid=<pid> rank=<RANK> thread=<main thread id> steps=<n>
    stacks-<LOCAL_RANK>  faulthandler's dump of every thread, appended at each STACK_SIGNAL
    ended-<LOCAL_RANK>   made once the script has returned (or raised): what follows is
                         its teardown and torch's exit barrier, not training

Steps come from torch's public global hook, torch.optim.optimizer.
register_optimizer_step_post_hook (in its __all__ since torch 2.0): every script that
steps a torch.optim optimizer (its subclasses too: DeepSpeed's, apex's) is counted, with
nothing of ours in it. A script that updates its weights without one is not (the
progress file's `step=` lines still are). The stacks are faulthandler's: C-level, so they
come while the main thread is blocked in a collective, a read or a lock, with no ptrace.

Standard library only: this runs in the user's interpreter, and torch is reached through
sys.modules (the warm server imported it).
"""

from __future__ import annotations

import contextlib
import faulthandler
import os
import signal
import sys
import threading
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

PROBE_DIR_ENV = "ELASTIC_PROBE_DIR"
#: A real-time signal: no default user (SIGUSR1/2 are taken by some launchers and
#: frameworks), and sent only to a process whose rank file says the probe is installed
#: (its default action would end any other).
STACK_SIGNAL = signal.SIGRTMIN + 3
_STEPS_WIDTH = 20  # the counter's field, padded so that a rewrite never leaves a tail

#: The open files and the hook's handle, for the process's life.
_KEPT: list[Any] = []
#: The file `ended` makes (empty: no probe installed).
_ENDED: list[Path] = []


def install(env: Mapping[str, str]) -> bool:
    """Install the probe in this training process (torchrun's worker environment gives
    RANK and LOCAL_RANK); False, doing nothing, without a probe directory or on a
    failure (the job then runs unwatched, never stopped by it)."""
    directory, local, rank = env.get(PROBE_DIR_ENV), env.get("LOCAL_RANK"), env.get("RANK")
    if not directory or not local or not rank or not (local.isdigit() and rank.isdigit()):
        return False
    try:
        Path(directory, f"ended-{local}").unlink(missing_ok=True)  # a process before this one's
        stacks: IO[str] = open(Path(directory, f"stacks-{local}"), "w")  # noqa: SIM115 - kept
        fd = os.open(Path(directory, f"rank-{local}"), os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    except OSError:
        return False
    _KEPT.extend((stacks, fd))
    _ENDED.append(Path(directory, f"ended-{local}"))
    head = f"pid={os.getpid()} rank={rank} thread={threading.main_thread().ident} steps="

    def write(steps: int) -> None:
        with contextlib.suppress(OSError):  # a full disk must not fail a step
            os.pwrite(fd, f"{head}{steps:<{_STEPS_WIDTH}}\n".encode(), 0)

    count = [0]

    def stepped(_optimizer: object, _args: object, _kwargs: object) -> None:
        count[0] += 1
        write(count[0])

    faulthandler.register(STACK_SIGNAL, file=stacks, all_threads=True, chain=False)
    write(0)
    optim: Any = sys.modules.get("torch.optim.optimizer")
    hook = getattr(optim, "register_optimizer_step_post_hook", None)
    if hook is not None:
        _KEPT.append(hook(stepped))
    return True


def ended() -> None:
    """The script has returned: say so (nothing without a probe)."""
    for path in _ENDED:
        with contextlib.suppress(OSError):
            path.touch()


@dataclass(frozen=True)
class Probe:
    """What one training process's rank file said."""

    local_rank: int
    pid: int
    rank: int
    thread: int
    steps: int
    ended: bool  # its script has returned


def read(directory: Path) -> list[Probe]:
    """The rank files of `directory` (a torn or half-written one skipped: read again at
    the next poll)."""
    probes = []
    for path in sorted(directory.glob("rank-*")):
        try:
            local = int(path.name.removeprefix("rank-"))
            fields = dict(w.split("=", 1) for w in path.read_text().split() if "=" in w)
            probes.append(
                Probe(
                    local,
                    int(fields["pid"]),
                    int(fields["rank"]),
                    int(fields["thread"]),
                    int(fields["steps"]),
                    directory.joinpath(f"ended-{local}").exists(),
                )
            )
        except (OSError, ValueError, KeyError):
            continue
    return probes


def stacks_path(directory: Path, local_rank: int) -> Path:
    return directory / f"stacks-{local_rank}"
