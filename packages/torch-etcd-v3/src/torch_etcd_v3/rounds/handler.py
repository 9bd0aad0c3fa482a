"""`torchrun --rdzv-backend=etcd-lease`: torch's RendezvousHandler over the rounds of
protocol.py (torch's public rendezvous API only: torchapi.py says what, by release).

Beyond torch's API, for elastic-worker (the README of the package lists them): `node` (this
node's id in etcd) and `leave()`. A node also leaves when its process exits (atexit): a
torchrun stopped by a signal never calls shutdown(), and its peers need not wait for its
lease to lapse.
"""

from __future__ import annotations

import atexit
import itertools
import logging
import math
import os
import socket
import weakref
from typing import Any

from torch._C._distributed_c10d import PrefixStore  # torch.distributed's, typed
from torch.distributed.elastic.rendezvous.api import (
    RendezvousConnectionError,
    RendezvousHandler,
    RendezvousParameters,
    RendezvousTimeoutError,
)

from .. import config
from ..client import EtcdClient, EtcdConnectionError, EtcdError
from ..lease import AgentLease
from ..store import EtcdV3Store
from . import torchapi
from .keys import Keys
from .member import Membership
from .protocol import Closed, NodeInfo, Rendezvous, Settings, TimedOut

log = logging.getLogger(__name__)

NAME = "etcd-lease"
#: torch's dynamic rendezvous's defaults, for a conf that sets none (its create_handler).
JOIN_TIMEOUT = 600
LAST_CALL_TIMEOUT = 30
KEEP_ALIVE_INTERVAL = 5
KEEP_ALIVE_MAX_ATTEMPT = 3

# torch numbers the handlers of one process (its _NodeDescGenerator): local_id.
_local_ids = itertools.count()


def free_port() -> int:
    """A port free on this host now: the master's, if this node becomes rank 0 (torch's
    agents pick one the same way). IPv6 where the host has it (torch's TCPStore listens
    on both), else IPv4."""
    for family in (socket.AF_INET6, socket.AF_INET):
        try:
            with socket.socket(family) as sock:
                sock.bind(("", 0))
                return int(sock.getsockname()[1])
        except OSError:
            continue
    raise OSError("no free port: neither IPv6 nor IPv4 sockets can be bound")


class EtcdLeaseRendezvousHandler(RendezvousHandler):
    def __init__(self, run_id: str, rendezvous: Rendezvous, store: EtcdV3Store) -> None:
        self._run_id = run_id
        self._rdzv = rendezvous
        self._store = store
        _leave_at_exit(self)

    @property
    def rendezvous(self) -> Rendezvous:
        return self._rdzv

    @property
    def node(self) -> str | None:
        """This node's id in etcd (None before it first joined or after it left)."""
        return self._rdzv.membership.node()

    def get_backend(self) -> str:
        return NAME

    @property
    def use_agent_store(self) -> bool:
        return False

    def next_rendezvous(self) -> Any:
        try:
            round_, rank = self._rdzv.join()
        except Closed:
            # A closed rendezvous takes nobody: this node leaves (its keys go now).
            error = torchapi.closed_error(self._rdzv.is_spare(), self._run_id)
            self._rdzv.leave()
            raise error from None
        except TimedOut:
            raise RendezvousTimeoutError(
                f"etcd-lease: no round of '{self._run_id}' took this node in time"
            ) from None
        except EtcdError as exc:
            raise RendezvousConnectionError(f"etcd-lease: {exc}") from exc
        # Each round its own store prefix, from the round's id (unique for the job).
        store = PrefixStore(f"torch.rendezvous.{self._run_id}.{round_.id}", self._store)
        log.info(
            "etcd-lease: node %s joined round %d of '%s' as rank %d of %d",
            self.node,
            round_.number,
            self._run_id,
            rank,
            len(round_.members),
        )
        master = (round_.master_addr, round_.master_port)
        return torchapi.rendezvous_result(store, rank, len(round_.members), master)

    def is_closed(self) -> bool:
        try:
            return self._rdzv.is_closed()
        except EtcdError as exc:
            raise RendezvousConnectionError(f"etcd-lease: {exc}") from exc

    def set_closed(self) -> None:
        try:
            self._rdzv.close()
        except EtcdError as exc:
            raise RendezvousConnectionError(f"etcd-lease: {exc}") from exc

    def num_nodes_waiting(self) -> int:
        return self._rdzv.waiting()

    def get_run_id(self) -> str:
        return self._run_id

    def shutdown(self) -> bool:
        """torch calls it when its agent ends without a signal: this node leaves; the last
        member of the round to do so closes the rendezvous (the job is done). A node out of
        restarts leaves, and the others go on without it (torch's own closes the
        rendezvous for everyone)."""
        try:
            self._rdzv.shutdown()
            return True
        except EtcdError as exc:
            log.warning("etcd-lease: shutdown of '%s' failed: %s", self._run_id, exc)
            return False

    def leave(self) -> None:
        """Leave the job now (a SIGTERM: the others re-form without this node at once)."""
        self._rdzv.leave()


