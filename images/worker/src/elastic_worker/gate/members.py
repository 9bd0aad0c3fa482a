"""Peer registration: this pod's key under <prefix>/members/ (docs/contracts.md), with a
TTL refreshed while it runs; the gate waits until ELASTIC_MIN_NODES pods registered, and the
metrics count them (more than maxNodes: this pod waits as a spare)."""

from __future__ import annotations

import logging
import threading

from elastic_worker.gate.wait import CheckResult
from elastic_worker.keystore import interface as kvstore
from elastic_worker.settings.config import Config

logger = logging.getLogger(__name__)

MEMBER_TTL = 30


class Registration:
    """This pod's entry under <prefix>/members/ with a TTL, refreshed until stopped."""

    def __init__(self, client: kvstore.KeyStore, config: Config, address: str) -> None:
        self.client = client
        self.key = f"{config.key_prefix}/members/{config.pod_name}"
        self.dir = f"{config.key_prefix}/members"
        self.value = address  # docs/contracts.md: the value is the pod IP
        self.min_nodes = config.min_nodes
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def register(self) -> None:
        self.client.set(self.key, self.value, ttl=MEMBER_TTL)

    def count(self) -> int:
        return len(self.client.list_dir(self.dir))

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
        while not self._stop.wait(MEMBER_TTL / 3):
            try:
                self.register()
            except kvstore.EtcdError as exc:
                logger.warning("could not refresh %s: %s", self.key, exc)

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
        try:
            self.client.delete(self.key)
        except kvstore.EtcdError as exc:
            logger.info("could not remove %s (it expires in %d s): %s", self.key, MEMBER_TTL, exc)
