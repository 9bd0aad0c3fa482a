"""elastic-worker: gate on readiness, pick the NCCL/gloo interface, run torchrun elastic.

    elastic-worker python /workspace/train.py --epochs 3

Settings come from the environment the chart sets and /etc/inject/env
(docs/contracts.md); exit codes are in exits.py.
"""

from __future__ import annotations

import importlib.util
import logging
import os
import shlex
import shutil
import signal
import sys
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import FrameType
from typing import TYPE_CHECKING

from elastic_worker import completion, exits
from elastic_worker.gate import memlock, netif
from elastic_worker.gate import wait as gate
from elastic_worker.keystore import interface as kvstore
from elastic_worker.launch import argv as launch
from elastic_worker.launch import attempt_line as attempt
from elastic_worker.observe import events
from elastic_worker.recovery import epochs as epoch
from elastic_worker.recovery import lossdetect as liveness
from elastic_worker.recovery.lifelines import client as lifeline
from elastic_worker.settings import config
from elastic_worker.warm import server as warm

if TYPE_CHECKING:  # imported when on (_metrics): prometheus-client is needed only then
    from elastic_worker.observe import attempts as follow
    from elastic_worker.observe import metrics

logger = logging.getLogger(__name__)


class _Exit(Exception):
    """Leave main() with `code`; the step that raises it has logged why."""

    def __init__(self, code: int) -> None:
        super().__init__(code)
        self.code = code


@dataclass
class _Relay:
    """What the signal handler needs: the stop flag and the torchrun to forward to."""

    stop: threading.Event
    supervisor: launch.Supervisor | None = None

    def __call__(self, signum: int, frame: FrameType | None) -> None:
        self.stop.set()
        if self.supervisor is not None:
            self.supervisor.forward(signum)

    def torchrun_pid(self) -> int | None:
        """The running torchrun's pid (the node torch knows this pod by), if any."""
        proc = self.supervisor.proc if self.supervisor is not None else None
        return proc.pid if proc is not None and proc.returncode is None else None


@dataclass(frozen=True)
class _Ready:
    """What the gate established: the interface choice and this node's address."""

    choice: netif.Choice | None
    local_addr: str | None
    registration: gate.Registration | None


def setup_logging(debug: bool = False) -> None:
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter("elastic-worker: %(message)s"))
    root = logging.getLogger("elastic_worker")
    root.handlers[:] = [handler]
    root.setLevel(logging.DEBUG if debug else logging.INFO)
    root.propagate = False


def main(argv: Sequence[str] | None = None) -> int:
    setup_logging()
    relay = _Relay(threading.Event())
    for sig in launch.FORWARDED_SIGNALS:
        signal.signal(sig, relay)
    tracker: metrics.Tracker | None = None
    recorder = events.Recorder.disabled()
    ready: _Ready | None = None
    try:
        cfg, client = _load(list(sys.argv[1:] if argv is None else argv))
    except _Exit as leave:
        return leave.code
    try:
        if warning := memlock.check():
            logger.warning("%s", warning)
        recorder = events.recorder(cfg)
        tracker = _metrics(cfg, recorder)
        if tracker is not None:
            tracker.gate_begin()
        ready = _gate(cfg, client, relay.stop, recorder)
        if tracker is not None:
            tracker.gate_end()
        code = (
            exits.OK
            if ready is None
            else _train(cfg, client, ready, relay, tracker, recorder=recorder)
        )
    except _Exit as leave:
        code = leave.code
    try:
        asked = relay.supervisor is not None and relay.supervisor.asked_after_signal
        if (
            code != exits.OK
            and relay.stop.is_set()
            and not asked
            and completion.complete_now(client, cfg, within=launch.STOPPED_ASK)
        ):
            # The first pod to finish scales the job to 0: whatever this pod was doing when
            # its SIGTERM came (gating, between torchrun runs, waiting as a spare), it is done.
            logger.info("stopping: job %s is complete, so exit 0 (not %d)", cfg.job_id, code)
            code = exits.OK
        if tracker is not None:
            tracker.finished(completed=code == exits.OK)
        if ready is not None:
            _record_end(recorder, code, relay)
        return code
    finally:
        recorder.close()


