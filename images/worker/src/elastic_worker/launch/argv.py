"""Build torchrun's command line and environment (pure functions), then supervise it.

Why a thin parent instead of exec: after torchrun exits 0 someone must mark the job
complete, and while torchrun runs someone must notice that the job completed elsewhere
(a spare waiting in the rendezvous, or an agent left behind). torchrun offers no hook
for either, so elastic-worker stays as PID 1, starts torchrun in its own session
(a terminal's Ctrl-C then reaches it once, through us), forwards SIGTERM, SIGINT,
SIGHUP and SIGQUIT to it, and exits with its code. torchrun itself forwards the signal
to the training processes and waits TORCH_ELASTIC_SHUTDOWN_TIMEOUT for them, which is
set below the pod's grace period so the whole tree ends before the kubelet's SIGKILL.
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
import shlex
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Mapping, Sequence

from elastic_worker import completion, exits
from elastic_worker.gate.netif import Choice
from elastic_worker.keystore import interface as kvstore
from elastic_worker.recovery import leave
from elastic_worker.recovery.lifelines import client as lifeline
from elastic_worker.settings.config import Config
from elastic_worker.warm import server as warm

logger = logging.getLogger(__name__)

_PYTHON = re.compile(r"python(\d+(\.\d+)?)?")
FORWARDED_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGQUIT)
COMPLETION_POLL = 2.0  # seconds between checks of the marker while torchrun runs
COMPLETION_GRACE = 15.0  # torchrun's time to end by itself once the job is complete
COMPLETION_WAIT = 15.0  # after a failed torchrun: how long to wait for the marker
# After a SIGTERM: how long to keep asking etcd, then the API, whether the job completed
# (at the end both may be going away at once; well inside the pod's grace period).
STOPPED_ASK = 10.0
LEAVE_ASK = 2.0  # seconds for the completion read before a leave at the signal


def shutdown_timeout(grace_period: int) -> int:
    """Seconds torchrun gives its workers after SIGTERM: the pod's grace period minus a
    margin (2-10 s) for torchrun and this process to exit before the kubelet's SIGKILL."""
    margin = min(10, max(2, grace_period // 6))
    return max(1, grace_period - margin)


# Run by torchrun for every worker process of every attempt, with torchrun's documented
# worker environment (pinned by tests/worker/test_worker_attempt.py): local rank 0 writes
# one line (docs/contracts.md, "The attempt line") to stderr and, when the worker serves
# metrics, appends it with its PID to ELASTIC_ATTEMPT_LOG (follow.py); then the shell execs
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


def program_argv(command: Sequence[str], python: str) -> list[str]:
    """The argv torchrun itself would give the user's program (torch.distributed.run:
    `python -u` in front of a script or `-m module`), so that wrapping it in the attempt
    shim changes nothing the program sees.

    `python script.py a` -> `PY -u script.py a`; `python -m pkg a` -> `PY -u -m pkg a`;
    `script.py a` -> `PY -u script.py a`; anything else (a binary, `python -u x.py`)
    -> the command as given.
    """
    cmd = list(command)
    if not cmd:
        raise ValueError("empty command")
    if _PYTHON.fullmatch(os.path.basename(cmd[0])):
        rest = cmd[1:]
        if len(rest) >= 2 and rest[0] == "-m":
            return [python, "-u", *rest]
        if rest and not rest[0].startswith("-"):
            return [python, "-u", *rest]
        return cmd
    if cmd[0].endswith(".py"):
        return [python, "-u", *cmd]
    return cmd


def attempt_script(pwd: str | None) -> str:
    """The shim's script. `pwd` is PWD in torchrun's environment (None: unset): the shell
    sets PWD to its working directory when it is unset or stale, so the script puts back
    what the program would have inherited from torchrun."""
    restore = "unset PWD; " if pwd is None else f"PWD={shlex.quote(pwd)}; "
    return ATTEMPT_LINE + restore + 'exec "$@"'


def command_args(
    command: Sequence[str], python: str, pwd: str | None = None, warm_socket: str | None = None
) -> list[str]:
    """torchrun's trailing arguments: the attempt shim in front of the program, started
    warm through `warm_socket` when given and the program is a python one (warm.py)."""
    shim = ["sh", "-c", attempt_script(pwd), ATTEMPT_ARGV0]
    program = program_argv(command, python)
    if warm_socket is not None:
        program = warm.warm_command(program, python, warm_socket) or program
    return ["--no-python", *shim, *program]


def rdzv_conf_arg(pairs: Sequence[tuple[str, str]]) -> str:
    return ",".join(f"{key}={value}" for key, value in pairs)


def local_address(config: Config, choice: Choice | None, mesh: bool) -> str | None:
    """What the other nodes use to reach this one (rank 0's store, MASTER_ADDR).

    ELASTIC_LOCAL_ADDR, else the mesh interface's address when the mesh was chosen,
    else POD_IP, else the chosen interface's address; None lets torchrun use the FQDN.
    """
    if config.local_addr:
        return config.local_addr
    if mesh and choice is not None and choice.address:
        return choice.address
    if config.pod_ip:
        return config.pod_ip
    return choice.address if choice is not None and choice.address else None


def build_argv(
    config: Config,
    local_addr: str | None,
    python: str = sys.executable,
    *,
    rdzv_id: str | None = None,
    pwd: str | None = None,
    warm_socket: str | None = None,
) -> list[str]:
    """torchrun's command line; `rdzv_id` defaults to the job id (epoch 0, epoch.py),
    `pwd` is PWD in torchrun's environment (attempt_script), `warm_socket` the warm
    server's (warm.py), if one runs."""
    argv = [
        python,
        "-m",
        "torch.distributed.run",
        f"--rdzv-backend={config.rdzv_backend}",
        f"--rdzv-endpoint={config.endpoint}",
        f"--rdzv-id={rdzv_id or config.job_id}",
        f"--nnodes={config.min_nodes}:{config.max_nodes}",
        f"--nproc-per-node={config.nproc_per_node}",
        f"--max-restarts={config.max_restarts}",
        f"--monitor-interval={config.monitor_interval:g}",
    ]
    if config.rdzv_conf:
        argv.append(f"--rdzv-conf={rdzv_conf_arg(config.rdzv_conf)}")
    if local_addr:
        argv.append(f"--local-addr={local_addr}")
    return argv + command_args(config.command, python, pwd, warm_socket)


def build_env(
    config: Config, choice: Choice | None, base: Mapping[str, str]
) -> tuple[dict[str, str], dict[str, str]]:
    """torchrun's environment and the subset this function added (for the log)."""
    added: dict[str, str] = {}

    def default(name: str, value: str) -> None:
        if not base.get(name):
            added[name] = value

    if choice is not None:
        default("NCCL_SOCKET_IFNAME", choice.nccl)
        default("GLOO_SOCKET_IFNAME", choice.gloo)
    default("TORCH_ELASTIC_SHUTDOWN_TIMEOUT", str(shutdown_timeout(config.grace_period)))
    # Recovery (docs/recovery.md): with the agent's shared TCPStore, restarted workers
    # read the previous attempt's gloo addresses (connection refused) and a survivor
    # keeps the dead rank 0's store address (init_process_group hangs). Off: each
    # round's rank 0 worker hosts a fresh store on a port published for that round.
    default("TORCH_DISABLE_SHARE_RDZV_TCP_STORE", "1")
    default("PYTHONUNBUFFERED", "1")
    env = dict(base)
    env.update(added)
    return env, added


class Supervisor:
    """Runs torchrun, forwards signals, watches the completion marker."""

    def __init__(
        self,
        argv: Sequence[str],
        env: Mapping[str, str],
        config: Config,
        client: kvstore.KeyStore,
        *,
        completion_poll: float = COMPLETION_POLL,
        completion_grace: float = COMPLETION_GRACE,
        completion_wait: float = COMPLETION_WAIT,
        rendezvous: tuple[str, str | None] | None = None,
    ) -> None:
        self.argv = list(argv)
        # (rdzv id, --local-addr) of this torchrun: its node leaves the round on a SIGTERM
        self.rendezvous = rendezvous
        self._leaving: threading.Thread | None = None
        # Takes this node out given torchrun's pid, where torch is imported already (the
        # lifelines' helper: main.py sets it); else leave.leave here, importing torch.
        self.leave_via: Callable[[int], bool] | None = None
        self.env = dict(env)
        self.config = config
        self.client = client
        self.completion_poll = completion_poll
        self.completion_grace = completion_grace
        self.completion_wait = completion_wait
        self.proc: subprocess.Popen[bytes] | None = None
        self.signalled: int | None = None
        self.marked = False  # this pod set the completion marker
        self.asked_after_signal = False  # the exit code already says whether the job completed
        self._lock = threading.Lock()

    def forward(self, signum: int) -> None:
        """Called from the signal handler: pass the signal on to torchrun."""
        with self._lock:
            self.signalled = signum
            proc = self.proc
        if proc is not None and proc.poll() is None:
            logger.info("forwarding %s to torchrun (pid %d)", signal.Signals(signum).name, proc.pid)
            with contextlib.suppress(ProcessLookupError):
                os.kill(proc.pid, signum)
            self._leave_now(proc.pid)

    def _leave_now(self, pid: int) -> None:
        """Take this node out of the round while its workers still checkpoint, not after
        torchrun exits: the survivors, whose workers fail when these exit, then find the
        round free at their first look instead of waiting a 1 s poll of torch's for this
        node to go (SIGTERM re-formed 1 s sooner in scripts/bench-recovery). Nothing
        running depends on the round's state: the workers finish their last step."""
        if self.rendezvous is None or self._leaving is not None:
            return
        rendezvous, client = self.rendezvous, self.client.with_timeout(LEAVE_ASK)

        def run() -> None:
            with contextlib.suppress(kvstore.EtcdError):
                if completion.is_complete(client, self.config):
                    return  # the end of the job: every pod is told to stop, nobody re-forms
            self._leave(rendezvous, pid)

        self._leaving = threading.Thread(target=run, name="leave", daemon=True)
        self._leaving.start()

    def _leave(self, rendezvous: tuple[str, str | None], pid: int) -> None:
        via = self.leave_via
        if via is not None:
            try:
                via(pid)
                return
            except lifeline.HelperError as exc:  # here instead
                logger.debug("leaving through the lifelines' helper failed: %s", exc)
        leave.leave(self.config, *rendezvous, pid=pid)

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
        while True:
            try:
                returncode = proc.wait(timeout=0.5)
                break
            except subprocess.TimeoutExpired:
                pass
            now = time.monotonic()
            if complete_since is None and now >= next_check and self.signalled is None:
                next_check = now + self.completion_poll
                try:
                    if completion.is_complete(self.client, self.config):
                        complete_since = now
                        logger.info(
                            "job %s completed elsewhere; torchrun has %g s to end",
                            self.config.job_id,
                            self.completion_grace,
                        )
                except kvstore.EtcdError as exc:
                    logger.debug("completion check failed: %s", exc)
            if complete_since is not None and now - complete_since >= self.completion_grace:
                self._stop_torchrun()
                return 0
        return self._after_exit(returncode, complete_since is not None)

    def _after_exit(self, returncode: int, seen_complete: bool) -> int:
        if returncode == 0:
            self._mark_complete()
            return 0
        code = exits.from_returncode(returncode)
        if self.signalled is not None:
            # The first pod to finish scales the StatefulSets to 0, so pods that are still
            # leaving get SIGTERM; the job is done, and so are they: exit 0.
            self.asked_after_signal = True
            if completion.complete_now(self.client, self.config, within=STOPPED_ASK):
                logger.info(
                    "torchrun exited with %d after %s; job %s is complete: exit 0",
                    code,
                    signal.Signals(self.signalled).name,
                    self.config.job_id,
                )
                return 0
            logger.info(
                "torchrun exited with %d after %s", code, signal.Signals(self.signalled).name
            )
            if self._leaving is not None:
                self._leaving.join(leave.TIMEOUT)
            if self.rendezvous is not None and self.proc is not None:
                # Again, once torchrun is gone: a join it had in flight at the signal may
                # have put the node back (normally not there any more: one read).
                self._leave(self.rendezvous, self.proc.pid)
            return code
        if seen_complete or completion.wait_complete(
            self.client, self.config, self.completion_wait
        ):
            logger.info(
                "torchrun exited with %d but job %s is complete: exit 0", code, self.config.job_id
            )
            return 0
        logger.error("torchrun exited with %d", code)
        return code

    def _mark_complete(self) -> None:
        deadline = time.monotonic() + 30
        while True:
            try:
                self.marked = completion.mark_complete(self.client, self.config)
                break
            except kvstore.EtcdError as exc:
                # Another pod may have finished first and scaled etcd to 0 already.
                if completion.rendezvous_scaled_to_zero(self.config):
                    logger.info(
                        "training succeeded; job %s is complete (its rendezvous was scaled to 0)",
                        self.config.job_id,
                    )
                    return
                if time.monotonic() >= deadline:
                    logger.error("training succeeded but the marker could not be set: %s", exc)
                    return
                time.sleep(1)
        completion.scale_down_after_success(self.config)
