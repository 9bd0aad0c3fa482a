"""This incarnation of the pod, fenced: when a node is lost and its pod is made again on
another node (force-deleted by a peer's reclaim, an administrator or pod GC), the old pod
can come back with its node (a healed partition, a thawed VM) and run until its kubelet,
back too, finds it gone from the API and stops it (up to its grace period later). Until
then its torchrun must not disturb the job: rejoin the rendezvous, take nodes out of it,
or stop peers.

What makes this pod suspect itself (recovery/lossdetect.py): its key of the running round
lapsed, or no refresh of it succeeded for longer than the key's TTL, measured on the local
clock, so a frozen process notices it the moment it runs again, before any request. And
its member key (gate/members.py) found holding another incarnation's UID.

At the first sign torchrun's process group is stopped (SIGSTOP: no request needed), then
the pod asks who it is: its own pod through the API when it may read it (nodeLoss.reclaim's
Role: 404 or another UID is replaced, the same UID is this pod), else its member key
(another UID: replaced; its own: this pod; gone: it takes it back with a create-only
write, which the new incarnation's gate would have won).

- Replaced: torchrun's group is SIGKILLed (no leave, nothing written), the pod records no
  more and waits for its kubelet's SIGTERM.
- This pod: torchrun goes on (SIGCONT); loss detection stops its attempt as before, so it
  rejoins at the next re-form.
- Not known (neither etcd nor the API answers): torchrun stays stopped, asked again at the
  next refresh. Cut off, it could do nothing anyway.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import threading
import time
import urllib.error
from collections.abc import Callable
from enum import Enum

from elastic_worker import kubeapi, timings
from elastic_worker.gate.members import Member, Registration
from elastic_worker.keystore import interface as kvstore
from elastic_worker.settings.config import Config

logger = logging.getLogger(__name__)


class Who(Enum):
    THIS = "this pod"
    REPLACED = "replaced"
    UNKNOWN = "unknown"


class Fence:
    """Asks who this pod is at the first sign it was replaced; stops torchrun meanwhile.

    `torchrun()` is the running torchrun's pid (its process group's id: it runs in a
    session of its own), None between two."""

    def __init__(
        self,
        config: Config,
        client: kvstore.KeyStore,
        registration: Registration | None,
        torchrun: Callable[[], int | None],
        *,
        fenced: threading.Event | None = None,
    ) -> None:
        self.config = config
        self.client = client
        self.registration = registration
        self.torchrun = torchrun
        #: Replaced: nothing of this pod acts any more (`fenced`: an event the pod shares).
        self.fenced = fenced if fenced is not None else threading.Event()
        self._stopped: int | None = None  # torchrun's group, while stopped
        self._confirmed = 0.0  # monotonic time of the last "this pod"
        self._lock = threading.Lock()

    @property
    def holding(self) -> bool:
        """Whether this pod must not act on the job now: replaced, or torchrun stopped
        while it asks."""
        return self.fenced.is_set() or self._stopped is not None

    def suspect(self, why: str) -> bool:
        """A sign this pod may have been replaced; True when it is still this pod (the
        caller goes on), False when replaced or not known yet."""
        with self._lock:
            if self.fenced.is_set():
                return False
            if (
                time.monotonic() - self._confirmed < timings.FENCE_CONFIRMED_FOR
                and self._stopped is None
            ):
                return True
            self._stop_torchrun(why)
            who, detail = self.who()
            if who is Who.REPLACED:
                self._fence(detail)
                return False
            if who is Who.THIS:
                self._confirmed = time.monotonic()
                self._resume()
                return True
            logger.info("cannot tell yet whether this pod was replaced (%s): asking again", detail)
            return False

    def replaced(self, uid: str) -> None:
        """The member key holds another incarnation's value: fenced now."""
        with self._lock:
            if not self.fenced.is_set():
                self._stop_torchrun("its member key holds another incarnation")
                self._fence(f"its member key holds pod UID {uid}")

    def who(self) -> tuple[Who, str]:
        """This pod, replaced or unknown, and what said so."""
        api = self._from_api()
        if api is not None:
            return api
        return self._from_member_key()

    def _from_api(self) -> tuple[Who, str] | None:
        api, cfg = self.config.kube_api, self.config
        if api is None or not (cfg.pod_namespace and cfg.pod_uid):
            return None
        path = f"/api/v1/namespaces/{cfg.pod_namespace}/pods/{cfg.pod_name}"
        try:
            pod = kubeapi.request(api, "GET", path, timeout=timings.FENCE_API_TIMEOUT)
        except urllib.error.HTTPError as exc:
            if exc.code == 404:
                return Who.REPLACED, f"pod {cfg.pod_name} is gone from the API server"
            logger.debug("reading pod %s: HTTP %d", cfg.pod_name, exc.code)
            return None  # 403 without nodeLoss.reclaim's Role: the member key decides
        except (urllib.error.URLError, OSError, ValueError) as exc:
            logger.debug("reading pod %s: %s", cfg.pod_name, exc)
            return None
        meta = pod.get("metadata")
        uid = meta.get("uid") if isinstance(meta, dict) else None
        if uid == cfg.pod_uid:
            return Who.THIS, "the API server's pod is this one"
        return Who.REPLACED, f"the API server's pod {cfg.pod_name} is UID {uid}"

    def _from_member_key(self) -> tuple[Who, str]:
        reg = self.registration
        if reg is None or not self.config.pod_uid:
            return Who.THIS, "no member key to tell by"
        try:
            value = self.client.get_value(reg.key)
            if value is None:
                try:  # lapsed: this pod's again, unless a newer incarnation takes it first
                    self.client.set(reg.key, reg.value, ttl=timings.MEMBER_TTL, prev_exist=False)
                    return Who.THIS, "its member key had lapsed and is this pod's again"
                except kvstore.NodeExists:
                    value = self.client.get_value(reg.key)
            held = Member.decode(self.config.pod_name, value)
        except kvstore.EtcdError as exc:
            return Who.UNKNOWN, f"etcd: {exc}"
        if held.uid in ("", self.config.pod_uid):
            return Who.THIS, "its member key is this pod's"
        return Who.REPLACED, f"its member key holds pod UID {held.uid}"

    def _stop_torchrun(self, why: str) -> None:
        if self._stopped is not None:
            return
        pid = self.torchrun()
        if pid is None:
            return
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(pid, signal.SIGSTOP)
            self._stopped = pid
            logger.info("%s: torchrun (pid %d) held while this pod asks who it is", why, pid)

    def _resume(self) -> None:
        pid, self._stopped = self._stopped, None
        if pid is not None:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(pid, signal.SIGCONT)

    def _fence(self, detail: str) -> None:
        self.fenced.set()
        pid = self._stopped if self._stopped is not None else self.torchrun()
        if pid is not None:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(pid, signal.SIGKILL)
        self._stopped = None
        logger.warning(
            "this pod was replaced by a new incarnation (%s; this one is UID %s): torchrun "
            "stopped, and this pod stays out of the job until its kubelet stops it",
            detail,
            self.config.pod_uid,
        )