def _record_end(recorder: events.Recorder, code: int, relay: _Relay) -> None:
    """The pod's last Event: it left on SIGTERM, or training succeeded (on the StatefulSet
    too when this pod set the completion marker: once per job)."""
    supervisor = relay.supervisor
    if relay.stop.is_set() and code != exits.OK:
        recorder.record(
            "LeftOnSignal",
            f"SIGTERM forwarded to torchrun: training stopped (exit {code}; the script "
            "checkpoints on SIGTERM) and this pod left the job; the others re-form without it",
        )
    elif code == exits.OK and supervisor is not None:
        recorder.record("JobCompleted", "training complete: this pod exits 0")
        if supervisor.marked:
            recorder.record(
                "JobCompleted",
                f"training complete (marked by {supervisor.config.pod_name})",
                job=True,
            )


def _metrics(cfg: config.Config, recorder: events.Recorder) -> metrics.Tracker | None:
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


def _load(args: list[str]) -> tuple[config.Config, kvstore.KeyStore]:
    """The settings, and the etcd client made from them (its TLS files read)."""
    try:
        cfg = config.load(args)
        client = kvstore.connect(cfg)
    except config.ConfigError as exc:
        logger.error("%s", exc)
        raise _Exit(exits.CONFIG) from None
    setup_logging(cfg.debug)
    if importlib.util.find_spec("torch") is None:
        logger.error(
            "torch is not installed for %s: build the image FROM a PyTorch image "
            "(BASE_IMAGE) or install torch",
            sys.executable,
        )
        raise _Exit(exits.CONFIG)
    return cfg, client


def _gate(
    cfg: config.Config,
    client: kvstore.KeyStore,
    stop: threading.Event,
    recorder: events.Recorder | None = None,
) -> _Ready | None:
    """Wait until etcd, the mesh and the peers are there; None when the job is complete."""
    resolver = gate.Resolver(cfg.endpoint.host, cfg.endpoint.port)
    deadline = time.monotonic() + cfg.gate_timeout

    def left() -> float:
        return max(0.0, deadline - time.monotonic())

    def done() -> bool:
        return completion.rendezvous_scaled_to_zero(cfg) is True

    try:
        gate.wait(
            [
                gate.Check(f"DNS name {cfg.endpoint.host}", gate.unless_complete(resolver, done)),
                gate.Check(
                    f"etcd {client.api} API at {cfg.endpoint}",
                    gate.unless_complete(gate.etcd_api_probe(client, cfg), done),
                ),
            ],
            cfg.gate_timeout,
            stop=stop,
        )
        if completion.is_complete(client, cfg):
            logger.info(
                "job %s is already complete (%s): exiting 0 without joining",
                cfg.job_id,
                completion.complete_key(cfg),
            )
            return None
        if cfg.mesh_required:  # before the choice, so that the mesh interface is chosen
            mesh_check = gate.Check("mesh interface", gate.mesh_probe(cfg.mesh_interfaces))
            gate.wait([mesh_check], left(), stop=stop)
        choice, local_addr = _choose_interface(cfg, resolver.address)
        registration = None
        if cfg.gate_peers:
            registration = gate.Registration(client, cfg, cfg.pod_ip or local_addr or "")
            peers = gate.Check(f"{cfg.min_nodes} peers", registration.probe)
            gate.wait([peers], left(), stop=stop)
    except gate.Fatal as exc:
        logger.error("%s", exc)
        raise _Exit(exc.exit_code) from None
    except gate.GateTimeout as exc:
        logger.error("%s", exc)
        if recorder is not None:
            recorder.record("GateTimeout", str(exc), events.WARNING)
        raise _Exit(exits.GATE_TIMEOUT) from None
    except gate.Completed:
        logger.info(
            "job %s is complete (its rendezvous StatefulSet %s was scaled to 0 at the end): "
            "exiting 0 without joining",
            cfg.job_id,
            cfg.rendezvous_statefulset,
        )
        return None
    except gate.Interrupted as exc:
        logger.info("%s", exc)
        raise _Exit(exits.signalled(signal.SIGTERM)) from None
    except kvstore.EtcdError as exc:
        logger.error("etcd at %s failed after the gate: %s", cfg.endpoint, exc)
        raise _Exit(exits.GATE_TIMEOUT) from None
    return _Ready(choice, local_addr, registration)


