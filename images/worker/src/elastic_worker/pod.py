"""One pod's life, from its settings on: the gate, torchrun after torchrun (torchruns.py),
the end; and the services around torchrun, started and stopped by one owner.

    run()        memlock check, Events, metrics; gate/ready.py; _train(); the exit code
    _train()     the services (member refresh, attempt follower, the node-loss policy's
                 detectors, warm server, torchrun's reports) on one ExitStack, then
                 torchruns.Torchruns.run()
"""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from elastic_worker import exits, torchcompat
from elastic_worker.completion import Completion
from elastic_worker.gate import memlock
from elastic_worker.gate.ready import Ready, pass_gate
from elastic_worker.keystore import interface as kvstore
from elastic_worker.launch import argv
from elastic_worker.launch.supervisor import teardown_bound
from elastic_worker.observe import events
from elastic_worker.recovery.policy import NodeLoss
from elastic_worker.settings.config import Config
from elastic_worker.torchruns import Relay, Torchruns
from elastic_worker.warm import server as warm
from elastic_worker.warm.protocol import warm_command

if TYPE_CHECKING:  # imported when on (_metrics): prometheus-client is needed only then
    from elastic_worker.observe import attempts, metrics

logger = logging.getLogger(__name__)


def run(cfg: Config, client: kvstore.KeyStore, relay: Relay) -> int:
    """The pod's life; its exit code (exits.py)."""
    completion = Completion(client, cfg)
    torch_check = torchcompat.check_soon()
    recorder = events.Recorder.disabled()
    tracker: metrics.Tracker | None = None
    ready: Ready | None = None
    try:
        if warning := memlock.check():
            logger.warning("%s", warning)
        recorder = events.recorder(cfg)
        tracker = _metrics(cfg, recorder)
        if tracker is not None:
            tracker.gate_begin()
        ready = pass_gate(cfg, client, completion, relay.stop, recorder)
        if tracker is not None:
            tracker.gate_end()
        code = (
            exits.OK
            if ready is None
            else _train(
                cfg,
                client,
                completion,
                ready,
                relay,
                tracker=tracker,
                recorder=recorder,
                internals=_torch_internals(torch_check),
            )
        )
    except exits.Exit as leave:
        code = leave.code
    try:
        if (
            code != exits.OK
            and relay.stop.is_set()
            and not completion.asked_after_signal
            and completion.after_signal()
        ):
            # The first pod to finish scales the job to 0: whatever this pod was doing when
            # its SIGTERM came (gating, between torchrun runs, waiting as a spare), it is done.
            logger.info("stopping: job %s is complete, so exit 0 (not %d)", cfg.job_id, code)
            code = exits.OK
        if tracker is not None:
            tracker.finished(completed=code == exits.OK)
        if ready is not None:
            _record_end(recorder, code, relay, completion)
        return code
    finally:
        recorder.close()


def _record_end(recorder: events.Recorder, code: int, relay: Relay, completion: Completion) -> None:
    """The pod's last Event: it left on SIGTERM, or training succeeded (on the StatefulSet
    too when this pod set the completion marker: once per job)."""
    if relay.replaced.is_set():
        return  # the new incarnation speaks for the pod
    if relay.stop.is_set() and code != exits.OK:
        recorder.record(
            events.LEFT_ON_SIGNAL,
            f"SIGTERM forwarded to torchrun: training stopped (exit {code}; the script "
            "checkpoints on SIGTERM) and this pod left the job; the others re-form without it",
        )
    elif code == exits.OK and relay.supervisor is not None:
        recorder.record(events.JOB_COMPLETED, "training complete: this pod exits 0")
        if completion.marked:
            recorder.record(
                events.JOB_COMPLETED,
                f"training complete (marked by {completion.config.pod_name})",
                job=True,
            )


def _metrics(cfg: Config, recorder: events.Recorder) -> metrics.Tracker | None:
    """The pod's state machine, when ELASTIC_METRICS (served) or Events (not served: the
    tracker only tells the recorder of re-forms) are on. A port that cannot be bound
    costs the metrics, never the training: one warning line."""
    if not (cfg.metrics or recorder.enabled):
        return None
    from elastic_worker.observe import metrics  # noqa: PLC0415 - only when metrics are on

    job_metrics = metrics.JobMetrics(metrics.Identity(cfg.job_id, cfg.group))
    job_metrics.node.info({"node": cfg.node_name, **dict(cfg.node_info)})
    notify = recorder.record if recorder.enabled else None
    if cfg.metrics:
        try:
            metrics.serve(job_metrics, cfg.metrics_port)
        except OSError as exc:
            logger.warning(
                "metrics off: cannot serve ELASTIC_METRICS_PORT=%d (chart: monitoring.port): %s",
                cfg.metrics_port,
                exc.strerror or exc,
            )
            if notify is None:
                return None
        else:
            logger.info("metrics on port %d (/metrics)", cfg.metrics_port)
    return metrics.Tracker(
        job_metrics, cfg.min_nodes, cfg.max_nodes, cfg.max_restarts, notify=notify
    )


