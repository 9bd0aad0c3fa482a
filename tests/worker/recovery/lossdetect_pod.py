"""One pod's round liveness, alone in a process (so that a test can freeze it with
SIGSTOP, as a frozen VM or a cut link would): the node-loss policy with its silent-loss
detection only, settings from the environment, the attempt log in argv[1], the progress
file in argv[2] when given (read as elastic-worker's follower reads it, for the script's
snapshot lines); SIGTERM leaves the round cleanly and exits."""

from __future__ import annotations

import signal
import sys
import threading
from pathlib import Path

from elastic_worker import main
from elastic_worker.completion import Completion
from elastic_worker.keystore import interface as kvstore
from elastic_worker.observe.attempts import AttemptFollower
from elastic_worker.recovery.policy import NodeLoss
from elastic_worker.settings import config


def run() -> None:
    main.setup_logging(debug=True)
    cfg = config.load(["train.py"])
    saves = None
    if len(sys.argv) > 2:
        follower = AttemptFollower(None, progress_file=Path(sys.argv[2]))
        follower.start()
        saves = follower.saves
    client = kvstore.connect(cfg)
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    with NodeLoss(cfg, Completion(client, cfg), torchrun_pid=lambda: None) as loss:
        loss.detect(Path(sys.argv[1]), saves=saves, stop_grace=20)
        print("started", flush=True)
        stop.wait()


if __name__ == "__main__":
    run()
