"""elastic-worker: gate on readiness, pick the NCCL/gloo interface, run torchrun elastic.

    elastic-worker python /workspace/train.py --epochs 3

Settings come from the environment the chart sets and /etc/inject/env
(docs/contracts.md). Exit codes: 0 success or job already complete; 2 bad setting;
3 readiness gate timed out; 4 endpoint has no etcd v2 API; otherwise torchrun's code.
"""

from __future__ import annotations

import importlib.util
import logging
import os
import shlex
import signal
import sys
import threading
import time
from collections.abc import Sequence
from types import FrameType

from elastic_worker import completion, config, epoch, etcdv2, gate, launch, netif

logger = logging.getLogger(__name__)

EXIT_OK = 0
EXIT_CONFIG = 2
EXIT_GATE_TIMEOUT = 3
EXIT_NO_V2 = 4


def setup_logging() -> None:
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter("elastic-worker: %(message)s"))
    root = logging.getLogger("elastic_worker")
    root.handlers[:] = [handler]
    root.setLevel(logging.DEBUG if os.environ.get("ELASTIC_DEBUG") == "true" else logging.INFO)
    root.propagate = False


def main(argv: Sequence[str] | None = None) -> int:
    setup_logging()
    args = list(sys.argv[1:] if argv is None else argv)
    stop = threading.Event()
    supervisor: launch.Supervisor | None = None

    def on_signal(signum: int, frame: FrameType | None) -> None:
        stop.set()
        if supervisor is not None:
            supervisor.forward(signum)

    for sig in launch.FORWARDED_SIGNALS:
        signal.signal(sig, on_signal)

    try:
        cfg = config.load(args)
    except config.ConfigError as exc:
        logger.error("%s", exc)
        return EXIT_CONFIG

    if importlib.util.find_spec("torch") is None:
        logger.error(
            "torch is not installed for %s: build the image FROM a PyTorch image "
            "(BASE_IMAGE) or install torch",
            sys.executable,
        )
        return EXIT_CONFIG

    client = etcdv2.Client(cfg.endpoint.url)
    resolver = gate.Resolver(cfg.endpoint.host, cfg.endpoint.port)
    deadline = time.monotonic() + cfg.gate_timeout
    registration: gate.Registration | None = None
    try:
        gate.wait(
            [
                gate.Check(f"DNS name {cfg.endpoint.host}", resolver),
                gate.Check(f"etcd v2 API at {cfg.endpoint}", gate.etcd_v2_probe(client)),
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
            return EXIT_OK

        if cfg.mesh_required:  # before the choice, so that the mesh interface is chosen
            mesh_check = gate.Check("mesh interface", gate.mesh_probe(cfg.mesh_interfaces))
            gate.wait([mesh_check], max(0.0, deadline - time.monotonic()), stop=stop)

        choice, reason = netif.choose(cfg.mesh_interfaces, resolver.address, cfg.endpoint.port)
        mesh = choice is not None and cfg.matches_mesh(choice.name)
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
        local_addr = launch.local_address(cfg, choice, mesh)

        if cfg.gate_peers:
            registration = gate.Registration(client, cfg, cfg.pod_ip or local_addr or "")
            peers = gate.Check(f"{cfg.min_nodes} peers", registration.probe)
            gate.wait([peers], max(0.0, deadline - time.monotonic()), stop=stop)
    except gate.Fatal as exc:
        logger.error("%s", exc)
        return EXIT_NO_V2
    except gate.GateTimeout as exc:
        logger.error("%s", exc)
        return EXIT_GATE_TIMEOUT
    except gate.Interrupted as exc:
        logger.info("%s", exc)
        return 128 + signal.SIGTERM
    except etcdv2.EtcdError as exc:
        logger.error("etcd at %s failed after the gate: %s", cfg.endpoint, exc)
        return EXIT_GATE_TIMEOUT

    env, added = launch.build_env(cfg, choice, os.environ)
    logger.info("environment: %s", " ".join(f"{k}={v}" for k, v in sorted(added.items())))
    if registration is not None:
        registration.start()
    try:
        epoch_now = epoch.current(client, cfg)
        for reopen in range(epoch.MAX_REOPENS + 1):
            if stop.is_set():
                return 128 + signal.SIGTERM
            rdzv_id = epoch.run_id(cfg, epoch_now)
            torchrun = launch.build_argv(cfg, local_addr, rdzv_id=rdzv_id)
            logger.info("starting: %s", shlex.join(torchrun))
            supervisor = launch.Supervisor(torchrun, env, cfg, client)
            code = supervisor.run()
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
        return code
    except etcdv2.EtcdError as exc:
        logger.error("etcd at %s failed: %s", cfg.endpoint, exc)
        return EXIT_GATE_TIMEOUT
    finally:
        if registration is not None:
            registration.stop()


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