def _choose_interface(
    cfg: config.Config, endpoint_address: str | None
) -> tuple[netif.Choice | None, str | None]:
    """The NCCL/gloo interface (logged with the reason) and this node's address."""
    choice, reason = netif.choose(cfg.mesh_interfaces, endpoint_address, cfg.endpoint.port)
    if choice is None:
        logger.info("leaving NCCL/GLOO_SOCKET_IFNAME unset: %s", reason)
    elif cfg.nccl_socket_ifname and cfg.gloo_socket_ifname:
        logger.info(
            "NCCL_SOCKET_IFNAME=%s and GLOO_SOCKET_IFNAME=%s set by the user "
            "(the automatic choice would be %s: %s)",
            cfg.nccl_socket_ifname,
            cfg.gloo_socket_ifname,
            choice.name,
            reason,
        )
    else:
        logger.info("interface %s: %s", choice.name, reason)
    mesh = choice is not None and cfg.matches_mesh(choice.name)
    return choice, launch.local_address(cfg, choice, mesh)


def _start_follower(
    tracker: metrics.Tracker, ready: _Ready, env: dict[str, str]
) -> follow.Follower | None:
    """Follow torchrun's attempts for the metrics; None when there is nowhere to do it."""
    from elastic_worker.observe import attempts as follow  # noqa: PLC0415 - only when metrics are on

    members = ready.registration.count if ready.registration is not None else None
    try:
        follower = follow.Follower(tracker, members)
    except OSError as exc:  # no writable temp dir: the metrics lose the rounds only
        logger.warning("metrics: cannot follow torchrun's attempts: %s", exc)
        return None
    env.update(follower.env())
    follower.start()
    return follower


def _train(
    cfg: config.Config,
    client: kvstore.KeyStore,
    ready: _Ready,
    relay: _Relay,
    tracker: metrics.Tracker | None = None,
    *,
    recorder: events.Recorder | None = None,
) -> int:
    """Run torchrun, in a fresh rendezvous epoch when torch closed the current one early."""
    env, added = launch.build_env(cfg, ready.choice, os.environ)
    logger.info("environment: %s", " ".join(f"{k}={v}" for k, v in sorted(added.items())))
    follower = _start_follower(tracker, ready, env) if tracker is not None else None
    watch = liveness.start(client, cfg, env) if cfg.loss_detection else None
    server = _start_warm(cfg, env)
    lifeline_server = lifeline.serve(cfg, ready.local_addr, relay.torchrun_pid)
    attempt_log, own_dir = (
        attempt.ensure_log(env, "elastic-lifeline-") if lifeline_server else (None, None)
    )
    if ready.registration is not None:
        ready.registration.start()
    try:
        return _epochs(
            cfg,
            client,
            ready,
            relay,
            env=env,
            tracker=tracker,
            recorder=recorder,
            warm_socket=server.socket_path if server is not None else None,
            lifelines=attempt_log,
        )
    except kvstore.EtcdError as exc:
        logger.error("etcd at %s failed: %s", cfg.endpoint, exc)
        return exits.GATE_TIMEOUT
    finally:
        if lifeline_server is not None:
            lifeline_server.stop()
        if own_dir is not None:
            shutil.rmtree(own_dir, ignore_errors=True)
        if server is not None:
            server.stop()
        if follower is not None:
            follower.stop()
        if watch is not None:
            watch.stop()
        if ready.registration is not None:
            ready.registration.stop()


