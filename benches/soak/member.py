"""One member of the soak's round: the worker's own silent-loss detection (on the attempt
log given, telling the node-loss policy), configured from the environment as
elastic-worker is, until SIGTERM.

    python -m benches.soak.member ATTEMPT_LOG
"""

from __future__ import annotations

import signal
import sys
import threading
from pathlib import Path

from benches.worker import Completion, config, etcdv2, policy, setup_logging


def main(log: Path) -> int:
    setup_logging()
    cfg = config.load(["train.py"])
    client = etcdv2.connect(cfg)
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    with policy.NodeLoss(cfg, Completion(client, cfg), torchrun_pid=lambda: None) as loss:
        loss.detect(log, stop_grace=30)
        stop.wait()
    return 0


if __name__ == "__main__":
    sys.exit(main(Path(sys.argv[1])))
