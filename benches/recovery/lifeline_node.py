"""A node's lifelines, as its elastic-worker runs them (lifeline_server.serve and lifeline.watch,
with elastic-worker's Config), in a process of its own so that they die with the node.

    python -m benches.recovery.lifeline_node ADDR ATTEMPT_LOG NAME=value...

Started before the agents, as elastic-worker is up before it starts torchrun: it says
`ready`, then reads torchrun's pid and the node's warm server socket from stdin (one line,
`PID [SOCKET]`). NAME=value are the worker's variables. SIGTERM says goodbye (an
elastic-worker ending on purpose).
"""

from __future__ import annotations

import logging
import os
import signal
import sys
import threading
from pathlib import Path

from benches.worker import config, lifeline, lifeline_server


def main(argv: list[str]) -> int:
    addr, log = argv[0], Path(argv[1])
    env = dict(kv.split("=", 1) for kv in argv[2:])
    logging.basicConfig(level=logging.INFO, format=f"lifeline {addr}: %(message)s")
    cfg = config.load(["python", "train.py"], env)
    os.environ.update(env)  # elastic-worker's environment, which the lifelines' helper reads
    done = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: done.set())
    print("ready", flush=True)
    pid, _, warm = sys.stdin.readline().strip().partition(" ")
    server = lifeline_server.serve(cfg, addr, lambda: int(pid))
    watcher = lifeline.watch(cfg, "bench", addr, lambda: int(pid), log, warm_socket=warm or None)
    done.wait()
    watcher.stop()
    if server is not None:
        server.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
