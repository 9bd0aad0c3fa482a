"""What a pod does when the job loses a node: every signal, and the action it leads to.

`RULES` below is the table, one row per signal: who sees it, what stops the action, the
action, and the method that carries it out. docs/recovery.md's table is rendered from it
(tests/worker/recovery/test_policy.py checks both, and each row's behaviour). The rest of
this module is the wiring: `NodeLoss` starts the detectors of the pod (silent-loss
detection, this incarnation's fence, the reclaim of dead nodes' pods, the lifeline
server), `TorchrunWatch` those of one torchrun (lifelines to its round's peers, the
stuck-round watch); both hear every signal and act on it here, through the mechanisms of
the modules named in the table. A change to what the pod does at a loss starts here.

The end of the job has its own table (completion.py): whatever the row, nothing is done to
the round once the job is complete.
"""

from __future__ import annotations

import contextlib
import logging
import shutil
import socket
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from enum import Enum
from pathlib import Path
from types import TracebackType
from typing import TYPE_CHECKING

from elastic_worker import completion as completions
from elastic_worker import rankprobe, timings
from elastic_worker.attempt_line import Tail, ensure_log
from elastic_worker.completion import Completion
from elastic_worker.gate.members import Registration
from elastic_worker.keystore import interface as kvstore
from elastic_worker.observe import events
from elastic_worker.observe.attempts import PROGRESS_FILE_ENV
from elastic_worker.recovery import generations, hangs, lossdetect, reclaim
from elastic_worker.recovery import round as rounds
from elastic_worker.recovery.fence import Fence
from elastic_worker.recovery.lifelines import helper
from elastic_worker.recovery.lifelines import server as lifeline_server
from elastic_worker.recovery.lifelines.client import LifelineWatcher
from elastic_worker.recovery.lifelines.messages import HelperError
from elastic_worker.recovery.lossdetect import RoundAttempt
from elastic_worker.recovery.stuckround import StuckRoundWatch
from elastic_worker.settings.config import Config
from elastic_worker.torchcompat import RdzvNode

if TYPE_CHECKING:
    from elastic_worker.launch.supervisor import Supervisor
    from elastic_worker.observe import snapshots
    from elastic_worker.observe.metrics import Tracker

logger = logging.getLogger(__name__)

#: torchruns in a row relaunched as stuck without training before the pod leaves the
#: failure to the kubelet: a decision that keeps misfiring must not loop here.
MAX_STUCK = 5
#: Generations one elastic-worker process opens before it leaves the failure to the
#: kubelet (restart with back-off): a script that fails every time must not loop here.
MAX_REOPENS = 3


@dataclass(frozen=True)
class Rule:
    """One row of the table: `signal`, seen by `seen_by`; unless `unless`, `action`,
    carried out by `method` (NodeLoss's or TorchrunWatch's)."""

    signal: str
    seen_by: str
    unless: str
    action: str
    method: str


