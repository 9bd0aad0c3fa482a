"""A pod's own lifeline: a TCP port that greets each peer with this pod's torchrun's pid
and holds the connection until the peer lets go or this process dies (messages.py says
what it sends). Served on the chart's `rendezvous.lifeline.port`."""

from __future__ import annotations

import contextlib
import logging
import selectors
import socket
import threading
from collections.abc import Callable

from elastic_worker import timings
from elastic_worker.recovery.lifelines.messages import BYE, greeting
from elastic_worker.settings.config import Config

logger = logging.getLogger(__name__)


class LifelineServer:
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

    def start(self) -> LifelineServer:
        self._thread.start()
        return self

    def stop(self) -> None:
        """Say goodbye on every lifeline, then close: an elastic-worker that ends on purpose
        (the job done, a SIGTERM) is no death; its own exit handles its node (policy.py)."""
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
            conn.settimeout(timings.LIFELINE_GREETING_TIMEOUT)
            conn.sendall(greeting(self._pid()))
            conn.setblocking(False)
        except OSError:
            conn.close()
            return
        self._sel.register(conn, selectors.EVENT_READ)


def serve(
    config: Config, local_addr: str | None, pid: Callable[[], int | None]
) -> LifelineServer | None:
    """This pod's lifeline, on `--local-addr` (every address without one); None when off
    or the port is taken (said once: the keep-alive remains)."""
    if not config.lifeline:
        return None
    try:
        return LifelineServer(local_addr or "0.0.0.0", config.lifeline_port, pid).start()
    except OSError as exc:
        logger.warning(
            "lifeline: cannot listen on port %d (%s): a lost peer leaves the round when its "
            "keep-alive lapses",
            config.lifeline_port,
            exc,
        )
        return None
