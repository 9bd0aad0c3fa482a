"""One process of rendezvous agents (threads), driven line by line from stdin:

    python -m benches.rendezvous.agents SPEC_JSON

SPEC: backend, endpoint, run_id, min, max, conf (--rdzv-conf pairs), first and count (the
agents' numbers), monitor (torchrun's --monitor-interval), victim (this process's one
agent is a victim: it serves a lifeline and keeps a loss-detection key alive).

Prints one JSON line when ready ({"pid", "lifeline_port"}), then answers:

    join       every agent that is not joining calls next_rendezvous (thread join-<i>)
    train      from now on, each agent that holds a rank asks num_nodes_waiting every
               monitor s and joins again when it is above 0 (torch's agent loop)
    reform [SINCE]
               every agent joins again within a monitor interval (its workers failed);
               with SINCE (time.time()), those that got a rank after it are left alone:
               they are in a round without the lost node already, and elastic-worker's
               loss detection reads the members of a pod's current round only
    lifeline HOST PORT VICTIM AGENTS
               the agents numbered in AGENTS (comma-separated) hold a lifeline to the
               victim's lifeline port; when it closes, each takes the victim out as
               elastic-worker does for the backend (figure.take_out_how); VICTIM is JSON
               {"addr", "pid", "node"}
    report     one JSON line: each agent's [number, time it last got its rank, rank,
               world size, joining, node id, failed joins], the request counts, the
               sockets open, the lifelines held
    quit

A module run by path, not `python -c` (torch's event names walk sys.modules for frames of
`-c` code: docs/benchmarks.md). torch's elastic logging stays at WARNING.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import random
import selectors
import socket
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from torch.distributed.elastic.rendezvous import RendezvousParameters, registry

from benches.rendezvous import counting

# Many threads per process: a small stack each (8 MiB by default, virtual).
threading.stack_size(512 * 1024)
#: Seconds before an agent whose next_rendezvous failed joins again (the worker starting
#: torchrun again after its agent ended).
RESTART_S = 1.0


class Agent:
    def __init__(self, number: int, spec: dict[str, Any]) -> None:
        self.number = number
        self.spec = spec
        self.handler = registry.get_rendezvous_handler(_params(spec))
        if spec["backend"] != "etcd-lease":
            counting.count_torch_heartbeats(self.handler)
        self.lock = threading.Lock()
        self.joining = False
        self.done = 0.0
        self.failures = 0
        self.rank = -1
        self.world = 0
        self.helper: Any = None  # the worker's own handler (torch's backends): take-outs

    def join(self, delay: float = 0.0) -> None:
        with self.lock:
            if self.joining:
                return
            self.joining = True
        threading.Thread(target=self._join, args=(delay,), name=f"join-{self.number}").start()

    def _join(self, delay: float) -> None:
        """next_rendezvous until it returns: one that fails ends torch's agent, and
        elastic-worker starts torchrun again (counted: `failures`)."""
        time.sleep(delay)
        while True:
            try:
                result = self.handler.next_rendezvous()
                break
            except Exception as exc:  # noqa: BLE001 - counted, and joined again
                logging.warning("agent %d: next_rendezvous failed: %s", self.number, exc)
                with self.lock:
                    self.failures += 1
                time.sleep(RESTART_S)
        rank, world = _rank_world(result)
        with self.lock:
            self.done, self.rank, self.world = time.time(), rank, world
            self.joining = False

    def node(self) -> str | None:
        return getattr(self.handler, "node", None)

    def row(self) -> list[Any]:
        with self.lock:
            return [
                self.number,
                self.done,
                self.rank,
                self.world,
                self.joining,
                self.node(),
                self.failures,
            ]


def _params(spec: dict[str, Any]) -> RendezvousParameters:
    return RendezvousParameters(
        spec["backend"],
        spec["endpoint"],
        spec["run_id"],
        spec["min"],
        spec["max"],
        local_addr="127.0.0.1",
        **spec["conf"],
    )


def _rank_world(result: Any) -> tuple[int, int]:
    if isinstance(result, tuple):  # torch 2.1-2.3
        return int(result[1]), int(result[2])
    return int(result.rank), int(result.world_size)


class Process:
    def __init__(self, spec: dict[str, Any]) -> None:
        self.spec = spec
        counting.wrap_clients()
        first, count = spec["first"], spec["count"]
        self.agents = {i: Agent(i, spec) for i in range(first, first + count)}
        self.training = threading.Event()
        self.lines: list[socket.socket] = []
        self.selector = selectors.DefaultSelector()
        self.sel_lock = threading.Lock()
        threading.Thread(target=self._lifelines, name="lifelines", daemon=True).start()

    # -- torch's agent loop, for every agent that holds a rank
    def monitor(self) -> None:
        interval = self.spec["monitor"]
        while True:
            time.sleep(interval)
            for agent in self.agents.values():
                if agent.joining or agent.rank < 0:
                    continue
                try:
                    waiting = agent.handler.num_nodes_waiting()
                except Exception as exc:  # noqa: BLE001 - torch's agent fails; here: said
                    logging.warning("agent %d: num_nodes_waiting: %s", agent.number, exc)
                    continue
                if waiting > 0:
                    agent.join()

    def reform(self, since: float = 0.0) -> None:
        for agent in self.agents.values():
            with agent.lock:
                reformed = agent.done > since > 0
            if not reformed:
                agent.join(random.uniform(0, self.spec["monitor"]))

    # -- lifelines: a closed one takes the victim out, as elastic-worker does
    def lifeline(self, host: str, port: int, victim: dict[str, Any], numbers: list[int]) -> None:
        for number in numbers:
            agent = self.agents.get(number)
            if agent is None:
                continue
            take_out = _take_out_how(self.spec, agent, victim)
            sock = socket.create_connection((host, port), timeout=10)
            sock.setblocking(False)
            with self.sel_lock:
                self.lines.append(sock)
                self.selector.register(sock, selectors.EVENT_READ, (number, take_out))

    def _lifelines(self) -> None:
        while True:
            with self.sel_lock:
                ready = self.selector.select(timeout=0) if self.lines else []
            if not ready:
                time.sleep(0.02)
                continue
            for key, _ in ready:
                sock: socket.socket = key.fileobj  # type: ignore[assignment]
                try:
                    data = sock.recv(64)
                except BlockingIOError:
                    continue
                except OSError:
                    data = b""
                if data:
                    continue
                since = time.time()
                with self.sel_lock:
                    self.selector.unregister(sock)
                    self.lines.remove(sock)
                sock.close()
                number, take_out = key.data
                threading.Thread(
                    target=take_out, args=(since,), name=f"takeout-{number}", daemon=True
                ).start()

    def report(self) -> dict[str, Any]:
        sockets = sum(
            1 for fd in Path("/proc/self/fd").iterdir() if _link(fd).startswith("socket:")
        )
        with self.sel_lock:
            lines = len(self.lines)
        return {
            "agents": [a.row() for a in self.agents.values()],
            "counts": counting.COUNTS.snapshot(),
            "sockets": sockets,
            "lifelines": lines,
        }


def _link(path: Path) -> str:
    try:
        return os.readlink(path)
    except OSError:
        return ""


def _take_out_how(
    spec: dict[str, Any], agent: Agent, victim: dict[str, Any]
) -> Callable[[float], None]:
    """What elastic-worker does when a lifeline to `victim` closes, for the backend:
    torch's backends take its node out of torch's round with torch's own state machine
    (recovery/round.py, through the worker's own handler, as its lifelines' helper
    does); etcd-lease revokes its lease (torch_etcd_v3.rounds.view.Rounds.take_out)."""
    if spec["backend"] == "etcd-lease":
        from torch_etcd_v3.rounds.view import Rounds  # noqa: PLC0415

        rounds = Rounds.connect(spec["endpoint"], spec["run_id"], spec["conf"])

        def take_out_node(since: float) -> None:
            if victim["node"]:  # None: the victim had no lease when the lifeline was made
                rounds.take_out(victim["node"])

        return take_out_node
    from benches.worker import rounds as worker_rounds  # noqa: PLC0415 - the worker's own path

    # The worker's helper reads the round when it starts (lifelines/helper.py), so its
    # handler exists and has synced before a loss.
    agent.helper = registry.get_rendezvous_handler(_params(spec))
    worker_rounds.participants(agent.helper)

    def take_out_torch(since: float) -> None:
        worker_rounds.take_out(
            lambda: agent.helper, spec["run_id"], victim["addr"], victim["pid"], dead_since=since
        )

    return take_out_torch


# -- a victim: its lifeline and its loss-detection key ----------------------------------


def serve_lifeline() -> int:
    listener = socket.socket()
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    listener.bind(("127.0.0.1", 0))
    listener.listen(4096)
    held: list[socket.socket] = []

    def accept() -> None:
        while True:
            conn, _ = listener.accept()
            held.append(conn)  # held open until this process dies

    threading.Thread(target=accept, name="lifeline-server", daemon=True).start()
    return int(listener.getsockname()[1])


def keep_loss_key(endpoint: str, key: bytes) -> None:
    """elastic-worker's round liveness (recovery/lossdetect.py), reduced to this process's
    own key: a lease of its TTL renewed every REFRESH s while it runs."""
    from torch_etcd_v3.client import ClientSettings, EtcdClient  # noqa: PLC0415

    host, port = endpoint.rsplit(":", 1)
    client = EtcdClient(ClientSettings(host, int(port), None, 5))
    from benches.worker import timings  # noqa: PLC0415

    lease = client.lease_grant(timings.ROUND_KEY_TTL)
    client.put(key, b"alive", lease)

    def refresh() -> None:
        while True:
            time.sleep(timings.ROUND_KEY_REFRESH)
            with contextlib.suppress(Exception):  # a missed refresh is what lapses
                client.lease_keepalive(lease)

    threading.Thread(target=refresh, name="loss-key", daemon=True).start()


def main(argv: list[str]) -> int:
    logging.basicConfig(level=logging.WARNING, format="agents: %(message)s")
    spec = json.loads(argv[0])
    proc = Process(spec)
    ready: dict[str, Any] = {"pid": os.getpid(), "lifeline_port": 0}
    if spec.get("victim"):
        ready["lifeline_port"] = serve_lifeline()
        keep_loss_key(spec["endpoint"], spec["loss_key"].encode())
    print(json.dumps(ready), flush=True)
    for line in sys.stdin:
        words = line.split()
        if not words:
            continue
        command = words[0]
        if command == "join":
            for agent in proc.agents.values():
                agent.join()
        elif command == "train" and not proc.training.is_set():
            proc.training.set()
            threading.Thread(target=proc.monitor, name="monitor", daemon=True).start()
        elif command == "reform":
            proc.reform(float(words[1]) if len(words) > 1 else 0.0)
        elif command == "lifeline":
            host, port, victim, numbers = words[1], int(words[2]), json.loads(words[3]), words[4]
            proc.lifeline(host, port, victim, [int(n) for n in numbers.split(",") if n])
        elif command == "report":
            print(json.dumps(proc.report()), flush=True)
        elif command == "quit":
            break
    sys.stdout.flush()
    os._exit(0)  # agents' threads need no teardown


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