RULES: tuple[Rule, ...] = (
    Rule(
        "a peer's lifeline closed and its torchrun is gone (refused, or another answers)",
        "lifelines/client.py",
        "this pod is held (fence)",
        "take its node out of the round at once; PeerGone; its pod watched for reclaim",
        "TorchrunWatch.peer_gone",
    ),
    Rule(
        "a peer's round key lapsed (a silent loss: link cut, frozen node)",
        "lossdetect.py",
        "this pod is held; the job is complete",
        "stop this pod's attempt (a script that keeps snapshots saves first), so that "
        "torchrun re-forms without the peer; the elected survivor watches its pod for reclaim",
        "NodeLoss.peers_lapsed",
    ),
    Rule(
        "this pod's round key went unrefreshed for its TTL (this pod frozen or cut off)",
        "lossdetect.py",
        "",
        "hold torchrun and ask who this pod is (fence.py): replaced, fenced; this pod, go on",
        "NodeLoss.own_key_stale",
    ),
    Rule(
        "this pod's round key lapsed while the round went on",
        "lossdetect.py",
        "this pod was replaced",
        "stop this pod's attempt, so that it rejoins at the next re-form",
        "NodeLoss.own_key_lapsed",
    ),
    Rule(
        "this pod's member key holds another incarnation's UID",
        "gate/members.py",
        "",
        "fenced: torchrun killed, nothing more done to the job until the kubelet stops the pod",
        "NodeLoss.replaced_by",
    ),
    Rule(
        "SIGTERM to the pod (spot reclaim, scale-down, deletion)",
        "main.py (launch/supervisor.py forwards it)",
        "this pod is held (torchrun killed, no word); the job is complete (no leave)",
        "torchrun stops its workers (they checkpoint); this node leaves the round at once, "
        "and again once torchrun exited",
        "TorchrunWatch.signalled",
    ),
    Rule(
        "torchrun waits for a node that left its just-completed round",
        "stuckround.py",
        f"this pod is held; {MAX_STUCK} relaunches in a row without training; the backend "
        "is etcd-lease (its store stops waiting itself)",
        "stop torchrun (its node leaves the round) and launch another in the same rendezvous; "
        "TorchrunRelaunched",
        "TorchrunWatch.stuck_round",
    ),
    Rule(
        "no rank of the round stepped for the hang bound (a rank hangs while alive)",
        "hangs.py",
        "this pod is held; the job is complete; a rank moves (its stack changes, it reads "
        "or writes); a member of the round still steps",
        "the culprit's pod stops its training processes, as at a silent loss (the others' "
        "collectives fail, torchrun re-forms); no single culprit: every pod does; RankHung "
        "or RoundHung",
        "NodeLoss.hung",
    ),
    Rule(
        "torch closed the rendezvous though the job is not complete",
        "generations.py, after torchrun failed",
        f"torchrun was signalled or succeeded; {MAX_REOPENS} generations opened already",
        "join the next generation (a fresh rendezvous id); RendezvousReopened",
        "NodeLoss.after_torchrun",
    ),
    Rule(
        "a lost peer's node has been NotReady for nodeLoss.reclaim.afterSeconds",
        "reclaim.py",
        "this pod is held; the job is complete; the peer's pod changed meanwhile",
        "force-delete its pod (preconditions on UID and resourceVersion); PeerReclaimed",
        "NodeLoss.may_reclaim",
    ),
    Rule(
        "a lost peer is seen alive in a round again",
        "lossdetect.py",
        "",
        "stop watching its pod",
        "NodeLoss.peers_alive",
    ),
)


class After(Enum):
    """What follows a torchrun's exit (NodeLoss.after_torchrun)."""

    END = "end"  # the pod's exit code is torchrun's
    REPLACED = "replaced"  # out of the job until the kubelet stops the pod
    RELAUNCH = "relaunch"  # another torchrun in the same rendezvous
    NEXT_GENERATION = "next generation"  # another torchrun in a fresh rendezvous


