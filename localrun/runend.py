"""A local run's end: whether the job is complete (the marker in etcd, or the rendezvous
scaled to 0), when the run is over, the cleanup of everything it made, the summary."""

from __future__ import annotations

import contextlib
import logging
import shutil
import sys
import time
import urllib.error
from collections.abc import Callable
from dataclasses import dataclass

from elastic_worker import scaledown
from elastic_worker.settings.config import KubeApi

from localrun import chart
from localrun.cluster.pod import Phase, Pod
from localrun.cluster.statefulset import StatefulSet
from localrun.runbase import COMPLETION_POLL, EXIT_FAILED, EXIT_OK, RunnerBase
from localrun.view import summary_text

log = logging.getLogger(__name__)


class Ending(RunnerBase):
    # -- completion ----------------------------------------------------------------------

    def _completion_target(self) -> tuple[chart.Marker, str] | None:
        """The marker's URL on the running rendezvous pod and the name its certificate
        covers (None: no such pod, or no job id known yet)."""
        assert self.cluster is not None
        if not self.job_id:
            return None
        for p in self.cluster.pods():
            if chart.is_rendezvous(p.labels) and p.ip and p.phase == Phase.RUNNING:
                spec = p.sts.pod_spec
                ep = chart.client_endpoint(spec)
                port = chart.client_port(spec)
                marker = chart.completion_url(p.ip, port, self.job_id, ep.scheme, self.rdzv_backend)
                return marker, ep.server_name
        return None

    def _read_completion(self, timeout: float = 2.0) -> bool | None:
        """None also when no rendezvous pod runs."""
        target = self._completion_target()
        if target is None:
            return None
        url, name = target
        return chart.read_completion(url, timeout, tls=self.client_tls, server_name=name)

    def _check_completion(self, now: float) -> bool | None:
        running = self._completion_target() is not None
        found = self._read_completion()
        if found:
            self.state.etcd_complete = True
            self.state.complete(now, "completion marker set in etcd")
        elif not running and self._rendezvous_scaled_to_zero():
            # The worker that set the marker scales the etcd StatefulSet to 0 last (the
            # chart's scale-down), as elastic-worker itself reads it: the job is complete.
            found = True
            self.state.complete(now, "the job scaled its rendezvous StatefulSet to 0")
        return found

    def _rendezvous_scaled_to_zero(self) -> bool:
        assert self.cluster is not None
        sets = [s for s in self.cluster.sets.values() if chart.is_rendezvous(s.labels)]
        return bool(sets) and all(s.replicas == 0 for s in sets)

    def _poll_completion(self, now: float) -> None:
        if self.state.completed or now < self._next_completion_check:
            return
        self._next_completion_check = now + COMPLETION_POLL
        self._check_completion(now)

    # -- the end -------------------------------------------------------------------------

    def _finished(self, now: float) -> int | None:
        assert self.cluster is not None
        if self._rel(now) > self.cfg.timeout:
            return self._end(End(EXIT_FAILED, f"timed out after {self.cfg.timeout:g}s"))
        worker_sets = [s for s in self.cluster.sets.values() if chart.is_worker(s.labels)]
        # A pod on a node that is down stays there (Terminating, once deleted) until the
        # node is back, deleted or the pod force-deleted, as in a cluster: it cannot hold
        # up the run's end, which says it is left.
        everywhere = [p for p in self.cluster.pods() if chart.is_worker(p.labels)]
        workers = [p for p in everywhere if not self.cluster.node_down(p.node)]
        scaled_to_zero = bool(worker_sets) and all(s.replicas == 0 for s in worker_sets)
        if scaled_to_zero and not workers and not self.state.completed:
            self._check_completion(now)  # the marker may be set since the last poll
        end = end_of_run(
            worker_sets,
            workers,
            self.state.completed_at,
            self.cfg.give_up_after,
            lambda pod: (self.state.pod(pod).last_lines or ["(no worker line)"])[-1],
        )
        if end is not None and len(workers) < len(everywhere):
            left = ", ".join(f"{p.name} on {p.node}" for p in everywhere if p not in workers)
            end = End(end.code, f"{end.message} (left on nodes that are down: {left})")
        return None if end is None else self._end(end)

    def _end(self, end: End) -> int:
        if end.code != EXIT_OK:
            self.state.error = end.message
        self.event(end.message)
        return end.code

    def _scale_via_api(self, ns: str, name: str, replicas: int) -> bool:
        """As `kubectl scale` would, with the worker's own request (elastic_worker.scaledown)."""
        assert self.api is not None
        api = KubeApi(base_url=self.api.url, token=self.api.token, ca_file=str(self.api.ca_path))
        try:
            scaledown.set_replicas(api, ns, name, replicas, timeout=10)
        except (OSError, urllib.error.URLError, ValueError) as exc:
            self.event(f"scale through the API failed ({exc}); scaling directly")
            return False
        return True

    def _linger(self) -> None:
        """Keep serving the API (every pod gone) for `linger` seconds after the end, so
        that a client watching the job (elastic-job logs --save) sees how it ended, and
        Prometheus (its series and alerts) with it."""
        if self.cfg.linger > 0 and self.api is not None:
            self._publish_pods()
            also = " and prometheus" if self.prometheus is not None else ""
            self.event(f"the API server{also} stay up {self.cfg.linger:g}s (--linger)")
            time.sleep(self.cfg.linger)

    def _stop_monitoring(self) -> None:
        for part in (self.prometheus, self.kubestate):
            if part is not None:
                with contextlib.suppress(Exception):
                    part.stop()

    def _cleanup(self) -> None:
        if self.cluster is not None:
            with contextlib.suppress(Exception):
                self.state.rendezvous_scaled_to_zero = self._rendezvous_scaled_to_zero()
                # A marker seen earlier stands: at the end etcd may be scaled to 0 already.
                found = self._read_completion(timeout=3)
                if found is not None or self.state.etcd_complete is None:
                    self.state.etcd_complete = found
            self.state.observe(self.cluster.pods(), self._partitioned)
            try:
                for name, rc in self.cluster.stop(grace=3.0).items():
                    self.state.exited(name, rc)
                self._linger()
            except Exception:  # cleanup goes on whatever failed
                log.exception("stopping pods failed")
        for item in self._pending():
            if item[0] == "line":
                _, pod, container, line, t = item
                self.state.line(pod, container, line, self._rel(t))
        if self.network is not None:
            try:
                self.network.teardown()
            except Exception:
                log.exception("network teardown failed")
        try:
            self.mountpoints.release_all()
        except Exception:
            log.exception("releasing mountpoints failed")
        if self.api is not None:
            with contextlib.suppress(Exception):
                self.api.stop()
        self._stop_monitoring()
        shutil.rmtree(self.workdir, ignore_errors=True)

    def _write_summary(self) -> None:
        self.state.duration = self._rel()
        self.progress.finish()
        if self.cfg.json_path is not None:
            self.state.write(self.cfg.json_path)
        with contextlib.suppress(OSError):
            self.state.write(self.outdir / "summary.json")
        sys.stdout.write(summary_text(self.state.as_dict(), self.outdir))
        sys.stdout.flush()


