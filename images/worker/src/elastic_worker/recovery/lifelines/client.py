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

The participants and the removal are torch internals read through leave.py. With a warm
server (warm.py: torch imported there) they run in one helper process forked from it for
the whole torchrun (`python -m elastic_worker.recovery.lifelines.client ops`): this
process never imports torch. Without one, torch's rendezvous module is imported here
(about 0.2 GB, 0.75 s of CPU beside torchrun's own start: four nodes on two cores trained
together 1.1-1.3 s later).
"""

from __future__ import annotations

import contextlib
import json
import logging
import select
import selectors
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from elastic_worker.launch.attempt_line import Tail
from elastic_worker.settings.config import Config

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
        try:
            self.remove(line.node, since)
        except Exception as exc:  # noqa: BLE001 - the helper's, etcd's, torch's: the keep-alive remains
            logger.warning("lifelines: could not take %s:%d out of the round: %s", *line.node, exc)


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
    warm_socket: str | None = None,
    on_removed: Callable[[Node], None] | None = None,
) -> Watcher:
    """Lifelines to the other nodes of each round of `rdzv_id` while this torchrun runs;
    `on_removed(node)` after this pod took a node out (an Event). With `warm_socket` (the
    warm server's), the round is read and a node taken out in a helper forked from it."""
    ops: _Ops = (
        _InProcess(config, rdzv_id) if warm_socket is None else _Helper(warm_socket, rdzv_id)
    )
    addr = local_addr or socket.getfqdn()

    def own() -> Node | None:
        p = pid()
        return None if p is None else (addr, p)

    def remove(node: Node, since: float) -> bool:
        removed = ops.remove(node, since)
        if removed and on_removed is not None:
            on_removed(node)
        return removed

    tail = Tail(attempt_log)
    watcher = Watcher(
        own,
        config.lifeline_port,
        ops.participants,
        remove,
        lambda: bool(tail.lines()),
        close=ops.close,
        leave=lambda own_pid: ops.leave((addr, own_pid)),
    )
    return watcher.start()


class _Ops(Protocol):
    """Reads the round's participants and takes a node out of it."""

    def participants(self) -> list[Node]: ...

    def remove(self, node: Node, since: float) -> bool:
        """Take another pod's node out, dead since `since` (leave.leave_with's guard)."""
        ...

    def leave(self, node: Node) -> bool:
        """Take this pod's own node out (a SIGTERM)."""
        ...

    def close(self) -> None: ...


class _InProcess:
    """Both here, with torch's rendezvous module imported in this process while torchrun
    starts, so that the lifelines hold from the first round's start."""

    def __init__(self, config: Config, rdzv_id: str) -> None:
        from elastic_worker.recovery import epochs as epoch  # noqa: PLC0415 - torch, only without a warm server
        from elastic_worker.recovery import leave  # noqa: PLC0415 - torch, only without a warm server

        leave.preload()
        self._leave, self._epoch = leave, epoch
        self._config, self._rdzv_id = config, rdzv_id
        self._handler: list[Any] = []

    def _made(self) -> Any:
        if not self._handler:
            self._handler.append(self._epoch.handler(self._config, self._rdzv_id))
        return self._handler[0]

    def participants(self) -> list[Node]:
        return self._leave.participants(self._made())

    def remove(self, node: Node, since: float) -> bool:
        return bool(self._leave.leave_with(self._made, self._rdzv_id, *node, dead_since=since))

    def leave(self, node: Node) -> bool:
        return bool(self._leave.leave_with(self._made, self._rdzv_id, *node))

    def close(self) -> None:
        """Nothing to release: torch's handler lives as long as this process."""


HELPER_TIMEOUT = 15.0  # seconds for one answer: a removal retries for up to leave.TIMEOUT


class HelperError(RuntimeError):
    """The lifelines' helper did not answer, or answered with an error."""


class _Helper:
    """Both in one process forked from the warm server (torch imported there) through the
    warm start client, for as long as this torchrun runs: a line in, a JSON line out
    (main() below). It is started at once, so that it has imported torch's rendezvous
    module (0.1 s) before the first round; one that died is started again at the next
    request."""

    def __init__(self, socket_path: str, rdzv_id: str) -> None:
        self._argv = [sys.executable, "-m", "elastic_worker.warm.client", socket_path]
        self._argv += ["-m", "elastic_worker.recovery.lifelines.client", "ops", rdzv_id]
        self._lock = threading.Lock()
        self._proc: subprocess.Popen[bytes] | None = None
        self._said = False
        with self._lock:
            self._start()

    def _start(self) -> subprocess.Popen[bytes]:
        self._proc = subprocess.Popen(self._argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE)
        return self._proc

    def _ask(self, request: str) -> dict[str, Any]:
        with self._lock:
            proc = self._proc
            if proc is None or proc.poll() is not None:
                proc = self._start()
            assert proc.stdin is not None and proc.stdout is not None
            try:
                proc.stdin.write(request.encode() + b"\n")
                proc.stdin.flush()
                readable, _, _ = select.select([proc.stdout], [], [], HELPER_TIMEOUT)
                line = proc.stdout.readline() if readable else b""
            except OSError:
                line = b""
            if not line:
                try:  # its output closed: the client ends as the helper did, a moment later
                    ended: int | None = proc.wait(1)
                except subprocess.TimeoutExpired:
                    ended = None  # alive but mute: a timeout
                self._end(proc)
                if ended is not None and not self._said:
                    self._said = True  # once: each round asks again, and says it on stderr
                    logger.warning(
                        "lifelines: the helper that reads the round ended (exit %d): "
                        "a lost peer may leave the round only when its keep-alive lapses",
                        ended,
                    )
                raise HelperError(f"the lifelines' helper did not answer {request!r}")
        try:
            reply: dict[str, Any] = json.loads(line)
        except ValueError as exc:
            raise HelperError(f"the lifelines' helper answered {line!r}") from exc
        if "error" in reply:
            raise HelperError(reply["error"])
        return reply

    def participants(self) -> list[Node]:
        return [(str(a), int(p)) for a, p in self._ask("participants")["nodes"]]

    def remove(self, node: Node, since: float) -> bool:
        return bool(self._ask(f"remove {node[0]} {node[1]} {since!r}")["removed"])

    def leave(self, node: Node) -> bool:
        return bool(self._ask(f"leave {node[0]} {node[1]}")["removed"])

    def _end(self, proc: subprocess.Popen[bytes]) -> None:
        with contextlib.suppress(OSError):
            proc.kill()
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(5)
        self._proc = None

    def close(self) -> None:
        with self._lock:
            proc, self._proc = self._proc, None
        if proc is None:
            return
        with contextlib.suppress(OSError):
            assert proc.stdin is not None
            proc.stdin.close()  # the helper ends at the end of its input
        try:
            proc.wait(5)
        except subprocess.TimeoutExpired:
            self._end(proc)


def main(argv: Sequence[str] | None = None) -> int:
    """`ops RDZV_ID`: the lifelines' helper (_Helper). Reads `participants` (answers
    {"nodes": [[addr, pid], ...]}), `remove ADDR PID SINCE` (answers {"removed": bool},
    leave.leave_with with `dead_since` SINCE) and `leave ADDR PID` (the same, this pod's own
    node) until its input ends; {"error": ...} when one fails. Its settings are
    elastic-worker's environment (a warm child gets it)."""
    args = list(sys.argv[1:] if argv is None else argv)
    if len(args) != 2 or args[0] != "ops":
        print(
            "usage: python -m elastic_worker.recovery.lifelines.client ops RDZV_ID", file=sys.stderr
        )
        return 2
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter("elastic-worker: %(message)s"))
    own = logging.getLogger("elastic_worker")
    own.handlers[:], own.propagate = [handler], False
    own.setLevel(logging.WARNING)
    logging.getLogger("elastic_worker.recovery.leave").setLevel(logging.INFO)  # "took ... out"
    from elastic_worker.settings import config  # noqa: PLC0415

    try:
        cfg = config.load(["python", "train.py"])  # elastic-worker's environment
    except config.ConfigError as exc:  # elastic-worker itself started with these: not here
        print(f"elastic-worker: the lifelines' helper: {exc}", file=sys.stderr)
        return 2
    ops = _InProcess(cfg, args[1])
    with contextlib.suppress(Exception):  # torch's handler before the first round: not needed yet
        ops.participants()
    for line in sys.stdin:
        words = line.split()
        reply: dict[str, Any]
        try:
            if words == ["participants"]:
                reply = {"nodes": ops.participants()}
            elif len(words) == 4 and words[0] == "remove":
                node = (words[1], int(words[2]))
                reply = {"removed": ops.remove(node, float(words[3]))}
            elif len(words) == 3 and words[0] == "leave":
                reply = {"removed": ops.leave((words[1], int(words[2])))}
            else:
                reply = {"error": f"unknown request {line.strip()!r}"}
        except Exception as exc:  # noqa: BLE001 - etcd's and torch's errors: said, not fatal
            reply = {"error": f"{type(exc).__name__}: {exc}"}
        print(json.dumps(reply), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
