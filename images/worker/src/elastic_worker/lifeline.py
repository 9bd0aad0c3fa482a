"""Lifelines: a peer whose processes die is taken out of the rendezvous round at once.

A pod whose processes are SIGKILLed (an OOM kill, `kubectl delete --force`, a crash of
the container) leaves its node in torch's round until its keep-alive lapses (3 s with
elastic-worker's defaults), and the survivors notice only at their next 1 s poll; that is
most of what a re-form costs. Yet the kernel closes a dead process's sockets at once.

So each elastic-worker serves a lifeline, a TCP port (the chart's `rendezvous.lifeline`)
that greets with its torchrun's pid and then holds the connection. When a round starts
(a new line in the attempt log), each elastic-worker reads the round's participants and
holds a lifeline to every other one. When one closes, the peer is asked again: refused,
or another torchrun answering, and that node is gone for good. This pod then takes the
node out of the round with torch's own state machine (leave.py), unless the node's
heartbeat is newer than the close (a new torchrun that got the same pid). A connection
that times out proves nothing (a node that vanished sends no reset): the keep-alive and
the silent-loss detection (liveness.py) cover that case.

The participants and the removal are torch internals read through leave.py, so torch's
rendezvous module is imported here (about 0.2 GB of memory in this process).
"""

from __future__ import annotations

import contextlib
import json
import logging
import selectors
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from elastic_worker.attempt import Tail
from elastic_worker.config import Config

logger = logging.getLogger(__name__)

CONNECT_TIMEOUT = 1.0  # a peer that does not answer within it may be gone or slow: no proof
POLL = 0.5  # seconds between looks for a new round (the attempt log)
READ_TRIES = 5  # reads of a new round's participants before waiting for the next round

Node = tuple[str, int]  # torch's node of a torchrun: (address, pid); local_id is 0
BYE = b"bye\n"  # the only thing a lifeline sends after its greeting


def greeting(pid: int | None) -> bytes:
    return (json.dumps({"pid": pid}) + "\n").encode()


class Server:
    """Greets each connection with `pid()` (this pod's torchrun, None between two) and
    holds it until the peer closes it or this process dies."""

    def __init__(self, host: str, port: int, pid: Callable[[], int | None]) -> None:
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        # Every peer connects when a round starts: room for a large job's at once.
        self._sock = socket.create_server((host, port), family=family, backlog=1024)
        self._sock.setblocking(False)
        self.port = self._sock.getsockname()[1]
        self._pid = pid
        self._sel = selectors.DefaultSelector()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._serve, name="lifeline-server", daemon=True)

    def start(self) -> Server:
        self._thread.start()
        return self

    def stop(self) -> None:
        """Say goodbye on every lifeline, then close: an elastic-worker that ends on purpose
        (the job done, a SIGTERM) is no death; its own exit handles its node (leave.py)."""
        self._stop.set()
        self._thread.join(timeout=2)
        for key in list(self._sel.get_map().values()):
            sock: socket.socket = key.fileobj  # type: ignore[assignment]
            with contextlib.suppress(OSError):
                if sock is not self._sock:
                    sock.send(BYE)
            with contextlib.suppress(OSError):
                sock.close()
        self._sel.close()

    def _serve(self) -> None:
        self._sel.register(self._sock, selectors.EVENT_READ)
        while not self._stop.is_set():
            for key, _ in self._sel.select(timeout=0.2):
                sock: socket.socket = key.fileobj  # type: ignore[assignment]
                if sock is self._sock:
                    self._accept()
                    continue
                try:
                    data = sock.recv(64)
                except OSError:
                    data = b""
                if not data:  # the peer let go
                    self._sel.unregister(sock)
                    sock.close()

    def _accept(self) -> None:
        try:
            conn, _ = self._sock.accept()
        except OSError:
            return
        try:
            conn.settimeout(CONNECT_TIMEOUT)
            conn.sendall(greeting(self._pid()))
            conn.setblocking(False)
        except OSError:
            conn.close()
            return
        self._sel.register(conn, selectors.EVENT_READ)


class Verdict:
    GONE = "gone"  # refused, or another torchrun answers: the node will never beat again
    ALIVE = "alive"  # the same torchrun answers
    UNKNOWN = "unknown"  # no answer: proves nothing


