"""One etcd lease per agent process, kept alive by a daemon thread.

Every key the agent writes (rendezvous state, store keys) is attached to it, so nothing
outlives the agents in a shared etcd: the keys go `ttl` seconds after the last agent that
wrote them stops (or is killed). The lease is not revoked on close: a peer may still be
reading what this agent wrote last (the exit barrier's key); expiry leaves it time to.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from typing import TypeVar

from .client import EtcdClient, EtcdError

T = TypeVar("T")

log = logging.getLogger(__name__)


class AgentLease:
    def __init__(self, client: EtcdClient, ttl: int) -> None:
        self._client = client
        self._ttl = ttl
        self._lock = threading.Lock()
        self._id = 0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    @property
    def ttl(self) -> int:
        return self._ttl

    def id(self) -> int:
        """The live lease (granted on first use, re-granted if etcd let it expire, e.g.
        while it was unreachable for longer than the TTL)."""
        with self._lock:
            if self._id == 0:
                self._id = self._client.lease_grant(self._ttl)
                log.debug("etcd lease %x granted, ttl %d s", self._id, self._ttl)
            if self._thread is None:
                self._thread = threading.Thread(
                    target=self._keep_alive, name="etcd-v3-lease", daemon=True
                )
                self._thread.start()
            return self._id

    def write(self, op: Callable[[int], T]) -> T:
        """Run a write `op(lease_id)`; if etcd no longer knows the lease (it lapsed while
        etcd was unreachable, or was revoked), grant a new one and run it once more."""
        lease = self.id()
        try:
            return op(lease)
        except EtcdError as exc:
            if "lease not found" not in str(exc):
                raise
            log.warning("etcd lease %x is gone; granting a new one", lease)
            with self._lock:
                if self._id == lease:
                    self._id = 0
        return op(self.id())

    def _keep_alive(self) -> None:
        # A third of the TTL: two renewals may fail before the lease lapses.
        while not self._stop.wait(max(self._ttl / 3, 0.5)):
            with self._lock:
                lease = self._id
            if lease == 0:
                continue
            try:
                if self._client.lease_keepalive(lease) <= 0:
                    log.warning("etcd lease %x expired; a new one is granted on next write", lease)
                    with self._lock:
                        if self._id == lease:
                            self._id = 0
            except EtcdError as exc:
                log.warning("etcd lease %x: keep-alive failed: %s", lease, exc)

    def stop(self) -> None:
        """Stop renewing; the keys expire `ttl` seconds later."""
        self._stop.set()