@dataclass(frozen=True)
class End:
    code: int  # the run's exit code
    message: str  # the last event; the summary's error when code is not EXIT_OK


def end_of_run(
    worker_sets: list[StatefulSet],
    workers: list[Pod],
    completed_at: float | None,
    give_up_after: int,
    last_line: Callable[[str], str],
) -> End | None:
    """Whether the run is over, from the worker StatefulSets and pods and the time the job
    was seen complete (time.monotonic(), None: not yet); None goes on."""
    scaled_to_zero = bool(worker_sets) and all(s.replicas == 0 for s in worker_sets)
    if completed_at is not None:
        if scaled_to_zero and not workers:
            return End(EXIT_OK, "training complete; every worker StatefulSet scaled to 0")
        ran = [p for p in workers if p.main_started or p.proc is not None]
        if ran and all(
            p.zero_exit_at is not None and p.zero_exit_at >= completed_at and p.proc is None
            for p in ran
        ):
            return End(EXIT_OK, "training complete; every worker pod exited 0")
        return None
    if scaled_to_zero and not workers:
        return End(
            EXIT_FAILED, "every worker StatefulSet was scaled to 0 before training completed"
        )
    placed = [p for p in workers if p.node]
    n = give_up_after
    if n <= 0 or not placed or any(p.failures_in_row < n for p in placed):
        return None
    last = "; ".join(f"{p.name}: {last_line(p.name)}" for p in placed)
    error = f"every worker pod failed {n} times in a row; last: {last}"
    pending = [f"{p.name}: {p.message}" for p in workers if not p.node]
    if pending:
        error += "; pending: " + "; ".join(pending)
    return End(EXIT_FAILED, error)
