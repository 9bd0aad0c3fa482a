"""torchrun, supervised: started in its own session, signals passed on, the job's
completion watched while it runs, its exit turned into the pod's exit code.

Why a thin parent instead of exec: after torchrun exits 0 someone must mark the job
complete, and while torchrun runs someone must notice that the job completed elsewhere
(a spare waiting in the rendezvous, or an agent left behind). torchrun offers no hook
for either, so elastic-worker stays as PID 1, starts torchrun in its own session
(a terminal's Ctrl-C then reaches it once, through us), forwards SIGTERM, SIGINT,
SIGHUP and SIGQUIT to it, and exits with its code. torchrun itself forwards the signal
to the training processes and waits TORCH_ELASTIC_SHUTDOWN_TIMEOUT for them, which is
set below the pod's grace period so the whole tree ends before the kubelet's SIGKILL.
What each end means for the job is completion.py's; what a signal or a lost node means
for the round is the node-loss policy's (recovery/policy.py), told through `Hooks`. Once
its workers succeeded, torchrun waits in torch's exit barrier for the other nodes'
(ExitBarrier says for whom). A torchrun stuck waiting for a lost node of its round is
stopped with `relaunch()`, and torchruns.py launches another.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import subprocess
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Protocol

from elastic_worker import exits, timings
from elastic_worker.completion import Completion
from elastic_worker.launch import torchrun
from elastic_worker.launch.argv import shutdown_timeout
from elastic_worker.settings.config import Config

logger = logging.getLogger(__name__)

FORWARDED_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGQUIT)


def teardown_bound(exit_barrier_timeout: float) -> float:
    """Seconds a training process started warm may run after its script returned (warm/):
    half the exit barrier's timeout, so that a node whose process hangs in its teardown
    still reaches the barrier before the other nodes' timeout passes, and the job ends
    through it with every node finished."""
    return exit_barrier_timeout / 2


#: Who has not finished: pod names (sorted), or None when nobody can tell.
Unfinished = Callable[[], "list[str] | None"]


class Hooks(Protocol):
    """What the node-loss policy (recovery/policy.py) says about one torchrun."""

    def held(self) -> bool:
        """This pod must not act on the job (it may have been replaced): a signal then
        kills torchrun's group without a word to the round."""
        ...

    def replaced(self) -> bool:
        """A newer incarnation replaced this pod: torchrun's exit means nothing to the job."""
        ...

    def signalled(self, pid: int) -> None:
        """The pod was told to stop and torchrun `pid` has the signal."""
        ...

    def exited(self, pid: int) -> None:
        """torchrun `pid`, told to stop or relaunched, has exited."""
        ...