def ask(addr: str, port: int, timeout: float = CONNECT_TIMEOUT) -> tuple[socket.socket, int | None]:
    """A lifeline to `addr`: the connection and the pid it greeted with. Raises OSError:
    ConnectionError when nothing serves there any more (refused, or closed or reset
    before the greeting: the listener died with this connection in its backlog)."""
    sock = socket.create_connection((addr, port), timeout=timeout)
    try:
        line = sock.makefile("rb").readline(256)
        if not line.endswith(b"\n"):
            raise ConnectionResetError("closed before its greeting")
        pid = json.loads(line)["pid"]
    except (OSError, ValueError, KeyError, TypeError):
        sock.close()
        raise
    return sock, pid if isinstance(pid, int) else None


def verdict(node: Node, port: int) -> tuple[str, socket.socket | None]:
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
    node: Node
    sock: socket.socket


class Watcher:
    """Holds a lifeline to every other participant of the current round; takes a node
    whose lifeline broke out of the round with `remove(node, since)` (`since`: the time,
    time.time(), the lifeline closed) once `verdict` says it is gone.

    `participants()` reads the round's nodes; it is called when `new_round()` says a round
    may have started (elastic-worker: a new line in the attempt log)."""

    def __init__(
        self,
        own: Callable[[], Node | None],
        port: int,
        participants: Callable[[], list[Node]],
        remove: Callable[[Node, float], bool],
        new_round: Callable[[], bool],
        *,
        poll: float = POLL,
    ) -> None:
        self.own, self.port = own, port
        self.participants, self.remove, self.new_round = participants, remove, new_round
        self.poll = poll
        self._lines: dict[Node, _Line] = {}
        self._sel = selectors.DefaultSelector()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="lifeline-watch", daemon=True)

    def start(self) -> Watcher:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5)
        for line in list(self._lines.values()):
            self._drop(line)
        self._sel.close()

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

    def _hold(self, nodes: list[Node]) -> None:
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

    def _add(self, node: Node, sock: socket.socket) -> None:
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
        self.remove(line.node, since)


def serve(config: Config, local_addr: str | None, pid: Callable[[], int | None]) -> Server | None:
    """This pod's lifeline, on `--local-addr` (every address without one); None when off
    or the port is taken (said once: the keep-alive remains)."""
    if not config.lifeline:
        return None
    try:
        return Server(local_addr or "0.0.0.0", config.lifeline_port, pid).start()
    except OSError as exc:
        logger.warning(
            "lifeline: cannot listen on port %d (%s): a lost peer leaves the round when its "
            "keep-alive lapses",
            config.lifeline_port,
            exc,
        )
        return None


def watch(
    config: Config,
    rdzv_id: str,
    local_addr: str | None,
    pid: Callable[[], int | None],
    attempt_log: Path,
    *,
    on_removed: Callable[[Node], None] | None = None,
) -> Watcher:
    """Lifelines to the other nodes of each round of `rdzv_id` while this torchrun runs;
    `on_removed(node)` after this pod took a node out (an Event)."""
    from elastic_worker import epoch, leave  # noqa: PLC0415 - torch, when a round starts

    # torch's rendezvous module, imported while torchrun starts and rendezvouses, so that
    # lifelines are held from the first round's start. Its CPU (0.75 s here) is what the
    # lifelines cost at bring-up: four nodes on two cores trained together 1-1.5 s later
    # (docs/recovery.md, Lifelines); nothing on a node with cores to spare.
    leave.preload()
    handler: list[Any] = []
    addr = local_addr or socket.getfqdn()

    def made() -> Any:
        if not handler:
            handler.append(epoch.handler(config, rdzv_id))
        return handler[0]

    def own() -> Node | None:
        p = pid()
        return None if p is None else (addr, p)

    def remove(node: Node, since: float) -> bool:
        removed = leave.leave_with(made, rdzv_id, *node, dead_since=since)
        if removed and on_removed is not None:
            on_removed(node)
        return removed

    tail = Tail(attempt_log)
    return Watcher(
        own,
        config.lifeline_port,
        lambda: leave.participants(made()),
        remove,
        lambda: bool(tail.lines()),
    ).start()
