"""Peer registration: this pod's key under <prefix>/members/ (docs/contracts.md), with a
TTL refreshed while it runs; the gate waits until ELASTIC_MIN_NODES pods registered, and the
metrics count them (more than maxNodes: this pod waits as a spare).

The value says which incarnation of the pod wrote it, on which node, how torch knows its
node (addr: torchrun's --local-addr), and the node's kind (JSON: ip, addr, uid, node,
gpu_model, gpu_count, fabric). A pod made again (its old one
force-deleted on a node that is down) writes the key at its gate over whatever is there:
the newest incarnation is the pod. After that every write is a compare-and-swap on this
pod's own value, so an old incarnation that comes back with its node never takes the key
back: it finds another UID there and knows it was replaced (`on_replaced`).
"""

from __future__ import annotations

import json
import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass, field

from elastic_worker import timings
from elastic_worker.gate.topology import Kind
from elastic_worker.gate.wait import CheckResult
from elastic_worker.keystore import interface as kvstore
from elastic_worker.settings.config import Config

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class Member:
    """One member key's value. A bare address (a pod of an older image) has no uid."""

    name: str
    ip: str
    uid: str = ""
    node: str = ""
    kind: Kind = field(default_factory=Kind)
    addr: str = ""  # torchrun's --local-addr, how the rendezvous names this pod's node

    def encode(self) -> str:
        fields = {"ip": self.ip, "addr": self.addr or self.ip, "uid": self.uid, "node": self.node}
        return json.dumps({**fields, **self.kind.as_dict()}, sort_keys=True)

    @classmethod
    def decode(cls, name: str, value: str | None) -> Member:
        try:
            raw = json.loads(value or "")
        except ValueError:
            raw = None
        if not isinstance(raw, dict):
            return cls(name, value or "")
        return cls(
            name,
            str(raw.get("ip", "")),
            str(raw.get("uid", "")),
            str(raw.get("node", "")),
            Kind.from_dict(raw),
            str(raw.get("addr", "")),
        )


def members(client: kvstore.KeyStore, config: Config) -> list[Member]:
    """Every registered member of the job."""
    return [
        Member.decode(e.key.rsplit("/", 1)[-1], e.value)
        for e in client.list_dir(f"{config.key_prefix}/members")
    ]


class Registration:
    """This pod's entry under <prefix>/members/ with a TTL, refreshed until stopped.

    `on_replaced(uid)` is called (once) when the key holds another incarnation's value.
    Once the job is complete nothing is written or removed (the bundled etcd goes to 0
    replicas at the end, and the key expires by itself): `complete()` says whether this
    pod knows it, `confirm()` asks (after a failed request: etcd may be gone because the
    job is done)."""

    def __init__(
        self,
        client: kvstore.KeyStore,
        config: Config,
        address: str,
        *,
        addr: str = "",
        on_replaced: Callable[[str], None] | None = None,
        complete: Callable[[], bool] = lambda: False,
        confirm: Callable[[], bool] = lambda: False,
        also: Callable[[], None] | None = None,
    ) -> None:
        self.client = client
        self.config = config
        self.key = f"{config.key_prefix}/members/{config.pod_name}"
        self.dir = f"{config.key_prefix}/members"
        self.me = Member(
            config.pod_name, address, config.pod_uid, config.node_name, Kind.of(config), addr
        )
        self.value = self.me.encode()
        self.min_nodes = config.min_nodes
        self.on_replaced = on_replaced
        self.complete = complete
        self.confirm = confirm
        self.also = also  # refreshed with the key (the job's kind, gate/topology.py)
        #: This incarnation was replaced (recovery/fence.py): it writes nothing any more,
        #: not even a key that lapsed (the new incarnation's gate writes it).
        self.fenced: Callable[[], bool] = lambda: False
        self.replaced_by: str | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def register(self) -> None:
        """At the gate: the key is this pod's, whoever held it (the newest incarnation)."""
        self.client.set(self.key, self.value, ttl=timings.MEMBER_TTL)

    def count(self) -> int:
        return len(self.client.list_dir(self.dir))

    def kinds(self) -> list[Kind]:
        return [m.kind for m in members(self.client, self.config)]

    def member_at(self, addr: str) -> Member | None:
        """The member torch knows by node address `addr` (None: none, or etcd away)."""
        try:
            found = members(self.client, self.config)
        except kvstore.EtcdError:
            return None
        return next((m for m in found if addr in (m.addr, m.ip) and m.name != self.me.name), None)

    def probe(self) -> CheckResult:
        try:
            self.register()
            count = self.count()
        except kvstore.EtcdError as exc:
            return False, str(exc)
        if count >= self.min_nodes:
            return True, ""
        return False, f"{count} of {self.min_nodes} registered"

    def start(self) -> None:
        self._thread = threading.Thread(target=self._refresh, name="member-ttl", daemon=True)
        self._thread.start()

    def _refresh(self) -> None:
        while not self._stop.wait(timings.MEMBER_TTL / 3):
            if not self.tick():
                return

    def tick(self) -> bool:
        """One refresh of the refresh thread; False when there is nothing more to do (the
        job is done, or this incarnation was replaced)."""
        if self.complete() or self.replaced_by is not None or self.fenced():
            return False
        try:
            self.refresh()
        except kvstore.EtcdError as exc:
            if self.confirm():
                return False  # etcd is gone because the job is done
            logger.warning("could not refresh %s: %s", self.key, exc)
        return True

    def refresh(self) -> None:
        """Rewrite the key only while it is this pod's (or gone: it lapsed)."""
        try:
            self.client.set(self.key, self.value, ttl=timings.MEMBER_TTL, prev_value=self.value)
        except kvstore.KeyNotFound:
            try:
                self.client.set(self.key, self.value, ttl=timings.MEMBER_TTL, prev_exist=False)
            except kvstore.NodeExists:
                self.check_replaced()
        except kvstore.CompareFailed:
            self.check_replaced()
        if self.also is not None and self.replaced_by is None:
            self.also()

    def check_replaced(self) -> str | None:
        """The UID of the incarnation whose value the key holds now, when it is not this
        one's (on_replaced is told); None while it is this pod's, or gone."""
        held = Member.decode(self.config.pod_name, self.client.get_value(self.key))
        if not held.uid or held.uid == self.me.uid or not self.me.uid:
            return None
        if self.replaced_by is None:
            self.replaced_by = held.uid
            if self.on_replaced is not None:
                self.on_replaced(held.uid)
        return held.uid

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
        if self.complete() or self.fenced():
            return  # etcd is going to 0 replicas; the key expires within MEMBER_TTL
        try:
            self.client.delete(self.key, prev_value=self.value)
        except kvstore.CompareFailed:
            pass  # another incarnation's now: not this pod's to remove
        except kvstore.EtcdError as exc:
            if not self.confirm():
                logger.info(
                    "could not remove %s (it expires in %d s): %s",
                    self.key,
                    timings.MEMBER_TTL,
                    exc,
                )