class ExitBarrier:
    """This node's torchrun after its workers succeeded: waiting in torch's exit barrier
    until the other nodes' have too (or `timeout`). torchrun tells when it entered
    (torchrun.py, `report`); once it has waited timings.EXIT_BARRIER_SAY s, this says so and whom
    it waits for (`unfinished`, the round's members whose processes still run), again
    when that changes (not when nobody is left: torch's barrier is then completing), and how
    it ended. `notify` hears the same (metrics, Events)."""

    def __init__(
        self,
        report: Path,
        timeout: float,
        unfinished: Unfinished | None = None,
        notify: Callable[[list[str] | None], None] | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.report = report
        self.timeout = timeout
        self.unfinished = unfinished
        self.notify = notify
        self.clock = clock
        self.entered: float | None = None  # when torchrun said its workers succeeded
        self.said: bool = False
        self.waiting_for: list[str] | None = None  # as last said
        self._next_ask = 0.0

    def poll(self) -> None:
        """One look, from the supervisor's loop while torchrun runs."""
        now = self.clock()
        if self.entered is None:
            try:
                if torchrun.SUCCEEDED not in self.report.read_text():
                    return
            except OSError:
                return
            self.entered = now
        if now - self.entered < timings.EXIT_BARRIER_SAY or now < self._next_ask:
            return
        self._next_ask = now + timings.EXIT_BARRIER_ASK
        names = self._ask()
        if names == [] or (self.said and names == self.waiting_for):
            return  # every other node has finished (torch's barrier is completing), or as said
        if not self.said:
            logger.info(
                "exit barrier: this node's training processes exited 0; waiting up to %g s for: %s",
                self.timeout,
                _whom(names),
            )
        elif names:
            logger.info("exit barrier: still waiting for: %s", _whom(names))
        self.said, self.waiting_for = True, names
        if self.notify is not None:
            self.notify(names)

    def _ask(self) -> list[str] | None:
        if self.unfinished is None:
            return None
        try:
            return self.unfinished()
        except Exception as exc:  # noqa: BLE001 - a view only: never the training's end
            logger.debug("who has not finished: %s", exc)
            return None

    def ended(self, returncode: int = 0) -> None:
        """torchrun has exited (`returncode`): how long it waited, when it was said to wait."""
        if not self.said or self.entered is None:
            return
        waited = self.clock() - self.entered
        if returncode != 0:  # stopped in it (a signal: the job completed elsewhere)
            logger.info("exit barrier: left after %.1f s: torchrun stopped", waited)
        elif waited >= self.timeout:
            logger.info(
                "exit barrier: left after %.1f s, its timeout; had not finished: %s",
                waited,
                _whom(self.waiting_for),
            )
        else:
            logger.info("exit barrier: left after %.1f s; every node had finished", waited)


def _whom(names: list[str] | None) -> str:
    if names is None:
        return "the other nodes (which: unknown without rendezvous.lossDetection)"
    return ", ".join(names)


class Supervisor:
    """Runs torchrun, forwards signals, watches the completion marker; `hooks` hears what
    the node-loss policy must know (None: nothing)."""

    def __init__(
        self,
        argv: Sequence[str],
        env: Mapping[str, str],
        config: Config,
        completion: Completion,
        *,
        completion_poll: float = timings.COMPLETION_POLL,
        completion_grace: float = timings.COMPLETION_GRACE,
        hooks: Hooks | None = None,
        exit_barrier: ExitBarrier | None = None,
    ) -> None:
        self.argv = list(argv)
        # torchrun's wait for the other nodes once its workers succeeded (argv's report)
        self.exit_barrier = exit_barrier
        self.env = dict(env)
        self.config = config
        self.completion = completion
        self.completion_poll = completion_poll
        self.completion_grace = completion_grace
        self.hooks = hooks
        self.proc: subprocess.Popen[bytes] | None = None
        self.signalled: int | None = None
        #: when relaunch() stopped this torchrun (time.monotonic()); the pod launches another
        self.relaunched: float | None = None
        self._lock = threading.Lock()

    def forward(self, signum: int) -> None:
        """Called from the signal handler: pass the signal on to torchrun."""
        with self._lock:
            self.signalled = signum
            proc = self.proc
        if proc is not None and proc.poll() is None:
            if self.hooks is not None and self.hooks.held():
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGKILL)
                return
            logger.info("forwarding %s to torchrun (pid %d)", signal.Signals(signum).name, proc.pid)
            with contextlib.suppress(ProcessLookupError):
                os.kill(proc.pid, signum)
            if self.hooks is not None:
                self.hooks.signalled(proc.pid)

    def relaunch(self, reason: str) -> bool:
        """Stop this torchrun so that the pod launches another in the same rendezvous: it is
        stuck in a round that lost a node (`reason`). SIGTERM: torch ends its agent without
        closing the rendezvous (launch_agent: a signal), and its node leaves the round as at
        any SIGTERM (`hooks`), so the next round forms at once. False, and nothing done,
        when the pod is stopping or torchrun has ended."""
        with self._lock:
            proc = self.proc
            if self.signalled is not None or self.relaunched is not None or proc is None:
                return False
            if proc.poll() is not None:
                return False
            self.relaunched = time.monotonic()
        logger.warning("torchrun (pid %d) is stuck: %s: launching it again", proc.pid, reason)
        with contextlib.suppress(ProcessLookupError):
            os.kill(proc.pid, signal.SIGTERM)
        if self.hooks is not None:
            self.hooks.signalled(proc.pid)
        return True

    def _stop_torchrun(self) -> None:
        assert self.proc is not None
        wait = shutdown_timeout(self.config.grace_period) + 5
        logger.info("job is complete: stopping torchrun (pid %d)", self.proc.pid)
        try:
            os.kill(self.proc.pid, signal.SIGTERM)
            self.proc.wait(wait)
        except ProcessLookupError:
            pass
        except subprocess.TimeoutExpired:
            logger.warning("torchrun did not stop within %d s: killing it", wait)
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(10)

    def run(self) -> int:
        with self._lock:
            self.proc = subprocess.Popen(self.argv, env=self.env, start_new_session=True)
            pending = self.signalled
        if pending is not None:
            self.forward(pending)
        proc = self.proc
        complete_since: float | None = None
        next_check = time.monotonic() + self.completion_poll
        killed = False  # after relaunch(), once torchrun outlived RELAUNCH_GRACE
        while True:
            try:
                returncode = proc.wait(timeout=0.5)
                break
            except subprocess.TimeoutExpired:
                pass
            now = time.monotonic()
            if self.exit_barrier is not None:
                self.exit_barrier.poll()
            relaunched = self.relaunched
            if relaunched is not None and now - relaunched >= timings.RELAUNCH_GRACE and not killed:
                killed = True
                logger.warning(
                    "torchrun did not stop within %g s: killing it", timings.RELAUNCH_GRACE
                )
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGKILL)
            if complete_since is None and now >= next_check and self.signalled is None:
                next_check = now + self.completion_poll
                if self.completion.while_running():
                    complete_since = now
                    logger.info(
                        "job %s completed elsewhere while %s: torchrun has %g s to end",
                        self.config.job_id,
                        "this node waits in the exit barrier"
                        if self.exit_barrier is not None and self.exit_barrier.entered
                        else "this node's training processes still run",
                        self.completion_grace,
                    )
            if complete_since is not None and now - complete_since >= self.completion_grace:
                self._stop_torchrun()
                return 0
        if self.exit_barrier is not None:
            self.exit_barrier.ended(returncode)
        return self._after_exit(returncode, complete_since is not None)

    def _after_exit(self, returncode: int, seen_complete: bool) -> int:
        if self.hooks is not None and self.hooks.replaced():
            return exits.from_returncode(returncode)  # nothing of the job's to do
        if returncode == 0:
            self.completion.after_success()
            return 0
        code = exits.from_returncode(returncode)
        if self.relaunched is not None and self.signalled is None:
            logger.info("torchrun stopped (exit %d): launching another", returncode)
            if self.hooks is not None and self.proc is not None:
                self.hooks.exited(self.proc.pid)
            return code
        if self.signalled is None:
            return self.completion.after_failure(code, seen_complete)
        name = signal.Signals(self.signalled).name
        # The first pod to finish scales the StatefulSets to 0, so pods that are still
        # leaving get SIGTERM; the job is done, and so are they: exit 0.
        if self.completion.after_signal():
            logger.info(
                "torchrun exited with %d after %s; job %s is complete: exit 0",
                code,
                name,
                self.config.job_id,
            )
            return 0
        logger.info("torchrun exited with %d after %s", code, name)
        if self.hooks is not None and self.proc is not None:
            self.hooks.exited(self.proc.pid)
        return code