def _start_warm(cfg: config.Config, env: dict[str, str]) -> warm.Handle | None:
    """The warm server, when on and the command is one it can start (warm.py)."""
    if not cfg.warm_start:
        return None
    program = launch.program_argv(cfg.command, sys.executable)
    if warm.warm_command(program, sys.executable, "-") is None:
        logger.info("warm start: off for %s (not a python script or -m module)", program[0])
        return None
    server = warm.start(sys.executable, cfg.warm_preload, env)
    logger.info(
        "warm start: each training process forks from a server with %s imported "
        "(job.warmStart.enabled=false turns this off)",
        ", ".join(cfg.warm_preload) or "nothing",
    )
    return server


def _epochs(
    cfg: config.Config,
    client: kvstore.KeyStore,
    ready: _Ready,
    relay: _Relay,
    *,
    env: dict[str, str],
    tracker: metrics.Tracker | None,
    recorder: events.Recorder | None = None,
    warm_socket: str | None = None,
    lifelines: Path | None = None,
) -> int:
    """torchrun in the current epoch; again in the next while torch closed it early.
    `lifelines`: the attempt log, when this pod holds lifelines to its peers (lifeline.py)."""
    epoch_now = epoch.current(client, cfg)
    code = 0
    for reopen in range(epoch.MAX_REOPENS + 1):
        if relay.stop.is_set():
            return exits.signalled(signal.SIGTERM)
        rdzv_id = epoch.run_id(cfg, epoch_now)
        torchrun = launch.build_argv(
            cfg, ready.local_addr, rdzv_id=rdzv_id, pwd=env.get("PWD"), warm_socket=warm_socket
        )
        logger.info("starting: %s", shlex.join(torchrun))
        relay.supervisor = supervisor = launch.Supervisor(
            torchrun, env, cfg, client, rendezvous=(rdzv_id, ready.local_addr)
        )
        if relay.stop.is_set():  # a signal between the check above and the line before:
            return exits.signalled(signal.SIGTERM)  # nobody would pass it to this torchrun
        if tracker is not None:
            tracker.torchrun_started()
        watcher = (
            None
            if lifelines is None
            else lifeline.watch(
                cfg,
                rdzv_id,
                ready.local_addr,
                relay.torchrun_pid,
                lifelines,
                warm_socket=warm_socket,
                on_removed=None if recorder is None else _peer_gone(recorder, rdzv_id),
            )
        )
        if watcher is not None:
            supervisor.leave_via = watcher.leave  # torch is imported there
        try:
            code = supervisor.run()
        finally:
            if watcher is not None:
                watcher.stop()
        if code == 0 or supervisor.signalled is not None or reopen == epoch.MAX_REOPENS:
            return code
        if not _closed_early(cfg, rdzv_id):
            return code
        epoch_now = epoch.advance(client, cfg, epoch_now)
        logger.warning(
            "rendezvous %s was closed before the job completed (an agent failed, "
            "e.g. while etcd was away): joining rendezvous %s",
            rdzv_id,
            epoch.run_id(cfg, epoch_now),
        )
        if recorder is not None:
            recorder.record(
                "RendezvousReopened",
                f"rendezvous {rdzv_id} was closed before the job completed: joining "
                f"{epoch.run_id(cfg, epoch_now)}",
                events.WARNING,
                job=True,
            )
    return code


def _peer_gone(recorder: events.Recorder, rdzv_id: str) -> Callable[[lifeline.Node], None]:
    """The PeerGone Event of a node this pod took out of the round through its lifeline."""

    def record(node: lifeline.Node) -> None:
        recorder.record(
            "PeerGone",
            f"the torchrun of {node[0]} (pid {node[1]}) is gone (its lifeline closed): "
            f"took its node out of rendezvous {rdzv_id}",
            events.WARNING,
        )

    return record


def _closed_early(cfg: config.Config, rdzv_id: str) -> bool:
    """True when torch closed `rdzv_id` although the job is not complete; False when it
    is open or etcd cannot say (the kubelet's restart and the gate take it from there)."""
    try:
        return epoch.rendezvous_closed(cfg, rdzv_id)
    except Exception as exc:  # noqa: BLE001 - torch raises its own and etcd's errors
        logger.info("could not ask whether rendezvous %s is closed: %s", rdzv_id, exc)
        return False


if __name__ == "__main__":
    sys.exit(main())
