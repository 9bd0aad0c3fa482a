"""Hang detection: a rank stuck while its process lives (a data loader or a read that never
returns, a deadlock, a collective its peers are not in) is found and named; the
node-loss policy (policy.py) takes it out.

Nothing else sees such a rank: its process runs, its sockets stay open, its node is
healthy; its peers wait in their next collective for the script's process-group timeout
(gloo's default 30 min) or, when it hangs outside a collective with nobody waiting on a
timeout, forever. So, beside torchrun:

- **Progress.** Each training process started warm counts its optimizer steps in a rank
  file (rankprobe.py: torch's public global step hook, nothing in the script); a script
  that follows the progress contract (`step=` lines) is counted too. A step of any local
  rank is progress of this pod.
- **The bound follows the job.** No progress for max(floor, multiple x the recent step
  time), where the step time is the median of the last intervals between two observed
  steps; before an attempt's second step (compilation, the first data, a restore) the
  first-step allowance instead. All three are chart values (`hangDetection`).
- **Where each rank waits.** At the bound this pod dumps every local rank's threads twice,
  STACK_GAP apart (faulthandler, through rankprobe's signal: no ptrace, nothing stopped),
  logs each rank's main stack, and reports per rank its steps, its stack, whether it is
  inside a collective (a frame of torch.distributed, DDP or autograd's backward) and
  whether it moves (its stack changed between the dumps, or it or its children read or
  wrote more than MOVING_BYTES, sockets included: a long checkpoint, an evaluation, a data
  loader's workers starting an epoch, a collective moving data) under
  <prefix>/hangs/<round>/<pod>.
- **The culprit** (`blame`), once every member of the round reported: nobody, if any rank
  moves; else the ranks behind the others' step; else those outside any collective while
  the others wait in one; else those whose stack differs from the others' (a collective
  the others are not in, a lock); else no single rank: the round restarts. Every pod
  computes the same verdict from the same reports; each acts for itself only.

What it cannot see: a script that starts cold (job.warmStart off, or not a python
command) and writes no `step=` lines has no progress here and is never judged; a rank
that spins (its stack changing) is taken for a slow one. The round's members come from
the silent-loss detection's keys (lossdetect.py), so this runs only beside it.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import re
import statistics
import threading
import time
from collections import Counter, deque
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Protocol

from elastic_worker import rankprobe, timings
from elastic_worker.attempt_line import Tail, process_alive
from elastic_worker.keystore import interface as kvstore
from elastic_worker.recovery.lossdetect import ALIVE, LEFT, MARKER, RoundAttempt

logger = logging.getLogger(__name__)

#: Frames of a rank that waits for its peers: torch.distributed's collectives (and FSDP's,
#: DTensor's), DDP's, and autograd's backward (where DDP's all-reduce waits).
COLLECTIVE_PATHS = ("/torch/distributed/", "/torch/nn/parallel/", "/torch/autograd/")
#: Bytes read or written between the two dumps that make a rank "moving" (a checkpoint, a
#: data load); a waiting rank's stray heartbeats stay far below it.
MOVING_BYTES = 1 << 20
#: Intervals between steps the recent step time is the median of.
STEP_HISTORY = 9
#: How this pod's log starts the lines of detail of a stall (each rank's stack, another
#: pod's culprit): in the pod's log, not events of a live view (localrun/lines.py).
DETAIL_PREFIXES = ("stack of rank ", "hang seen: ")


@dataclass(frozen=True)
class Bound:
    """The chart's `hangDetection`: no progress for max(floor, multiple x step time), or
    `first_step` before the step time is known."""

    multiple: float
    floor: float
    first_step: float

    def limit(self, step_time: float | None) -> float:
        return self.first_step if step_time is None else max(self.floor, self.multiple * step_time)


class Clock:
    """One attempt's progress on this pod: when it last stepped, and its recent step time."""

    def __init__(self, now: float) -> None:
        self.started = now
        self.last = now  # the last progress seen (the attempt's start before any)
        self._judged = now  # the last judgement: the next comes one bound after it
        self._counts: dict[str, int] = {}  # the highest count of each source seen
        self._steps = 0  # progress events seen
        self._intervals: deque[float] = deque(maxlen=STEP_HISTORY)

    def observe(self, counts: dict[str, int], now: float) -> bool:
        """`counts`: each source's count read now (a rank's steps, the script's `step=`);
        True when one went past what it was (a rank that appears at 0 has not stepped)."""
        steps = max((n - self._counts.get(source, 0) for source, n in counts.items()), default=0)
        for source, n in counts.items():
            self._counts[source] = max(n, self._counts.get(source, 0))
        if steps <= 0:
            return False
        if self._steps > 0:  # `steps` steps since the last seen: steps shorter than a poll
            self._intervals.extend([(now - self.last) / steps] * min(steps, STEP_HISTORY))
        self._steps += 1
        self.last = now
        return True

    def step_time(self) -> float | None:
        """The median interval between two steps seen; None before the second step."""
        return statistics.median(self._intervals) if self._intervals else None

    def stalled(self, now: float, bound: Bound) -> float | None:
        """Seconds without progress, when past the bound since the last progress or
        judgement; None otherwise."""
        if now - max(self.last, self._judged) <= bound.limit(self.step_time()):
            return None
        return now - self.last

    def judged(self, now: float) -> None:
        self._judged = now


