"""Lifelines: a peer whose processes die is taken out of the rendezvous round at once.

A pod whose processes are SIGKILLed (an OOM kill, `kubectl delete --force`, a crash of
the container) leaves its node in torch's round until its keep-alive lapses (3 s with
elastic-worker's defaults), and the survivors notice only at their next 1 s poll; that is
most of what a re-form costs. Yet the kernel closes a dead process's sockets at once.

So each elastic-worker serves a lifeline (server.py) that greets with its torchrun's pid
and then holds the connection. When a round starts (a new line in the attempt log), each
elastic-worker reads the round's participants and holds a lifeline to every other one
(LifelineWatcher, here). When one closes, the peer is asked again: refused, or another
torchrun answering, and that node is gone for good, which the node-loss policy hears
(recovery/policy.py: it takes the node out of the round). A connection that times out
proves nothing (a node that vanished sends no reset): the keep-alive and the silent-loss
detection (recovery/lossdetect.py) cover that case.
"""

from __future__ import annotations

import contextlib
import logging
import selectors
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

from elastic_worker import timings
from elastic_worker.recovery.lifelines.messages import greeted_pid
from elastic_worker.torchcompat import RdzvNode

logger = logging.getLogger(__name__)

READ_TRIES = 5  # reads of a new round's participants before waiting for the next round


class Verdict:
    GONE = "gone"  # refused, or another torchrun answers: the node will never beat again
    ALIVE = "alive"  # the same torchrun answers
    UNKNOWN = "unknown"  # no answer: proves nothing


def ask(
    addr: str, port: int, timeout: float = timings.LIFELINE_CONNECT_TIMEOUT
) -> tuple[socket.socket, int | None]:
    """A lifeline to `addr`: the connection and the pid it greeted with. Raises OSError:
    ConnectionError when nothing serves there any more (refused, or closed or reset
    before the greeting: the listener died with this connection in its backlog)."""
    sock = socket.create_connection((addr, port), timeout=timeout)
    try:
        pid = greeted_pid(sock.makefile("rb").readline(256))
    except (OSError, ValueError, KeyError, TypeError):
        sock.close()
        raise
    return sock, pid


def verdict(node: RdzvNode, port: int) -> tuple[str, socket.socket | None]:
    """Asked again after its lifeline closed: is `node`'s torchrun gone?"""
    addr, pid = node
    try:
        sock, greeted = ask(addr, port)
    except (ConnectionRefusedError, ConnectionResetError, ConnectionAbortedError):
        return Verdict.GONE, None
    except (OSError, ValueError, KeyError, TypeError):  # a timeout, no route: no proof
        return Verdict.UNKNOWN, None
    if greeted == pid:
        return Verdict.ALIVE, sock
    sock.close()
    return Verdict.GONE, None


@dataclass
class _Line:
    node: RdzvNode
    sock: socket.socket


class LifelineWatcher:
    """Holds a lifeline to every other participant of the current round; takes a node
    whose lifeline broke out of the round with `remove(node, since)` (`since`: the time,
    time.time(), the lifeline closed) once `verdict` says it is gone.

    `participants()` reads the round's nodes; it is called when `new_round()` says a round
    may have started (elastic-worker: a new line in the attempt log)."""

    def __init__(
        self,
        own: Callable[[], RdzvNode | None],
        port: int,
        participants: Callable[[], list[RdzvNode]],
        remove: Callable[[RdzvNode, float], bool],
        new_round: Callable[[], bool],
        *,
        poll: float = timings.LIFELINE_POLL,
        close: Callable[[], None] | None = None,
        leave: Callable[[int], bool] | None = None,
    ) -> None:
        self.own, self.port = own, port
        self.participants, self.remove, self.new_round = participants, remove, new_round
        self.poll = poll
        self._close = close  # at stop(): what participants() and remove() hold
        # This pod's own node out of the round (its torchrun's pid), the way this watcher
        # reads the round: a SIGTERMed pod's leave (launch.py).
        self.leave = leave
        self._lines: dict[RdzvNode, _Line] = {}
        self._sel = selectors.DefaultSelector()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="lifeline-watch", daemon=True)

    def start(self) -> LifelineWatcher:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5)
        for line in list(self._lines.values()):
            self._drop(line)
        self._sel.close()
        if self._close is not None:
            self._close()

    def _run(self) -> None:
        tries = 0  # reads of the new round left (etcd away: a few, then the next round)
        while not self._stop.is_set():
            if self.new_round():
                tries = READ_TRIES
            if tries:
                tries -= 1
                try:
                    self._hold(self.participants())
                    tries = 0
                except Exception as exc:  # noqa: BLE001 - etcd's and torch's errors
                    logger.debug("lifelines: could not read the round: %s", exc)
            if not self._lines:
                self._stop.wait(self.poll)
                continue
            for key, _ in self._sel.select(timeout=self.poll):
                line: _Line = key.data
                try:
                    data = line.sock.recv(64)
                except BlockingIOError:
                    continue
                except OSError:
                    data = b""
                if data:  # a goodbye: that elastic-worker ends on purpose, its node is its own
                    self._drop(line)
                else:
                    self._broken(line, time.time())

    def _hold(self, nodes: list[RdzvNode]) -> None:
        own = self.own()
        if own is None:  # between two torchruns: the next round is read when it starts
            return
        wanted = {n for n in nodes if n[0] != own[0]}
        for node in list(self._lines):
            if node not in wanted:
                self._drop(self._lines[node])
        for node in wanted - self._lines.keys():
            try:
                sock, pid = ask(node[0], self.port)
            except (OSError, ValueError, KeyError, TypeError) as exc:
                logger.debug("lifelines: no lifeline to %s: %s", node, exc)
                continue
            if pid != node[1]:  # not that torchrun any more: its own exit is its business
                sock.close()
                continue
            self._add(node, sock)

    def _add(self, node: RdzvNode, sock: socket.socket) -> None:
        sock.setblocking(False)
        line = _Line(node, sock)
        self._lines[node] = line
        self._sel.register(sock, selectors.EVENT_READ, line)

    def _drop(self, line: _Line) -> None:
        self._lines.pop(line.node, None)
        with contextlib.suppress(KeyError, ValueError):
            self._sel.unregister(line.sock)
        line.sock.close()

    def _broken(self, line: _Line, since: float) -> None:
        self._drop(line)
        found, sock = verdict(line.node, self.port)
        if found == Verdict.ALIVE and sock is not None:
            self._add(line.node, sock)  # a connection lost on the way; the node is there
            return
        if found == Verdict.UNKNOWN:
            logger.debug("lifelines: %s:%d closed and does not answer", *line.node)
            return
        logger.info(
            "the torchrun of %s (pid %d) is gone (its lifeline closed): taking its node out "
            "of the round",
            *line.node,
        )
        try:
            self.remove(line.node, since)
        except Exception as exc:  # noqa: BLE001 - the helper's, etcd's, torch's: the keep-alive remains
            logger.warning("lifelines: could not take %s:%d out of the round: %s", *line.node, exc)
