"""One member of the soak's round: the worker's own liveness (its Watch on the attempt log
given), configured from the environment as elastic-worker is, until SIGTERM.

    python -m benches.soak.member ATTEMPT_LOG
"""

from __future__ import annotations

import signal
import sys
import threading
from pathlib import Path

from benches.worker import config, etcdv2, liveness, setup_logging


def main(log: Path) -> int:
    setup_logging()
    cfg = config.load(["train.py"])
    watch = liveness.LossDetector(etcdv2.connect(cfg), cfg, log)
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    watch.start()
    stop.wait()
    watch.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main(Path(sys.argv[1])))
