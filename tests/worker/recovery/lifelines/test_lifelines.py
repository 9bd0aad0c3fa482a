"""lifeline.py: a peer's processes seen dying through the connection they held, and only
then its node taken out of the round (the node itself is in recovery/test_round.py and
test_pod.py)."""

from __future__ import annotations

import contextlib
import socket
import subprocess
import sys
import textwrap
import threading
import time

import pytest
from elastic_worker import timings
from elastic_worker.recovery.lifelines import client as lifeline
from elastic_worker.recovery.lifelines.client import LifelineWatcher as Watcher
from elastic_worker.recovery.lifelines.client import Verdict
from elastic_worker.recovery.lifelines.messages import HelperError, greeting
from elastic_worker.recovery.lifelines.server import LifelineServer as Server
from elastic_worker.torchcompat import RdzvNode as Node
from testlib import free_port

from worker.worker_helpers import wait_until

# A peer's elastic-worker: its lifeline greets with this process's pid, as a torchrun's.
PEER = textwrap.dedent(
    """
    import os, sys, time
    from elastic_worker.recovery.lifelines.server import LifelineServer
    LifelineServer(sys.argv[1], int(sys.argv[2]), os.getpid).start()
    print("ready", flush=True)
    time.sleep(600)
    """
)


def _peer(addr: str, port: int) -> subprocess.Popen[str]:
    proc = subprocess.Popen(
        [sys.executable, "-c", PEER, addr, str(port)], stdout=subprocess.PIPE, text=True
    )
    assert proc.stdout is not None and proc.stdout.readline() == "ready\n"
    return proc


def _watcher(port: int, nodes: list[Node], removed: list[tuple[Node, float]]) -> Watcher:
    rounds = iter([True])  # one round: read the participants once
    return Watcher(
        lambda: ("127.0.0.1", 1),
        port,
        lambda: nodes,
        lambda node, since: removed.append((node, since)) is None,
        lambda: next(rounds, False),
        poll=0.1,
    ).start()


def test_a_lifeline_greets_with_the_torchrun_and_a_gone_one_refuses() -> None:
    server = Server("127.0.0.1", 0, lambda: 42).start()
    sock, pid = lifeline.ask("127.0.0.1", server.port)
    sock.close()
    assert pid == 42
    assert lifeline.verdict(("127.0.0.1", 42), server.port)[0] == Verdict.ALIVE
    assert lifeline.verdict(("127.0.0.1", 41), server.port)[0] == Verdict.GONE  # a new torchrun
    server.stop()
    assert lifeline.verdict(("127.0.0.1", 42), server.port)[0] == Verdict.GONE  # refused


def test_a_peer_that_does_not_answer_proves_nothing() -> None:
    # Accepted by the kernel, never greeted: a frozen pod, or one too slow to tell.
    with socket.create_server(("127.0.0.1", 0)) as mute:
        started = time.monotonic()
        found, _ = lifeline.verdict(("127.0.0.1", 42), mute.getsockname()[1])
    assert found == Verdict.UNKNOWN
    assert time.monotonic() - started < timings.LIFELINE_CONNECT_TIMEOUT + 1


def test_a_peer_whose_processes_die_is_taken_out_within_a_second() -> None:
    port = free_port()
    peer = _peer("127.0.0.2", port)
    removed: list[tuple[Node, float]] = []
    nodes = [("127.0.0.1", 1), ("127.0.0.2", peer.pid)]
    watcher = _watcher(port, nodes, removed)
    try:
        wait_until("the lifeline held", lambda: ("127.0.0.2", peer.pid) in watcher._lines, 10)
        killed = time.time()
        peer.kill()
        wait_until("the node taken out", lambda: bool(removed), timeout=5)
        ((node, since),) = removed
        assert node == ("127.0.0.2", peer.pid)
        assert killed <= since < killed + 1, f"seen {since - killed:.2f} s after the kill"
    finally:
        peer.kill()
        peer.wait()
        watcher.stop()