class NodeLoss:
    """The node-loss policy of one pod, and the detectors it runs while torchrun does.

    A context manager: entering starts the fence, the reclaim of dead nodes' pods
    (nodeLoss.reclaim), the silent-loss detection (rendezvous.lossDetection, which sets the
    attempt log in `env`) and this pod's lifeline (rendezvous.lifeline, when this torch has
    what taking a node out needs: `internals`); leaving stops them. `watch(rdzv_id)` is the
    part of one torchrun."""

    def __init__(
        self,
        config: Config,
        completion: Completion,
        *,
        torchrun_pid: Callable[[], int | None],
        registration: Registration | None = None,
        recorder: events.Recorder | None = None,
        replaced: threading.Event | None = None,
        internals: bool = True,
        tracker: Tracker | None = None,
    ) -> None:
        self.config = config
        self.completion = completion
        self.client: kvstore.KeyStore = completion.client
        self.registration = registration
        self.recorder = recorder if recorder is not None else events.Recorder.disabled()
        self.internals = internals
        self.tracker = tracker
        self.fence = Fence(config, self.client, registration, torchrun_pid, fenced=replaced)
        self.reclaimer: reclaim.Reclaimer | None = None
        self.detector: lossdetect.LossDetector | None = None
        self.hangs: hangs.HangWatch | None = None
        self.lifeline: lifeline_server.LifelineServer | None = None
        #: the attempt log the lifelines follow (None: no lifelines)
        self.attempt_log: Path | None = None
        self._stack = contextlib.ExitStack()
        self._stuck = 0  # relaunches in a row of torchruns that did not train
        self._trained = False  # the last torchrun relaunched as stuck had trained first
        self._reopened = 0  # generations this process opened

    # -- the pod's detectors -------------------------------------------------------------

    def start(
        self, env: dict[str, str], local_addr: str | None, *, saves: snapshots.Saves | None
    ) -> NodeLoss:
        """Start the pod's detectors for torchrun run with `env` (its attempt log set there);
        `saves`: what the progress file says of the script's snapshots."""
        cfg, stack = self.config, self._stack
        if self.registration is not None:
            self.registration.on_replaced = self.replaced_by
            self.registration.fenced = self.fence.fenced.is_set
        self.reclaimer = reclaim.start(cfg, self.may_reclaim, self.recorder)
        if self.reclaimer is not None:
            stack.callback(self.reclaimer.stop)
        if cfg.loss_detection:
            log, own_dir = ensure_log(env, "elastic-liveness-")
            if own_dir is not None:
                stack.callback(shutil.rmtree, own_dir, ignore_errors=True)
            detector = self.detect(log, saves=saves, stop_grace=lossdetect.stop_grace(cfg, env))
            if cfg.hang_detection:
                self.watch_hangs(env, detector)
        if self.internals:
            self.lifeline = lifeline_server.serve(cfg, local_addr, self.fence.torchrun)
        if self.lifeline is not None:
            stack.callback(self.lifeline.stop)
            self.attempt_log, own_dir = ensure_log(env, "elastic-lifeline-")
            if own_dir is not None:
                stack.callback(shutil.rmtree, own_dir, ignore_errors=True)
        return self

    def detect(
        self, attempt_log: Path, *, saves: snapshots.Saves | None = None, stop_grace: float
    ) -> lossdetect.LossDetector:
        """Start the silent-loss detection of the attempts `attempt_log` names, telling this
        policy (also for a bench or a test that runs it alone)."""
        detector = lossdetect.LossDetector(
            self.client,
            self.config,
            attempt_log,
            listener=self,
            saves=saves,
            stop_grace=stop_grace,
        )
        detector.replaced = self.fence.fenced.is_set
        self.detector = detector
        detector.start()
        self._stack.callback(detector.stop)
        return detector

    def watch_hangs(self, env: dict[str, str], detector: lossdetect.LossDetector) -> None:
        """Start the hang watch of the attempts `detector` follows; the training processes
        get its probe directory through `env` (rankprobe.py)."""
        cfg = self.config
        probe_dir = Path(tempfile.mkdtemp(prefix="elastic-probe-"))
        self._stack.callback(shutil.rmtree, probe_dir, ignore_errors=True)
        env[rankprobe.PROBE_DIR_ENV] = str(probe_dir)
        progress = env.get(PROGRESS_FILE_ENV)
        self.hangs = hangs.HangWatch(
            self.client,
            cfg.key_prefix,
            cfg.pod_name,
            bound=hangs.Bound(cfg.hang_multiple, cfg.hang_floor, cfg.hang_first_step),
            probe_dir=probe_dir,
            current=detector.current,
            listener=self,
            progress_file=Path(progress) if progress else None,
        ).start()
        self._stack.callback(self.hangs.stop)

    def __enter__(self) -> NodeLoss:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self._stack.close()

    def unfinished(self) -> list[str] | None:
        """Who of this pod's last round has not finished (None: nobody can tell)."""
        return self.detector.unfinished() if self.detector is not None else None

    def held(self) -> bool:
        """This pod must not act on the job now: replaced, or held while it asks."""
        return self.fence.holding

    def replaced(self) -> bool:
        return self.fence.fenced.is_set()

    # -- the rows the pod's detectors report ---------------------------------------------

    def peers_lapsed(self, attempt: RoundAttempt, lapsed: list[str], survivors: set[str]) -> None:
        if self.held() or self._complete():
            return
        assert self.detector is not None
        self.detector.stop_attempt(
            attempt,
            f"{', '.join(lapsed)} of round {attempt.round} stopped renewing its key for "
            f"{self.detector.ttl} s (link cut, frozen or gone)",
        )
        if self.reclaimer is not None:
            self.reclaimer.lapsed(lapsed, survivors)

    def own_key_stale(self, why: str) -> bool:
        return self.fence.suspect(why)

    def own_key_lapsed(self, attempt: RoundAttempt, why: str) -> None:
        if not self.fence.suspect(why):
            return
        assert self.detector is not None
        self.detector.stop_attempt(attempt, why)

    def hung(self, attempt: RoundAttempt, verdict: hangs.Verdict, idle: float) -> None:
        if self.held() or self._complete():
            return
        assert self.detector is not None
        found = f"no rank of round {attempt.round} stepped for {idle:.0f} s"
        if not verdict.culprits:
            why = f"{found}; {verdict.why}: restarting the round"
            self.recorder.record(events.ROUND_HUNG, why)
            self._hang_action(metrics_action="restarted-round")
            self.detector.stop_attempt(attempt, why, cause="hang")
            return
        named = "; ".join(f"rank {r.rank} of {r.pod} waits {r.where}" for r in verdict.culprits)
        if self.config.pod_name not in verdict.pods:
            logger.warning(
                "%s%s: %s, %s: its pod stops it",
                hangs.DETAIL_PREFIXES[1],
                found,
                named,
                verdict.why,
            )
            threading.Thread(
                target=self._unless_reformed, args=(attempt, found), name="hang", daemon=True
            ).start()
            return
        mine = [r for r in verdict.culprits if r.pod == self.config.pod_name]
        ranks = ", ".join(str(r.rank) for r in mine)
        why = (
            f"{found}: rank {ranks} hung, {verdict.why} ({named}): stopping this pod's "
            "training processes so that the round re-forms"
        )
        self.recorder.record(events.RANK_HUNG, why)
        self._hang_action(metrics_action="took-out")
        self.detector.stop_attempt(attempt, why, cause="hang")

    def _unless_reformed(self, attempt: RoundAttempt, found: str) -> None:
        """The culprit's processes normally end at once and this pod's attempt with them;
        one that cannot be killed (blocked in the kernel: a hung mount) keeps its sockets
        open, and this pod then stops its own attempt so that the round re-forms without it."""
        detector = self.detector
        assert detector is not None
        deadline = time.monotonic() + timings.HANG_TAKEOUT_GRACE
        while time.monotonic() < deadline:
            if detector.current() != attempt:
                return
            time.sleep(timings.HANG_POLL)
        if not self.held() and detector.current() == attempt:
            detector.stop_attempt(
                attempt, f"{found}, and the culprit's processes did not end", cause="hang"
            )

    def _hang_action(self, *, metrics_action: str) -> None:
        if self.tracker is not None:
            self.tracker.hung(metrics_action)

    def replaced_by(self, uid: str) -> None:
        self.fence.replaced(uid)

    def may_reclaim(self) -> bool:
        return not self.held() and not self.completion.known()

    def peers_alive(self, names: set[str]) -> None:
        if self.reclaimer is not None:
            self.reclaimer.alive(names)

    def _complete(self) -> bool:
        reader = self.client.with_timeout(timings.ROUND_REQUEST_TIMEOUT)
        return completions.complete_now(reader, self.config)

    # -- one torchrun ----------------------------------------------------------------------

    def watch(self, rdzv_id: str, local_addr: str | None, warm_socket: str | None) -> TorchrunWatch:
        """The policy's part of the torchrun about to run in `rdzv_id`."""
        return TorchrunWatch(self, rdzv_id, local_addr, warm_socket)

    def after_torchrun(
        self, code: int, supervisor: Supervisor, generation: int
    ) -> tuple[After, int]:
        """What follows the exit (`code`) of `supervisor`'s torchrun in `generation`, and
        the generation the next one runs in."""
        if self.replaced():
            return After.REPLACED, generation
        if code != 0 and supervisor.relaunched is not None and supervisor.signalled is None:
            self._stuck = 0 if self._trained else self._stuck + 1
            return (After.RELAUNCH if self._stuck <= MAX_STUCK else After.END), generation
        if code == 0 or supervisor.signalled is not None or self._reopened >= MAX_REOPENS:
            return After.END, generation
        closed = generations.run_id(self.config, generation)
        if not generations.closed_early(self.config, closed):
            return After.END, generation
        self._reopened += 1
        generation = generations.advance(self.client, self.config, generation)
        joining = generations.run_id(self.config, generation)
        logger.warning(
            "rendezvous %s was closed before the job completed (an agent failed, e.g. while "
            "etcd was away): joining rendezvous %s",
            closed,
            joining,
        )
        self.recorder.record(
            events.RENDEZVOUS_REOPENED,
            f"rendezvous {closed} was closed before the job completed: joining {joining}",
            job=True,
        )
        return After.NEXT_GENERATION, generation