def _start_follower(
    tracker: metrics.Tracker | None, ready: Ready, env: dict[str, str]
) -> attempts.AttemptFollower | None:
    """Follow torchrun's attempts for the metrics (`tracker`) and the script's snapshot
    lines; None when there is nowhere to do it."""
    from elastic_worker.observe import attempts  # noqa: PLC0415 - metrics or loss detection

    members = ready.registration.count if ready.registration is not None else None
    try:
        follower = attempts.AttemptFollower(tracker, members)
    except OSError as exc:  # no writable temp dir: the metrics lose the rounds only
        logger.warning("metrics: cannot follow torchrun's attempts: %s", exc)
        return None
    env.update(follower.env())
    follower.start()
    return follower


def _start_warm(cfg: Config, env: dict[str, str]) -> warm.Handle | None:
    """The warm server, when on and the command is one it can start (warm/)."""
    if not cfg.warm_start:
        return None
    program = argv.program_argv(cfg.command, sys.executable)
    if warm_command(program, sys.executable, "-") is None:
        logger.info("warm start: off for %s (not a python script or -m module)", program[0])
        return None
    server = warm.start(
        sys.executable, cfg.warm_preload, env, teardown_bound(cfg.exit_barrier_timeout)
    )
    logger.info(
        "warm start: each training process forks from a server with %s imported "
        "(job.warmStart.enabled=false turns this off)",
        ", ".join(cfg.warm_preload) or "nothing",
    )
    return server


def _torch_internals(answer: Callable[[], str | None] | None = None) -> bool:
    """Whether this torch has what the lifelines and the leave at a signal take from it
    (torchcompat.py; `answer`: a check started earlier); said once when not."""
    problem = (answer or torchcompat.check)()
    if problem is None:
        return True
    logger.warning(
        "no lifelines and no leave at a signal: %s; a lost or stopped node leaves the "
        "round when its keep-alive lapses",
        problem,
    )
    return False


def _train(
    cfg: Config,
    client: kvstore.KeyStore,
    completion: Completion,
    ready: Ready,
    relay: Relay,
    *,
    tracker: metrics.Tracker | None,
    recorder: events.Recorder,
    internals: bool,
) -> int:
    """The services, then torchrun after torchrun; they stop in reverse order.
    `internals`: this torch lets the lifelines and the leave at a signal work."""
    env, added = argv.build_env(cfg, ready.choice, os.environ)
    logger.info("environment: %s", " ".join(f"{k}={v}" for k, v in sorted(added.items())))
    with contextlib.ExitStack() as services:
        if ready.registration is not None:  # written in the gate; its key goes last
            services.callback(ready.registration.stop)
        wanted = tracker is not None or cfg.loss_detection
        follower = _start_follower(tracker, ready, env) if wanted else None
        if follower is not None:
            services.callback(follower.stop)
        node_loss = NodeLoss(
            cfg,
            completion,
            torchrun_pid=relay.torchrun_pid,
            registration=ready.registration,
            recorder=recorder,
            replaced=relay.replaced,
            internals=internals,
            tracker=tracker,
        )
        services.enter_context(node_loss)
        node_loss.start(
            env, ready.local_addr, saves=follower.saves if follower is not None else None
        )
        reports = Path(tempfile.mkdtemp(prefix="elastic-torchrun-"))  # torchrun.py's --report
        services.callback(shutil.rmtree, reports, ignore_errors=True)
        server = _start_warm(cfg, env)
        if server is not None:
            services.callback(server.stop)
        if ready.registration is not None:
            ready.registration.start()
        torchruns = Torchruns(
            cfg,
            completion,
            ready,
            relay,
            env,
            node_loss,
            tracker=tracker,
            recorder=recorder,
            warm_socket=server.socket_path if server is not None else None,
            reports=reports,
        )
        try:
            return torchruns.run()
        except kvstore.EtcdError as exc:
            logger.error("etcd at %s failed: %s", cfg.endpoint, exc)
            return exits.GATE_TIMEOUT