def test_a_removal_that_fails_is_said_and_the_other_lifelines_still_hold(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """The helper died or etcd is away while a node is taken out: that node waits for its
    keep-alive, and the watcher goes on (a raise there used to end its thread)."""
    port = free_port()
    peers = [_peer("127.0.0.2", port), _peer("127.0.0.3", port)]
    nodes = [("127.0.0.1", 1), *((f"127.0.0.{i + 2}", p.pid) for i, p in enumerate(peers))]
    removed: list[Node] = []

    def remove(node: Node, since: float) -> bool:
        if node[0] == "127.0.0.2":
            raise HelperError("the lifelines' helper did not answer")
        removed.append(node)
        return True

    rounds = iter([True])
    watcher = Watcher(
        lambda: ("127.0.0.1", 1),
        port,
        lambda: nodes,
        remove,
        lambda: next(rounds, False),
        poll=0.1,
    ).start()
    try:
        wait_until("the lifelines held", lambda: len(watcher._lines) == 2, 10)
        peers[0].kill()
        wait_until("the failure said", lambda: "could not take" in caplog.text, 5)
        peers[1].kill()
        wait_until("the other node taken out", lambda: removed == [nodes[2]], 5)
        assert watcher._thread.is_alive()
    finally:
        for peer in peers:
            peer.kill()
            peer.wait()
        watcher.stop()


def test_a_live_peer_whose_connection_dropped_stays_and_is_held_again() -> None:
    # The peer's listener stays; only the held connection breaks (a reset on the way).
    listener = socket.create_server(("127.0.0.2", 0))
    held: list[socket.socket] = []

    def serve() -> None:
        with contextlib.suppress(OSError):
            while True:
                conn, _ = listener.accept()
                conn.sendall(greeting(77))
                held.append(conn)

    threading.Thread(target=serve, daemon=True).start()
    removed: list[tuple[Node, float]] = []
    watcher = _watcher(listener.getsockname()[1], [("127.0.0.2", 77)], removed)
    try:
        wait_until("the lifeline held", lambda: len(held) == 1, 10)
        held[0].close()
        wait_until("the lifeline held again", lambda: len(held) == 2, 5)
        time.sleep(0.3)
        assert removed == []
        assert ("127.0.0.2", 77) in watcher._lines
    finally:
        watcher.stop()
        listener.close()
        for conn in held:
            conn.close()


def test_a_peer_that_ends_on_purpose_says_goodbye_and_is_not_taken_out() -> None:
    """The job done or a SIGTERM: its elastic-worker stops its lifeline; its node is its own
    business (the node-loss policy's SIGTERM row), not a death for the others to act on."""
    port = free_port()
    server = Server("127.0.0.2", port, lambda: 8).start()
    removed: list[tuple[Node, float]] = []
    watcher = _watcher(port, [("127.0.0.2", 8)], removed)
    try:
        wait_until("the lifeline held", lambda: bool(watcher._lines), 10)
        server.stop()
        wait_until("the lifeline dropped", lambda: not watcher._lines, 5)
        time.sleep(0.3)
        assert removed == []
    finally:
        watcher.stop()


def test_nodes_on_this_pods_own_address_and_stale_ones_get_no_lifeline() -> None:
    port = free_port()
    server = Server("127.0.0.2", port, lambda: 5).start()
    removed: list[tuple[Node, float]] = []
    # Own address (this pod's torchrun) and a pid the peer no longer runs.
    watcher = _watcher(port, [("127.0.0.1", 99), ("127.0.0.2", 4)], removed)
    try:
        time.sleep(0.5)
        assert watcher._lines == {}
    finally:
        watcher.stop()
        server.stop()


def test_a_round_that_cannot_be_read_at_once_is_read_again() -> None:
    """etcd away for a moment when the round starts: the next poll reads it again."""
    port = free_port()
    server = Server("127.0.0.2", port, lambda: 9).start()
    answers: list[Exception | list[Node]] = [OSError("etcd away"), [("127.0.0.2", 9)]]

    def participants() -> list[Node]:
        answer = answers.pop(0) if answers else [("127.0.0.2", 9)]
        if isinstance(answer, Exception):
            raise answer
        return answer

    rounds = iter([True])
    watcher = Watcher(
        lambda: ("127.0.0.1", 1),
        port,
        participants,
        lambda _node, _since: False,
        lambda: next(rounds, False),
        poll=0.1,
    ).start()
    try:
        wait_until("the lifeline held", lambda: ("127.0.0.2", 9) in watcher._lines, 5)
    finally:
        watcher.stop()
        server.stop()