# -- stacks --------------------------------------------------------------------------------

_THREAD = re.compile(r"^(?:Current thread|Thread) (0x[0-9a-fA-F]+)")
_FRAME = re.compile(r'^\s+File "(.*)", line (\d+) in (.*)$')


@dataclass(frozen=True)
class Frame:
    file: str
    line: int
    func: str

    def __str__(self) -> str:
        return f"{self.file}:{self.line} in {self.func}"


def threads(dump: str) -> dict[int, list[Frame]]:
    """faulthandler's dump: each thread's frames, most recent first."""
    out: dict[int, list[Frame]] = {}
    frames: list[Frame] | None = None
    for line in dump.splitlines():
        head = _THREAD.match(line)
        if head is not None:
            frames = out.setdefault(int(head.group(1), 16), [])
            continue
        frame = _FRAME.match(line)
        if frame is not None and frames is not None:
            frames.append(Frame(frame.group(1), int(frame.group(2)), frame.group(3)))
    return out


def in_collective(frames: list[Frame]) -> bool:
    return any(p in f.file for f in frames for p in COLLECTIVE_PATHS)


def script_frame(frames: list[Frame]) -> Frame | None:
    """The innermost frame of the script's own file: the file of the outermost `<module>`
    frame that is neither runpy's nor ours (under a warm child the server's come first)."""
    modules = [
        f
        for f in frames
        if f.func == "<module>"
        and "runpy" not in f.file
        and f"/{__package__.split('.')[0]}/" not in f.file
    ]
    if not modules:
        return frames[0] if frames else None
    script = modules[-1].file
    return next((f for f in frames if f.file == script), None)


def describe(frames: list[Frame]) -> str:
    """Where a main thread waits, in a few words: its innermost frame and the script's."""
    if not frames:
        return "no Python frame"
    top, own = frames[0], script_frame(frames)
    where = f"in {top.func} ({Path(top.file).name}:{top.line})"
    if own is not None and own != top:
        where += f", called from {Path(own.file).name}:{own.line} in {own.func}"
    return where


# -- the verdict ---------------------------------------------------------------------------


@dataclass(frozen=True)
class RankState:
    """One rank at a stall, as its pod reports it."""

    rank: int
    pod: str
    steps: int  # optimizer steps of this attempt (-1: not counted)
    stack: str  # its main thread's frames, one string: equal stacks wait at the same place
    where: str  # describe()'s words
    collective: bool
    moving: bool


@dataclass(frozen=True)
class Verdict:
    """`culprits` hold the round (empty: no single rank can be blamed, restart the round)."""

    culprits: tuple[RankState, ...]
    why: str

    @property
    def pods(self) -> set[str]:
        return {r.pod for r in self.culprits}


def blame(states: list[RankState]) -> Verdict | None:
    """Who holds a round whose every rank is in `states`; None: nobody (a rank moves)."""
    moving = [s for s in states if s.moving]
    if moving:
        return None
    counted = [s for s in states if s.steps >= 0]
    if counted:
        low = min(s.steps for s in counted)
        if low < max(s.steps for s in counted):
            behind = tuple(s for s in counted if s.steps == low)
            return Verdict(behind, f"behind the others' step ({low})")
    inside = [s for s in states if s.collective]
    outside = tuple(s for s in states if not s.collective)
    if inside and outside:
        return Verdict(outside, f"outside any collective while {len(inside)} rank(s) wait in one")
    places = Counter(s.stack for s in states).most_common()
    if len(places) > 1 and places[0][1] > places[1][1]:
        odd = tuple(s for s in states if s.stack != places[0][0])
        what = "inside a collective" if odd[0].collective else "waiting"
        return Verdict(odd, f"{what} where the other {places[0][1]} rank(s) are not")
    return Verdict((), "every rank waits at the same place: no single rank holds the round")


# -- the watch -----------------------------------------------------------------------------


class Listener(Protocol):
    """What the watch tells: the node-loss policy (policy.NodeLoss)."""

    def held(self) -> bool: ...

    def hung(self, attempt: RoundAttempt, verdict: Verdict, idle: float) -> None:
        """Every member of `attempt`'s round reported it stalled for `idle` s."""
        ...


