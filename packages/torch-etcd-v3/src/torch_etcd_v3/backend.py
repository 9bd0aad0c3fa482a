"""The rendezvous state in one etcd key, written by compare-and-set on its revision."""

from __future__ import annotations

from torch.distributed.elastic.rendezvous.api import RendezvousConnectionError
from torch.distributed.elastic.rendezvous.dynamic_rendezvous import RendezvousBackend, Token

from .client import EtcdClient, EtcdError
from .lease import AgentLease


class EtcdV3RendezvousBackend(RendezvousBackend):
    """State at `<key_prefix>/rendezvous/<run_id>`; the token is the key's mod_revision.
    Each write attaches the key to the writer's lease: every agent rewrites the state on
    its heartbeat, so the key lives while any agent does, and goes `lease_ttl` after."""

    def __init__(self, client: EtcdClient, key: bytes, lease: AgentLease) -> None:
        self._client = client
        self._key = key
        self._lease = lease

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
            written, kv, at = self._lease.write(
                lambda lease: self._client.put_if(self._key, state, lease, revision)
            )
        except EtcdError as exc:
            raise RendezvousConnectionError(
                f"etcd-v3 rendezvous: writing the state failed: {exc}"
            ) from exc
        if written:
            return state, at, True  # the put's revision is the key's new mod_revision
        return None if kv is None else (kv.value, kv.mod_revision, False)
