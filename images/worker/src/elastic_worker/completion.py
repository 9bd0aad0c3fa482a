"""Whether the job is complete: every decision about it, in one place.

The fact is the marker /elastic-job/<job>/complete in etcd, set once by the first pod whose
torchrun exited 0 (docs/contracts.md). A finished job scales its StatefulSets to 0, the
bundled etcd last, so when etcd cannot answer, the etcd StatefulSet at 0 replicas is the
same fact (scaledown.py reads it). A pod asks at each point of its life where the answer
changes what it does; `Completion` holds one method per point:

    in the gate, while etcd does not answer    during_gate     -> exit 0 without joining
    after the gate                             before_join     -> exit 0 without joining
    while torchrun runs (a spare, a straggler) while_running   -> stop torchrun, exit 0
    torchrun exited 0                          after_success   -> mark, scale down, exit 0
    torchrun failed                            after_failure   -> exit 0 if complete
    stopped by a signal                        after_signal    -> exit 0 if complete
    before leaving the round at a signal       before_leave    -> do not leave

and loss detection asks complete_now() before it stops an attempt (a member that finished
is not lost).
"""

from __future__ import annotations

import json
import logging
import time
import urllib.error
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timezone

from elastic_worker import scaledown, timings
from elastic_worker.keystore import interface as kvstore
from elastic_worker.settings.config import Config

logger = logging.getLogger(__name__)


def complete_key(config: Config) -> str:
    return f"{config.key_prefix}/complete"


def is_complete(client: kvstore.KeyStore, config: Config) -> bool:
    return client.get_value(complete_key(config)) is not None


def complete_now(client: kvstore.KeyStore, config: Config, within: float = 0.0) -> bool:
    """Whether the job is complete: the marker in etcd, or, when etcd cannot answer (a
    finished job scales it to 0 after the workers), the rendezvous' scale. While neither
    can say, ask again for up to `within` seconds (a pod told to stop at the end of the
    job has its grace period to find out that it may exit 0)."""
    deadline = time.monotonic() + within
    while True:
        try:
            return is_complete(client, config)
        except kvstore.EtcdError as exc:
            etcd_error: Exception = exc
        try:
            scaled = scaledown.rendezvous_at_zero(config, timeout=5)
        except (urllib.error.URLError, OSError, ValueError) as exc:
            scaled, api_error = None, f"reading the scale of {config.rendezvous_statefulset}: {exc}"
        else:
            api_error = "no API access to read the rendezvous' scale"
        if scaled is not None:
            return scaled
        if time.monotonic() >= deadline:
            logger.info(
                "cannot tell whether job %s is complete: etcd: %s; %s",
                config.job_id,
                etcd_error,
                api_error,
            )
            return False
        time.sleep(0.5)


def mark_complete(client: kvstore.KeyStore, config: Config) -> bool:
    """Set the marker once; a marker another pod set first is left as it is. True when
    this pod set it."""
    value = json.dumps(
        {"pod": config.pod_name, "time": datetime.now(timezone.utc).isoformat(timespec="seconds")}
    )
    try:
        client.set(complete_key(config), value, prev_exist=False)
        logger.info("training succeeded: marked %s", complete_key(config))
    except kvstore.NodeExists:
        logger.info("training succeeded; %s was already set", complete_key(config))
        return False
    return True


def wait_complete(
    client: kvstore.KeyStore,
    config: Config,
    timeout: float,
    *,
    poll_every: float = 0.5,
    clock: Callable[[], float] = time.monotonic,
) -> bool:
    """Poll for the marker for at most `timeout` seconds; etcd errors count as 'not yet'."""
    deadline = clock() + timeout
    while True:
        try:
            if is_complete(client, config):
                return True
        except kvstore.EtcdError as exc:
            logger.debug("completion check failed: %s", exc)
            if rendezvous_scaled_to_zero(config):
                return True
        if clock() >= deadline:
            return False
        time.sleep(poll_every)


