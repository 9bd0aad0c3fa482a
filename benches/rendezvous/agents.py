"""One process of the rendezvous figure: `count` agents as threads, joining when told.

    python -m benches.rendezvous.agents BACKEND ENDPOINT RUN_ID TOTAL COUNT CONF LIMIT

Prints `ready` once torch is imported and the handlers are built, reads a line (go), lets
the agents join for up to LIMIT seconds, then prints one JSON line: when each joined
(`done`, time.time()), and the counts below. Each agent's backend and state holder are
wrapped (here only) to count its writes that won and lost against another agent's, and
how often the others evicted it from the round.

A module run by path, not `python -c`: torch records an event on every sync, and its
get_method_name() calls inspect.stack(), which finds each frame's module; for a frame of
`-c` code ("<string>", no __main__.__file__) inspect.getmodule() walks all of sys.modules
(thousands with torch) every time. That slowed the agents enough that 128 never joined in
60 s; from a file they join in ~5 s.
"""

from __future__ import annotations

import json
import sys
import threading
import time
from typing import Any

from torch.distributed.elastic.rendezvous import RendezvousParameters, registry


def parse_conf(conf: str) -> dict[str, str]:
    """--rdzv-conf's `k=v,k=v` as keyword arguments."""
    return dict(kv.split("=") for kv in conf.split(",") if kv)


def watch(handler: Any, counts: dict[str, int]) -> None:
    """Count `handler`'s writes (won, lost) and its evictions after it had joined."""
    holder, store = handler._state_holder, handler._state_holder._backend
    set_state, sync, joined = store.set_state, holder.sync, [False]

    def counted_set(state: Any, token: Any = None) -> Any:
        result = set_state(state, token)
        counts["won" if result and result[2] else "lost"] += 1
        return result

    def watched_sync() -> Any:
        result = sync()
        member = handler._this_node in holder.state.participants
        counts["evicted"] += joined[0] and not member and not holder.state.complete
        joined[0] = member
        return result

    store.set_state, holder.sync = counted_set, watched_sync


def main(argv: list[str]) -> int:
    backend, endpoint, run_id, total_s, count_s, conf, limit_s = argv[:7]
    total, count, limit = int(total_s), int(count_s), float(limit_s)
    extra = parse_conf(conf)
    handlers = [
        registry.get_rendezvous_handler(
            RendezvousParameters(
                backend, endpoint, run_id, total, total, local_addr="127.0.0.1", **extra
            )
        )
        for _ in range(count)
    ]
    counts = {"won": 0, "lost": 0, "evicted": 0}
    for h in handlers:
        watch(h, counts)
    done: list[float] = []

    def join(handler: Any) -> None:
        handler.next_rendezvous()
        done.append(time.time())

    threads = [threading.Thread(target=join, args=(h,), daemon=True) for h in handlers]
    print("ready", flush=True)
    sys.stdin.readline()  # go
    end = time.time() + limit
    for t in threads:
        t.start()
    for t in threads:
        t.join(max(0.0, end - time.time()))
    print(json.dumps({"done": done, **counts}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
