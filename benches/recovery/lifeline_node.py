"""A node's lifelines, as its elastic-worker runs them (the node-loss policy's lifeline
server and its watch of one torchrun, with elastic-worker's Config), in a process of its
own so that they die with the node.

    python -m benches.recovery.lifeline_node ADDR ATTEMPT_LOG NAME=value...

Started before the agents, as elastic-worker is up before it starts torchrun: it says
`ready`, then reads torchrun's pid and the node's warm server socket from stdin (one line,
`PID [SOCKET]`). NAME=value are the worker's variables; the silent-loss detection is off
(the bench's losses are seen by the lifelines). SIGTERM says goodbye (an elastic-worker
ending on purpose).
"""

from __future__ import annotations

import logging
import os
import signal
import sys
import threading
from pathlib import Path

from benches.worker import ATTEMPT_LOG_ENV, Completion, config, kvstore, policy


def main(argv: list[str]) -> int:
    addr, log = argv[0], Path(argv[1])
    env = dict(kv.split("=", 1) for kv in argv[2:])
    env["ELASTIC_LOSS_DETECTION"] = "false"
    logging.basicConfig(level=logging.INFO, format=f"lifeline {addr}: %(message)s")
    cfg = config.load(["python", "train.py"], env)
    os.environ.update(env)  # elastic-worker's environment, which the lifelines' helper reads
    done = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: done.set())
    print("ready", flush=True)
    pid, _, warm = sys.stdin.readline().strip().partition(" ")
    client = kvstore.connect(cfg)
    with policy.NodeLoss(cfg, Completion(client, cfg), torchrun_pid=lambda: int(pid)) as loss:
        loss.start({ATTEMPT_LOG_ENV: str(log)}, addr, saves=None)
        with loss.watch("bench", addr, warm or None).running(None):
            done.wait()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