def rendezvous_scaled_to_zero(config: Config, timeout: float = 5) -> bool | None:
    """Whether the bundled etcd's StatefulSet was scaled to 0, which a finished job does
    last: then the job is complete. None when the API cannot say (no access, no such
    setting, the request failed): callers that must decide take that as "not done"."""
    try:
        return scaledown.rendezvous_at_zero(config, timeout)
    except (urllib.error.URLError, OSError, ValueError) as exc:
        logger.debug(
            "reading the scale of statefulset %s failed: %s", config.rendezvous_statefulset, exc
        )
        return None


@dataclass
class Completion:
    """The job's completion as one pod asks it (see the table above)."""

    client: kvstore.KeyStore
    config: Config
    #: after a failed torchrun: how long to wait for another pod's marker
    failure_wait: float = timings.FAILURE_WAIT
    #: this pod set the marker (its JobCompleted Event goes on the StatefulSet too)
    marked: bool = False
    asked_after_signal: bool = False
    #: this pod knows the job is complete (any of the points below said so)
    done: bool = False

    def known(self) -> bool:
        """Whether this pod knows the job is complete (no request)."""
        return self.done

    def found(self) -> bool:
        """Whether the job is complete, asked now when not known (etcd, else the
        rendezvous' scale: a finished job takes its etcd away); remembered."""
        if not self.done and complete_now(self.client, self.config):
            self.done = True
        return self.done

    def during_gate(self) -> bool:
        """The gate cannot reach etcd yet: done when the rendezvous was scaled to 0."""
        return rendezvous_scaled_to_zero(self.config) is True

    def before_join(self) -> bool:
        """etcd answers: done when the marker is there (raises EtcdError)."""
        if not is_complete(self.client, self.config):
            return False
        self.done = True
        logger.info(
            "job %s is already complete (%s): exiting 0 without joining",
            self.config.job_id,
            complete_key(self.config),
        )
        return True

    def while_running(self) -> bool:
        """Polled while torchrun runs: the job completed elsewhere (etcd errors: not yet)."""
        try:
            self.done = self.done or is_complete(self.client, self.config)
        except kvstore.EtcdError as exc:
            logger.debug("completion check failed: %s", exc)
        return self.done

    def after_success(self) -> None:
        """torchrun exited 0: set the marker (retried while etcd is away, unless the job's
        etcd was scaled away by a pod that finished first), then scale the job down."""
        deadline = time.monotonic() + timings.MARK_FOR
        self.done = True
        while True:
            try:
                self.marked = mark_complete(self.client, self.config)
                break
            except kvstore.EtcdError as exc:
                # Another pod may have finished first and scaled etcd to 0 already.
                if rendezvous_scaled_to_zero(self.config):
                    logger.info(
                        "training succeeded; job %s is complete (its rendezvous was scaled to 0)",
                        self.config.job_id,
                    )
                    return
                if time.monotonic() >= deadline:
                    logger.error("training succeeded but the marker could not be set: %s", exc)
                    return
                time.sleep(1)
        scaledown.scale_down_after_success(self.config)

    def after_failure(self, code: int, seen_complete: bool) -> int:
        """torchrun failed with `code`: 0 when the job is complete (seen while it ran, or
        marked by another pod within `failure_wait`), else `code`."""
        if seen_complete or wait_complete(self.client, self.config, self.failure_wait):
            self.done = True
            logger.info(
                "torchrun exited with %d but job %s is complete: exit 0", code, self.config.job_id
            )
            return 0
        logger.error("torchrun exited with %d", code)
        return code

    def after_signal(self) -> bool:
        """This pod was told to stop: the first pod to finish scales the job to 0, so
        whatever this pod was doing (gating, training, waiting as a spare), it is done too
        when the job is complete. Asked once per pod (`asked_after_signal`): the answer
        decides its exit code."""
        self.asked_after_signal = True
        self.done = self.done or complete_now(self.client, self.config, within=timings.STOPPED_ASK)
        return self.done

    def before_leave(self) -> bool:
        """A leave at the signal is skipped at the end of the job: every pod is told to stop
        then, nobody re-forms. One quick read; when etcd cannot answer, the rendezvous'
        scale (the first pod to finish scales etcd away as the others are told to stop);
        neither can say: not complete."""
        if not self.done and complete_now(self.client.with_timeout(timings.LEAVE_ASK), self.config):
            self.done = True
        return self.done
