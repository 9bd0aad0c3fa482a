"""The rendezvous state in one etcd key, written by compare-and-set on its revision."""

from __future__ import annotations

from torch.distributed.elastic.rendezvous.api import RendezvousConnectionError
from torch.distributed.elastic.rendezvous.dynamic_rendezvous import RendezvousBackend, Token

from .client import EtcdClient, EtcdError, KeyValue, b64, unb64
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
            raise RendezvousConnectionError(f"etcd-v3 rendezvous: reading the state failed: {exc}") from exc
        return None if kv is None else (kv.value, kv.mod_revision)

    def set_state(
        self, state: bytes, token: Token | None = None
    ) -> tuple[bytes, Token, bool] | None:
        if token is None:
            # Only if nobody created the state yet.
            compare = {"key": b64(self._key), "target": "CREATE", "result": "EQUAL", "create_revision": "0"}
        else:
            try:
                revision = int(token)
            except (TypeError, ValueError):
                current = self.get_state()
                return None if current is None else (*current, False)
            compare = {"key": b64(self._key), "target": "MOD", "result": "EQUAL", "mod_revision": str(revision)}
        try:
            reply = self._client.txn(
                compare=[compare],
                success=[
                    {"request_put": {"key": b64(self._key), "value": b64(state), "lease": str(self._lease.id())}}
                ],
                failure=[{"request_range": {"key": b64(self._key)}}],
            )
        except EtcdError as exc:
            raise RendezvousConnectionError(f"etcd-v3 rendezvous: writing the state failed: {exc}") from exc
        if reply.get("succeeded", False):
            return state, int(reply["header"]["revision"]), True
        kvs = (reply.get("responses") or [{}])[0].get("response_range", {}).get("kvs") or []
        if not kvs:
            return None
        raw = kvs[0]
        kv = KeyValue(unb64(raw["key"]), unb64(raw.get("value", "")), int(raw["mod_revision"]), 0)
        return kv.value, kv.mod_revision, False
