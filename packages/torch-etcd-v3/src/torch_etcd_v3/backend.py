"""The rendezvous state in one etcd key, written by compare-and-set on its revision."""

from __future__ import annotations

import random
import time

from torch.distributed.elastic.rendezvous.api import RendezvousConnectionError
from torch.distributed.elastic.rendezvous.dynamic_rendezvous import RendezvousBackend, Token

from .client import EtcdClient, EtcdError
from .lease import AgentLease

#: After a lost compare-and-set, wait up to this long (at random), doubling with each loss
#: in a row up to BACKOFF_MAX_S, then read the state afresh. torch's join loop retries a
#: lost write at once, so with N agents joining together every winning write costs about
#: N losing ones; at 128-256 agents the heartbeats of the agents already in the round no
#: longer get through within keep-alive interval x attempts, the others' sanitizer evicts
#: them, they join again, and the rendezvous never completes (docs/recovery.md,
#: "Rendezvous at scale"). The wait spreads the retries; an uncontended write never waits.
BACKOFF_S = 0.01
#: Well below the shortest keep-alive window (1 s x 3), so a heartbeat still lands in it.
BACKOFF_MAX_S = 0.5


class EtcdV3RendezvousBackend(RendezvousBackend):
    """State at `<key_prefix>/rendezvous/<run_id>`; the token is the key's mod_revision.
    Each write attaches the key to the writer's lease: every agent rewrites the state on
    its heartbeat, so the key lives while any agent does, and goes `lease_ttl` after."""

    def __init__(self, client: EtcdClient, key: bytes, lease: AgentLease) -> None:
        self._client = client
        self._key = key
        self._lease = lease
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
        time.sleep(random.uniform(0, min(BACKOFF_MAX_S, BACKOFF_S * 2**self._lost)))
        current = self.get_state()  # what the others wrote meanwhile, not the txn's copy
        return None if current is None else (*current, False)
