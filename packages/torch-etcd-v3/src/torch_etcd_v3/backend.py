"""The rendezvous state in one etcd key, written by compare-and-set on its revision."""

from __future__ import annotations

import base64
import binascii
import time

from torch.distributed.elastic.rendezvous.api import (
    RendezvousConnectionError,
    RendezvousStateError,
)
from torch.distributed.elastic.rendezvous.dynamic_rendezvous import RendezvousBackend, Token

from .backoff import Backoff
from .client import EtcdClient, EtcdError
from .lease import AgentLease


class EtcdV3RendezvousBackend(RendezvousBackend):
    """State at `<key_prefix>/rendezvous/<run_id>`, base64-encoded as torch's etcd-v2 and
    c10d backends keep it (so that a value this backend did not write is told apart: torch's
    RendezvousStateError); the token is the key's mod_revision. Each write attaches the key
    to the writer's lease: every agent rewrites the state on its heartbeat, so the key lives
    while any agent does, and goes `lease_ttl` after."""

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

    def _decode(self, stored: bytes) -> bytes:
        try:
            return base64.b64decode(stored, validate=True)
        except binascii.Error as exc:
            key = self._key.decode(errors="replace")
            raise RendezvousStateError(
                f"etcd-v3 rendezvous: the state at {key} is corrupt (not the base64 this "
                f"backend writes: {exc}); something else wrote the key, or an agent of an "
                "earlier torch-etcd-v3 build (raw state): run every agent of a job on one "
                "build, or delete the key and start the job again"
            ) from exc

    def get_state(self) -> tuple[bytes, Token] | None:
        try:
            kv, _ = self._client.get(self._key)
        except EtcdError as exc:
            raise RendezvousConnectionError(
                f"etcd-v3 rendezvous: reading the state failed: {exc}"
            ) from exc
        return None if kv is None else (self._decode(kv.value), kv.mod_revision)

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
        stored = base64.b64encode(state)
        try:
            written, _, at = self._lease.write(
                lambda lease: self._client.put_if(self._key, stored, lease, revision)
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
