"""This node's membership: its own lease, kept alive from a thread (the heartbeat: a
keep-alive of a few bytes, whatever the size of the job), and the key under it.

The lease is granted when the node first joins, not before: a handler made only to ask
(elastic-worker's `is_closed`, a tool) is no node of the job. Its TTL is torch's window
for a silent node (keep_alive_interval x keep_alive_max_attempt), renewed every
keep_alive_interval. A lease etcd no longer knows (the node was cut off for longer than
the TTL, or revoked) is replaced at the next join, under a new node id.

The same thread keeps the lease of the node's round alive (the decision's: it lasts as
long as a member of the round lives), less often (ROUND_TTL / 3).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

from ..client import EtcdClient, EtcdError

log = logging.getLogger(__name__)

#: Seconds a round's decision outlives the last member that kept its lease alive.
ROUND_TTL = 60
#: After a failed keep-alive, the next one this fraction of the interval later.
RETRY = 0.2


class Membership:
    def __init__(self, client: EtcdClient, ttl: int, interval: float) -> None:
        self._client = client
        self._ttl = ttl
        self._interval = interval
        self._lock = threading.Lock()
        self._lease = 0
        self._round_lease = 0
        self._round_renewed = 0.0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        #: Called (from the keep-alive thread) when etcd no longer knows the lease: a node
        #: waiting for a decision under it must join again.
        self.on_lost: Callable[[], None] | None = None

    @property
    def ttl(self) -> int:
        return self._ttl

    def node(self) -> str | None:
        """This node's id (its lease in hex), None before it joined or once it left."""
        with self._lock:
            return f"{self._lease:x}" if self._lease else None

    def lease(self) -> int:
        """The node's lease, granted now if it has none."""
        with self._lock:
            if self._lease == 0:
                self._lease = self._client.lease_grant(self._ttl)
                log.debug("etcd-lease: lease %x granted, ttl %d s", self._lease, self._ttl)
            if self._thread is None:
                self._thread = threading.Thread(
                    target=self._keep_alive, name="etcd-lease-keepalive", daemon=True
                )
                self._thread.start()
            return self._lease

    def lost(self, lease: int) -> None:
        """etcd no longer knows `lease`: the next join grants another."""
        with self._lock:
            if self._lease != lease:
                return
            self._lease = 0
            on_lost = self.on_lost
        if on_lost is not None:
            on_lost()

    def keep_round(self, lease: int) -> None:
        """Keep the lease of this node's round alive too (0: none)."""
        with self._lock:
            self._round_lease, self._round_renewed = lease, time.monotonic()

    def _keep_alive(self) -> None:
        """Every interval, counted from the start of the renewal before (a slow answer
        does not push the next one later: the TTL is 3 intervals, and waiting a whole
        interval after each slow answer spent that margin on a loaded etcd); after a
        failure, again within a fraction of it (etcd answers "waiting for the applied
        index took too long" when its apply lags a burst of writes: a renewal retried soon
        still lands within the TTL). One renewal waits at most an interval."""
        wait = self._interval
        while not self._stop.wait(wait):
            started = time.monotonic()
            with self._lock:
                lease, round_lease = self._lease, self._round_lease
                renew_round = round_lease and started - self._round_renewed >= (ROUND_TTL / 3)
            try:
                if lease and self._client.lease_keepalive(lease, self._interval) <= 0:
                    log.warning("etcd-lease: lease %x expired; the node joins anew", lease)
                    self.lost(lease)
                if renew_round:
                    self._client.lease_keepalive(round_lease, self._interval)
                    with self._lock:
                        self._round_renewed = time.monotonic()
                wait = max(0.0, self._interval - (time.monotonic() - started))
            except EtcdError as exc:
                log.info("etcd-lease: keep-alive failed, again in a moment: %s", exc)
                wait = self._interval * RETRY

    def revoke(self) -> None:
        """Leave: the lease and the node's key go now (not at the end of the TTL)."""
        with self._lock:
            lease, self._lease, self._round_lease = self._lease, 0, 0
        if lease:
            try:
                self._client.lease_revoke(lease)
            except EtcdError as exc:  # its TTL ends it anyway
                log.info("etcd-lease: could not revoke lease %x: %s", lease, exc)

    def stop(self) -> None:
        self._stop.set()