class HangWatch:
    """Watches this pod's training processes for progress (rank files in `probe_dir`, the
    progress file's `step=` lines), and at a stall finds, with the round's other pods,
    who holds it. `current` gives the attempt that runs (lossdetect.LossDetector.current)."""

    def __init__(
        self,
        client: kvstore.KeyStore,
        key_prefix: str,
        pod: str,
        *,
        bound: Bound,
        probe_dir: Path,
        current: Callable[[], RoundAttempt | None],
        listener: Listener,
        progress_file: Path | None = None,
        poll: float = timings.HANG_POLL,
        stack_gap: float = timings.STACK_GAP,
        agree_for: float = timings.HANG_AGREE_FOR,
    ) -> None:
        self.client = client.with_timeout(timings.ROUND_REQUEST_TIMEOUT)
        self.prefix, self.pod, self.bound = key_prefix, pod, bound
        self.probe_dir, self.current, self.listener = probe_dir, current, listener
        self.poll, self.stack_gap, self.agree_for = poll, stack_gap, agree_for
        self._progress = Tail(progress_file) if progress_file is not None else None
        self._user_step: int | None = None
        self._attempt: RoundAttempt | None = None
        self._clock: Clock | None = None
        self._checks = 0  # stalls judged in this attempt
        self._reported: str | None = None  # this pod's report key, while it stands
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def key(self, round_: str, pod: str | None = None) -> str:
        return f"{self.prefix}/hangs/{round_}/{pod or self.pod}"

    def start(self) -> HangWatch:
        self._thread = threading.Thread(target=self._run, name="hang-watch", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=self.agree_for + 5)

    def _run(self) -> None:
        while not self._stop.wait(self.poll):
            try:
                self.check(time.monotonic())
            except Exception as exc:  # noqa: BLE001 - the watch must never end the worker
                logger.debug("hang watch: %s", exc)

    def _probes(self) -> list[rankprobe.Probe]:
        """This attempt's training processes (a file of an ended one is skipped)."""
        return [p for p in rankprobe.read(self.probe_dir) if process_alive(p.pid)]

    def _user_steps(self) -> int | None:
        if self._progress is not None:
            from elastic_worker.observe.metrics import parse_progress  # noqa: PLC0415

            steps = [s for s in map(parse_progress, self._progress.lines()) if s is not None]
            if steps:
                self._user_step = max(steps)
        return self._user_step

    def check(self, now: float) -> None:
        """One look: progress, and at the bound the judgement of the round."""
        attempt = self.current()
        user = self._user_steps()
        if attempt != self._attempt:
            self._attempt, self._checks = attempt, 0
            self._clock = Clock(now) if attempt is not None else None
        if attempt is None or self._clock is None:
            return
        probes = self._probes()
        if any(p.ended for p in probes):  # the script returned: teardown, exit barrier
            self._attempt = self._clock = None
            return
        counts = {f"rank {p.rank}": p.steps for p in probes}
        if user is not None:
            counts["step="] = user + 1  # a first `step=0` is a step
        if self._clock.observe(counts, now) and self._reported is not None:
            with contextlib.suppress(kvstore.EtcdError):  # it steps again: not part of a hang
                self.client.delete(self._reported)
            self._reported = None
        idle = self._clock.stalled(now, self.bound)
        if idle is None or self.listener.held():
            return
        self._checks += 1
        states = self.report(attempt, probes, idle)
        verdict = self.agree(attempt, states)
        if verdict is not None:
            self.listener.hung(attempt, verdict, idle)
        self._clock.judged(time.monotonic())  # the next judgement one more bound later

    def report(
        self, attempt: RoundAttempt, probes: list[rankprobe.Probe], idle: float
    ) -> list[RankState]:
        """Dump this pod's ranks twice, log each one's main stack, and publish the report."""
        before = {p.pid: _io_bytes(p.pid) for p in probes}
        first = self._dump(probes)
        self._stop.wait(self.stack_gap)
        second = self._dump(probes)
        states = []
        for probe in probes:
            frames = first.get(probe.local_rank, [])
            again = second.get(probe.local_rank, [])
            moved_bytes = _io_bytes(probe.pid) - before[probe.pid]
            stack = " < ".join(map(str, frames))
            state = RankState(
                probe.rank,
                self.pod,
                probe.steps,
                stack,
                describe(frames),
                in_collective(frames),
                moving=(bool(frames and again) and frames != again) or moved_bytes > MOVING_BYTES,
            )
            states.append(state)
            logger.warning(
                "%s%d (pid %d), no step for %.0f s: waits %s%s\n%s",
                DETAIL_PREFIXES[0],
                probe.rank,
                probe.pid,
                idle,
                state.where,
                " (it moves: slow, not hung)" if state.moving else "",
                "\n".join(f"  {f}" for f in frames) or "  (no dump)",
            )
        payload = json.dumps({"check": self._checks, "ranks": [asdict(s) for s in states]})
        self._reported = self.key(attempt.round)
        self.client.set(self._reported, payload, ttl=timings.HANG_REPORT_TTL)
        return states

    def _dump(self, probes: list[rankprobe.Probe]) -> dict[int, list[Frame]]:
        """Each rank's main-thread frames, from one dump of its threads (faulthandler
        writes it from the signal handler at once; read once it stopped growing)."""
        sizes = {}
        for probe in probes:
            sizes[probe.local_rank] = _size(rankprobe.stacks_path(self.probe_dir, probe.local_rank))
            with contextlib.suppress(ProcessLookupError):
                os.kill(probe.pid, rankprobe.STACK_SIGNAL)
        out: dict[int, list[Frame]] = {}
        seen: dict[int, int] = {}
        deadline = time.monotonic() + timings.STACK_WAIT
        while len(out) < len(probes) and time.monotonic() < deadline:
            time.sleep(0.02)
            for probe in probes:
                path = rankprobe.stacks_path(self.probe_dir, probe.local_rank)
                size = _size(path)
                if probe.local_rank in out or size == sizes[probe.local_rank]:
                    continue
                if seen.get(probe.local_rank) == size:
                    main = threads(_read_from(path, sizes[probe.local_rank])).get(probe.thread)
                    out[probe.local_rank] = main or []
                seen[probe.local_rank] = size
        return out

    def agree(self, attempt: RoundAttempt, mine: list[RankState]) -> Verdict | None:
        """The verdict once every alive member of the round has a stall report standing
        (a pod deletes its own when it steps again); None when one did not report within
        `agree_for` (it steps: the round is not hung). A member that reported and then left
        (the culprit's pod, faster than this one, stopped its processes) still counts: every
        pod judges the same reports, so a late pod names the same culprit, not a round of
        the ones left."""
        deadline = time.monotonic() + self.agree_for
        while not self._stop.is_set():
            members, left = self._members(attempt.round)
            reports: dict[str, list[RankState]] = {self.pod: mine}
            for entry in self.client.list_dir(f"{self.prefix}/hangs/{attempt.round}"):
                pod = entry.key.rsplit("/", 1)[-1]
                if pod == self.pod or entry.value is None:
                    continue
                with contextlib.suppress(ValueError, KeyError, TypeError):
                    body = json.loads(entry.value)
                    reports[pod] = [RankState(**r) for r in body["ranks"]]
            if members and members <= set(reports):
                judged = members | (left & set(reports))
                states = [s for pod in sorted(judged) for s in reports[pod]]
                return blame(states) if states else Verdict((), "no rank could be read")
            if time.monotonic() >= deadline:
                waiting = ", ".join(sorted(members - set(reports))) or "nobody"
                logger.info("no step for a while here, but %s did not stall: not a hang", waiting)
                return None
            self._stop.wait(self.poll)
        return None

    def _members(self, round_: str) -> tuple[set[str], set[str]]:
        """The round's members alive, and those that left it (lossdetect.py's keys)."""
        names = {
            e.key.rsplit("/", 1)[-1]: e.value
            for e in self.client.list_dir(f"{self.prefix}/rounds/{round_}")
            if not e.key.endswith("/" + MARKER)
        }
        return (
            {name for name, value in names.items() if value == ALIVE},
            {name for name, value in names.items() if value == LEFT},
        )


def _io_bytes(pid: int) -> int:
    """What the process and its children (a data loader's workers) read and wrote so far,
    sockets included; 0 for what /proc does not say."""
    total, todo, seen = 0, [pid], set()
    while todo:
        proc = todo.pop()
        if proc in seen:
            continue
        seen.add(proc)
        try:
            text = Path(f"/proc/{proc}/io").read_text()
        except OSError:
            continue
        fields = dict(line.split(": ", 1) for line in text.splitlines() if ": " in line)
        total += int(fields.get("rchar", 0)) + int(fields.get("wchar", 0))
        for task in Path(f"/proc/{proc}/task").glob("*/children"):
            with contextlib.suppress(OSError, ValueError):
                todo.extend(int(c) for c in task.read_text().split())
    return total


def _size(path: Path) -> int:
    try:
        return path.stat().st_size
    except OSError:
        return 0


def _read_from(path: Path, offset: int) -> str:
    try:
        with path.open("rb") as f:
            f.seek(offset)
            return f.read().decode(errors="replace")
    except OSError:
        return ""
