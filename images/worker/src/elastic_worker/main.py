"""elastic-worker: gate on readiness, pick the NCCL/gloo interface, run torchrun elastic.

    elastic-worker python /workspace/train.py --epochs 3

Settings come from the environment the chart sets and /etc/inject/env (docs/contracts.md):
main() turns them into one Config and the job's key store, once, then runs the pod's life
(pod.py). Exit codes are in exits.py.
"""

from __future__ import annotations

import logging
import signal
import sys
from collections.abc import Sequence

from elastic_worker import exits, image, pod, torchruns
from elastic_worker.keystore import interface as kvstore
from elastic_worker.launch.supervisor import FORWARDED_SIGNALS
from elastic_worker.settings import config

# Named, not __name__: run as a module (the injected worker's boot.py) this is __main__,
# whose lines would miss the `elastic-worker:` handler.
logger = logging.getLogger("elastic_worker.main")


def setup_logging(debug: bool = False) -> None:
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter("elastic-worker: %(message)s"))
    root = logging.getLogger("elastic_worker")
    root.handlers[:] = [handler]
    root.setLevel(logging.DEBUG if debug else logging.INFO)
    root.propagate = False


def main(argv: Sequence[str] | None = None) -> int:
    setup_logging()
    relay = torchruns.Relay()
    for sig in FORWARDED_SIGNALS:
        signal.signal(sig, relay)
    try:
        cfg, client = _load(list(sys.argv[1:] if argv is None else argv))
    except exits.Exit as leave:
        return leave.code
    return pod.run(cfg, client, relay)


def _load(args: list[str]) -> tuple[config.Config, kvstore.KeyStore]:
    """The settings, and the etcd client made from them (its TLS files read)."""
    try:
        cfg = config.load(args)
        client = kvstore.connect(cfg)
    except config.ConfigError as exc:
        logger.error("%s", exc)
        raise exits.Exit(exits.CONFIG) from None
    setup_logging(cfg.debug)
    problem = image.problem()
    if problem is not None:
        logger.error("%s", problem)
        raise exits.Exit(exits.IMAGE)
    return cfg, client


if __name__ == "__main__":
    sys.exit(main())