class TorchrunWatch:
    """The policy for one torchrun in `rdzv_id`: the supervisor's hooks (launch/supervisor.py,
    Hooks) and, while it runs (`running`), lifelines to its round's peers and the
    stuck-round watch, when this pod holds lifelines."""

    def __init__(
        self, policy: NodeLoss, rdzv_id: str, local_addr: str | None, warm_socket: str | None
    ) -> None:
        self.policy = policy
        self.rdzv_id = rdzv_id
        self.addr = local_addr or socket.getfqdn()
        self.local_addr = local_addr
        self.warm_socket = warm_socket
        self.supervisor: Supervisor | None = None
        #: The round's operations, shared by the lifelines, the stuck-round watch and the
        #: leave at a signal (None: no lifelines; a leave then runs here, importing torch).
        self.ops: rounds.RoundOps | None = None
        self.lifelines: LifelineWatcher | None = None  # while it runs
        self._leaving: threading.Thread | None = None

    def own(self) -> RdzvNode | None:
        pid = self.policy.fence.torchrun()
        return None if pid is None else (self.addr, pid)

    @contextlib.contextmanager
    def running(self, supervisor: Supervisor | None) -> Iterator[None]:
        """Lifelines and the stuck-round watch while `supervisor`'s torchrun runs (None: a
        torchrun run by someone else, as in a bench: the lifelines only)."""
        self.supervisor = supervisor
        log = self.policy.attempt_log
        if log is None:
            yield
            return
        cfg = self.policy.config
        self.ops = ops = helper.ops_for(cfg, self.rdzv_id, self.warm_socket, self.own)
        stuck = None
        # etcd-lease's store stops a wait itself once its round lost a member
        # (torch_etcd_v3.rounds): no torchrun waits there for a gone node.
        if supervisor is not None and not rounds.in_own_keys(cfg):
            stuck = StuckRoundWatch(self.own, ops.round, log, self.stuck_round).start()
        tail = Tail(log)
        self.lifelines = watcher = LifelineWatcher(
            self.own,
            cfg.lifeline_port,
            ops.participants,
            self.peer_gone,
            lambda: bool(tail.lines()),
        ).start()
        try:
            yield
        finally:
            watcher.stop()
            if stuck is not None:
                stuck.stop()
            ops.close()

    # -- the rows of one torchrun --------------------------------------------------------

    def peer_gone(self, node: RdzvNode, since: float) -> bool:
        """`node`'s lifeline closed at `since` (time.time()) and its torchrun is gone."""
        if self.policy.held() or self.ops is None:
            return False
        if not self.ops.remove(node, since):
            return False
        self.policy.recorder.record(
            events.PEER_GONE,
            f"the torchrun of {node[0]} (pid {node[1]}) is gone (its lifeline closed): took "
            f"its node out of rendezvous {self.rdzv_id}",
        )
        registration, reclaimer = self.policy.registration, self.policy.reclaimer
        if reclaimer is not None and registration is not None:
            peer = registration.member_at(node[0])
            if peer is not None:
                reclaimer.lost(peer.name, None, peer.uid or None)
        return True

    def stuck_round(self, reason: str, trained: bool) -> None:
        self.policy._trained = trained
        if self.policy.held() or self.supervisor is None:
            return
        if self.supervisor.relaunch(reason):
            self.policy.recorder.record(
                events.TORCHRUN_RELAUNCHED,
                f"torchrun was stuck assigning worker ranks: {reason}: launched it again in "
                f"rendezvous {self.rdzv_id}",
            )

    # -- launch/supervisor.py's Hooks ----------------------------------------------------

    def held(self) -> bool:
        return self.policy.held()

    def replaced(self) -> bool:
        return self.policy.replaced()

    def signalled(self, pid: int) -> None:
        """Leave the round while the workers still checkpoint, not after torchrun exits: the
        survivors, whose workers fail when these exit, then find the round free at their
        first look. Never at the end of the job: every pod is told to stop then."""
        if not self.policy.internals or self._leaving is not None or self.held():
            return

        def leave() -> None:
            if self.policy.completion.before_leave():
                logger.info("job %s is complete: this node stays in its round", self.rdzv_id)
            elif not self._leave(pid):
                # Said, so that a round that waited for this node's keep-alive can be told
                # from one this node left (docs/recovery.md, SIGTERM).
                logger.info(
                    "at the signal, torchrun %s:%d was in no list of rendezvous %s",
                    self.addr,
                    pid,
                    self.rdzv_id,
                )

        thread = threading.Thread(target=leave, name="leave", daemon=True)
        thread.start()
        # Set once started: exited(), on the supervisor's other thread, joins it.
        self._leaving = thread

    def exited(self, pid: int) -> None:
        """Once more after torchrun is gone: a join it had in flight at the signal may have
        put the node back (normally it is not there any more: one read)."""
        if not self.policy.internals or self.held():
            return
        if self._leaving is not None:
            self._leaving.join(timings.TAKE_OUT_TIMEOUT)
        self._leave(pid)

    def _leave(self, pid: int) -> bool:
        """True when this call took the node out (the take-out said so in the log)."""
        ops, started = self.ops, False
        if ops is None and self.warm_socket is not None:
            # No lifelines, so no round's operations running: a helper forked from the warm
            # server now (torch imported there) leaves in well under a second, where
            # importing torch here took longer than the workers' checkpoint on a loaded CI.
            ops, started = helper.ops_for(self.policy.config, self.rdzv_id, self.warm_socket), True
        try:
            if ops is not None:
                with contextlib.suppress(HelperError):
                    return ops.leave((self.addr, pid))
                logger.info("leaving through the lifelines' helper failed: here instead")
            return rounds.leave(self.policy.config, self.rdzv_id, self.local_addr, pid)
        finally:
            if started and ops is not None:
                ops.close()