def _leave_at_exit(handler: EtcdLeaseRendezvousHandler) -> None:
    """At the process's exit, revoke the node's lease. Held through the membership (alive
    while its keep-alive thread runs), not the handler, which torch may drop first."""
    ref = weakref.ref(handler.rendezvous.membership)

    def leave() -> None:
        membership = ref()
        if membership is not None and membership.node() is not None:
            try:
                membership.revoke()
            except Exception as exc:  # noqa: BLE001 - at exit: the lease lapses anyway
                log.debug("etcd-lease: leaving at exit failed: %s", exc)

    atexit.register(leave)


def _seconds(params: RendezvousParameters, key: str, default: int) -> int:
    value = params.get_as_int(key, default)
    if value is None or value <= 0:
        raise ValueError(f"--rdzv-conf {key}={value}: must be a whole number of seconds above 0")
    return value


def create_handler(params: RendezvousParameters) -> EtcdLeaseRendezvousHandler:
    """The handler for `params` (torch's registry calls it). etcd is asked once here, so
    that an endpoint nothing answers on or credentials etcd refuses fail now, with torch's
    RendezvousConnectionError."""
    cfg = config.load(params)
    client = EtcdClient(cfg.client)
    keys = Keys.of(cfg.key_prefix, cfg.run_id)
    try:
        client.get(keys.closed)
    except EtcdError as exc:
        hint = (
            " (--rdzv-endpoint: is etcd running, and reachable from this node?)"
            if isinstance(exc, EtcdConnectionError)
            else ""
        )
        raise RendezvousConnectionError(f"etcd-lease rendezvous: {exc}{hint}") from exc
    interval = _seconds(params, "keep_alive_interval", KEEP_ALIVE_INTERVAL)
    attempts = _seconds(params, "keep_alive_max_attempt", KEEP_ALIVE_MAX_ATTEMPT)
    settings = Settings(
        min_nodes=params.min_nodes,
        max_nodes=params.max_nodes,
        last_call=_seconds(params, "last_call_timeout", LAST_CALL_TIMEOUT),
        join_timeout=_seconds(params, "join_timeout", JOIN_TIMEOUT),
    )
    membership = Membership(client, ttl=math.ceil(interval * attempts), interval=interval)
    addr, pid, local_id = params.local_addr or socket.getfqdn(), os.getpid(), next(_local_ids)

    def info() -> NodeInfo:
        return NodeInfo(addr, pid, local_id, free_port())

    rdzv = Rendezvous(client, keys, settings, membership, info=info, free_port=free_port)
    store = EtcdV3Store(
        client, cfg.store_prefix, AgentLease(client, cfg.lease_ttl), interrupt=rdzv.interrupted
    )
    return EtcdLeaseRendezvousHandler(cfg.run_id, rdzv, store)
