"""The gate, in order: the endpoint resolves and etcd answers (or the job turns out to be
complete), the mesh interface is up when required, the NCCL/gloo interface is chosen, and
min-nodes peers registered, and this pod's kind of node is the job's (topology.py).
Bounded by ELASTIC_GATE_TIMEOUT as a whole."""

from __future__ import annotations

import logging
import signal
import threading
import time
from dataclasses import dataclass

from elastic_worker import exits, timings
from elastic_worker.completion import Completion
from elastic_worker.gate import netif, probes
from elastic_worker.gate.members import Registration
from elastic_worker.gate.netif import local_address
from elastic_worker.gate.topology import Gate as KindGate
from elastic_worker.gate.wait import (
    Check,
    Completed,
    Fatal,
    GateTimeout,
    Interrupted,
    unless_complete,
    wait,
)
from elastic_worker.keystore import interface as kvstore
from elastic_worker.observe import events
from elastic_worker.settings.config import Config

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class Ready:
    """What the gate established: the interface choice and this node's address."""

    choice: netif.Choice | None
    local_addr: str | None
    registration: Registration | None


def pass_gate(
    cfg: Config,
    client: kvstore.KeyStore,
    completion: Completion,
    stop: threading.Event,
    recorder: events.Recorder | None = None,
) -> Ready | None:
    """Wait until etcd, the mesh and the peers are there; None when the job is complete.
    Raises exits.Exit with the pod's exit code when it cannot pass (logged)."""
    resolver = probes.Resolver(cfg.endpoint.host, cfg.endpoint.port)
    deadline = time.monotonic() + cfg.gate_timeout

    def left() -> float:
        return max(0.0, deadline - time.monotonic())

    done = completion.during_gate
    try:
        wait(
            [
                Check(f"DNS name {cfg.endpoint.host}", unless_complete(resolver, done)),
                Check(
                    f"etcd {client.api} API at {cfg.endpoint}",
                    unless_complete(probes.etcd_api_probe(client, cfg), done),
                ),
            ],
            cfg.gate_timeout,
            stop=stop,
        )
        if completion.before_join():
            return None
        if cfg.mesh_required:  # before the choice, so that the mesh interface is chosen
            mesh_check = Check("mesh interface", probes.mesh_probe(cfg.mesh_interfaces))
            wait([mesh_check], left(), stop=stop)
        choice, local_addr = choose_interface(cfg, resolver.address)
        registration = None
        if cfg.gate_peers:
            registration = Registration(
                client,
                cfg,
                cfg.pod_ip or local_addr or "",
                addr=local_addr or "",
                complete=completion.known,
                confirm=completion.found,
            )
            peers = Check(f"{cfg.min_nodes} peers", registration.probe)
            wait([peers], left(), stop=stop)
            kind = KindGate(client, cfg, registration.kinds, timings.MEMBER_TTL)
            if kind.active:
                registration.also = kind.refresh
                job_kind = Check("the job's kind of node", unless_complete(kind.probe, done))
                wait([job_kind], left(), stop=stop)
    except Fatal as exc:
        logger.error("%s", exc)
        raise exits.Exit(exc.exit_code) from None
    except GateTimeout as exc:
        logger.error("%s", exc)
        if recorder is not None:
            recorder.record(events.GATE_TIMEOUT, str(exc))
        raise exits.Exit(exits.GATE_TIMEOUT) from None
    except Completed:
        logger.info(
            "job %s is complete (its rendezvous StatefulSet %s was scaled to 0 at the end): "
            "exiting 0 without joining",
            cfg.job_id,
            cfg.rendezvous_statefulset,
        )
        return None
    except Interrupted as exc:
        logger.info("%s", exc)
        raise exits.Exit(exits.signalled(signal.SIGTERM)) from None
    except kvstore.EtcdError as exc:
        logger.error("etcd at %s failed after the gate: %s", cfg.endpoint, exc)
        raise exits.Exit(exits.GATE_TIMEOUT) from None
    return Ready(choice, local_addr, registration)


def choose_interface(
    cfg: Config, endpoint_address: str | None
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
    return choice, local_address(cfg, choice, mesh)
