"""The rendezvous state in one etcd key, written by compare-and-set on its revision."""

from __future__ import annotations

import random
import time
from dataclasses import dataclass

from torch.distributed.elastic.rendezvous.api import RendezvousConnectionError
from torch.distributed.elastic.rendezvous.dynamic_rendezvous import RendezvousBackend, Token

from .client import EtcdClient, EtcdError
from .lease import AgentLease

#: Nodes per step of the first wait after a lost compare-and-set (below).
NODES_PER_STEP = 32


@dataclass(frozen=True)
class Backoff:
    """After a lost compare-and-set, wait at random up to `first` x 2^n (n: losses in a
    row), never above `most`, then read the state afresh. torch's join loop retries a lost
    write at once, so with N agents joining together every winning write costs about N
    losing ones; at 128-256 agents the heartbeats of the agents already in the round no
    longer get through within keep-alive interval x attempts, the others' sanitizer evicts
    them, they join again, and the rendezvous never completes (docs/recovery.md,
    "Rendezvous at scale"). The wait spreads the retries; an uncontended write never waits.
    """

    first: float = 0.01
    most: float = 0.5

    @classmethod
    def for_job(cls, max_nodes: int, keep_alive_interval: float) -> Backoff:
        """Scaled to the job: `first` 10 ms per 32 nodes (that many may contend at a
        bring-up), `most` an eighth of the keep-alive interval, not below 0.5 s, so a
        heartbeat still lands in its window of interval x attempts. A job of up to 32
        nodes with a 1-4 s interval gets 10 ms and 0.5 s. Measured with 256 agents
        (keep-alive 8 s) on 2 cores: 10 ms/0.5 s joined in 8.1-8.8 s, 80 ms/1 s in
        5.8-6.4 s, with a third of the lost writes."""
        steps = max(1, -(-max_nodes // NODES_PER_STEP))
        return cls(first=cls.first * steps, most=max(cls.most, keep_alive_interval / 8))

    def wait(self, lost_in_row: int) -> float:
        return random.uniform(0, min(self.most, self.first * 2**lost_in_row))


class EtcdV3RendezvousBackend(RendezvousBackend):
    """State at `<key_prefix>/rendezvous/<run_id>`; the token is the key's mod_revision.
    Each write attaches the key to the writer's lease: every agent rewrites the state on
    its heartbeat, so the key lives while any agent does, and goes `lease_ttl` after."""

    def __init__(
        self, client: EtcdClient, key: bytes, lease: AgentLease, backoff: Backoff | None = None
    ) -> None:
        self._client = client
        self._key = key
        self._lease = lease
        self._backoff = backoff or Backoff()
        self._lost = 0  # compare-and-sets lost in a row

    @property
    def name(self) -> str:
        return "etcd-v3"

    def get_state(self) -> tuple[bytes, Token] | None:
        try:
            kv, _ = self._client.get(self._key)
        except EtcdError as exc:
            raise RendezvousConnectionError(
                f"etcd-v3 rendezvous: reading the state failed: {exc}"
            ) from exc
        return None if kv is None else (kv.value, kv.mod_revision)

    def set_state(
        self, state: bytes, token: Token | None = None
    ) -> tuple[bytes, Token, bool] | None:
        revision: int | None = None
        if token is not None:
            try:
                revision = int(token)
            except (TypeError, ValueError):
                current = self.get_state()
                return None if current is None else (*current, False)
        try:
            written, _, at = self._lease.write(
                lambda lease: self._client.put_if(self._key, state, lease, revision)
            )
        except EtcdError as exc:
            raise RendezvousConnectionError(
                f"etcd-v3 rendezvous: writing the state failed: {exc}"
            ) from exc
        if written:
            self._lost = 0
            return state, at, True  # the put's revision is the key's new mod_revision
        self._lost += 1
        time.sleep(self._backoff.wait(self._lost))
        current = self.get_state()  # what the others wrote meanwhile, not the txn's copy
        return None if current is None else (*current, False)
