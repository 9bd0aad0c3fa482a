"""The pod's Prometheus metrics (docs/contracts.md, "Metrics"), served by prometheus-client.

Every series has the labels elastic_job (ELASTIC_JOB_ID) and group (ELASTIC_GROUP), nothing
else: the scrape adds the pod's own (namespace, pod, and the scrape's job), so the names are
ours and never clash with a target label (kube-prometheus-stack scrapes without
honorLabels). A job with many pods stays a few series per pod; the one exception is
elastic_job_node_info, one constant series per pod with the node's topology.
`Tracker` turns what the worker sees (its own gate, the attempt lines, the training
process of each attempt, the optional progress file) into the values; it takes the
clock as an argument so its rules are tested without waiting.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from wsgiref.simple_server import WSGIServer

from prometheus_client import (
    CollectorRegistry,
    Counter,
    Enum,
    Gauge,
    Histogram,
    Info,
    disable_created_metrics,
)
from prometheus_client.exposition import start_http_server

from elastic_worker.attempt_line import AttemptLine
from elastic_worker.observe import events
from elastic_worker.observe.snapshots import Restored

LABELS = ("elastic_job", "group")
STATES = (
    "gating",
    "waiting_rendezvous",
    "training",
    "spare",
    "exit_barrier",
    "completed",
    "failed",
)
# Re-form durations: seconds with the chart's defaults (docs/benchmarks.md), about a
# minute with torch's; a stuck rendezvous runs into the join timeout (600 s).
REFORM_BUCKETS = (1, 2.5, 5, 7.5, 10, 15, 20, 30, 45, 60, 90, 120, 300, 600)
# Steps lost per re-form: 0 or 1 from memory (packages/elastic-snapshot), up to a
# checkpoint interval (tens to thousands of steps) from the checkpoint.
STEPS_LOST_BUCKETS = (0, 1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 5000)
#: Where a restored state came from (snapshots.SOURCES but `none`, a first start).
RESTORE_SOURCES = ("peer-memory", "local-memory", "checkpoint")
#: What the hang watch did (recovery/hangs.py): this pod's rank held the round and was
#: taken out, or no single rank did and the round restarted.
HANG_ACTIONS = ("took-out", "restarted-round")


@dataclass(frozen=True)
class Identity:
    job: str
    group: str


class JobMetrics:
    """The metric objects of one pod, bound to its labels, in their own registry."""

    def __init__(self, who: Identity, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry if registry is not None else CollectorRegistry()
        values = (who.job, who.group)
        self.values = values
        reg = self.registry

        def gauge(name: str, doc: str) -> Gauge:
            return Gauge(name, doc, LABELS, registry=reg).labels(*values)

        self.state = Enum(
            "elastic_job_pod_state",
            "What this pod does now (one state is 1)",
            LABELS,
            states=list(STATES),
            registry=reg,
        ).labels(*values)
        self.min_nodes = gauge("elastic_job_min_nodes", "job.minNodes: fewest nodes it trains on")
        self.round = gauge(
            "elastic_job_rendezvous_round",
            "Rendezvous rounds this pod has joined (1 = its first); 0 before the first",
        )
        self.world_size = gauge(
            "elastic_job_world_size_nodes",
            "Nodes in the round this pod trains in; 0 while it is not in one",
        )
        self.group_rank = gauge(
            "elastic_job_group_rank", "This node's rank in its round; -1 while not in one"
        )
        self.reforms = Counter(
            "elastic_job_reforms",
            "Rounds this pod joined after its first (a re-form: failure or membership change)",
            LABELS,
            registry=reg,
        ).labels(*values)
        self.reform_rendezvous = Histogram(
            "elastic_job_reform_rendezvous_seconds",
            "From this node's training process of a round ending to the next round's starting",
            LABELS,
            buckets=REFORM_BUCKETS,
            registry=reg,
        ).labels(*values)
        self.reform_first_step = Histogram(
            "elastic_job_reform_first_step_seconds",
            "From this node's training process of a round ending to the first step reported "
            "in the next round (only when the script reports progress)",
            LABELS,
            buckets=REFORM_BUCKETS,
            registry=reg,
        ).labels(*values)
        self.restarts = Counter(
            "elastic_job_worker_restarts",
            "torchrun restarts of this node's workers after a failure (counts --max-restarts)",
            LABELS,
            registry=reg,
        ).labels(*values)
        self.restarts_used = gauge(
            "elastic_job_torchrun_restarts_used", "Restarts the running torchrun has used"
        )
        self.restarts_left = gauge(
            "elastic_job_torchrun_restarts_remaining",
            "Restarts left before this torchrun gives up and closes the rendezvous",
        )
        self.gate_wait = gauge(
            "elastic_job_gate_wait_seconds", "Time spent in the readiness gate (so far)"
        )
        self.completed = gauge("elastic_job_completed", "1 once the job is complete")
        self.exit_barrier_waiting = gauge(
            "elastic_job_exit_barrier_waiting_nodes",
            "Nodes of the round this pod waits for in torch's exit barrier (its own training "
            "processes exited 0; state exit_barrier), -1 when it cannot tell; 0 otherwise",
        )
        self.node = Info(
            "elastic_job_node",
            "The node this pod runs on (/etc/inject/env): node name, instance type, "
            "capacity type (spot, on-demand, ...), GPU model, zone",
            LABELS,
            registry=reg,
        ).labels(*values)
        # A script that keeps snapshots (packages/elastic-snapshot) says where each
        # attempt's state came from and the steps its re-form lost (docs/contracts.md).
        self.restores = Counter(
            "elastic_job_restores",
            "Rounds whose training state this pod loaded, by where it came from (another "
            "pod's memory, this pod's, the checkpoint): a script that keeps snapshots",
            (*LABELS, "source"),
            registry=reg,
        )
        for source in RESTORE_SOURCES:
            self.restores.labels(*values, source)
        self.hangs = Counter(
            "elastic_job_hangs",
            "Rounds that stopped stepping for the hang bound, by what this pod did: its rank "
            "held the round and was taken out, or no single rank did and the round restarted",
            (*LABELS, "action"),
            registry=reg,
        )
        for action in HANG_ACTIONS:
            self.hangs.labels(*values, action)
        self.steps_lost = Histogram(
            "elastic_job_reform_steps_lost",
            "Per re-form, the steps lost: the newest step completed before it minus the step "
            "the new round loaded (a script that keeps snapshots)",
            LABELS,
            buckets=STEPS_LOST_BUCKETS,
            registry=reg,
        ).labels(*values)
        self.restored_step = gauge(
            "elastic_job_restored_step", "The step this pod's current round started from"
        )
        # The step series exist only once the script reports progress (docs/contracts.md,
        # "Progress"): a job whose script does not report has none, so an alert on "no
        # step progress" (ElasticJobTrainingStalled) stays silent for it.
        self._values = values
        self._last_step = Gauge(
            "elastic_job_last_step",
            "Highest step the training script reported (progress file)",
            LABELS,
            registry=reg,
        )
        self._step_seconds = Gauge(
            "elastic_job_step_seconds",
            "Wall time per step between the last two reports",
            LABELS,
            registry=reg,
        )
        self._last_progress = Gauge(
            "elastic_job_last_progress_timestamp_seconds",
            "Unix time of the last progress report",
            LABELS,
            registry=reg,
        )

    def last_step(self) -> Gauge:
        return self._last_step.labels(*self._values)

    def step_seconds(self) -> Gauge:
        return self._step_seconds.labels(*self._values)

    def last_progress(self) -> Gauge:
        return self._last_progress.labels(*self._values)


def serve(metrics: JobMetrics, port: int, addr: str | None = None) -> WSGIServer:
    """Serve /metrics on `port` from a daemon thread; the caller shuts it down. By default
    on every address: IPv6 and IPv4 ("::"), else IPv4 alone (a host without IPv6)."""
    # No `<counter>_created` series: one per counter and histogram, never used by the rules.
    disable_created_metrics()  # type: ignore[no-untyped-call]
    if addr is not None:
        server, _thread = start_http_server(port, addr=addr, registry=metrics.registry)
        return server
    try:
        server, _thread = start_http_server(port, addr="::", registry=metrics.registry)
    except OSError:
        server, _thread = start_http_server(port, addr="0.0.0.0", registry=metrics.registry)
    return server


def parse_progress(line: str) -> int | None:
    """The step of a progress line (`step=<int>`, other words ignored); None otherwise."""
    for word in line.split():
        if word.startswith("step="):
            try:
                step = int(word[5:])
            except ValueError:
                return None
            return step if step >= 0 else None
    return None


#: notify(reason, message): what the pod's Events say (events.Recorder.record).
Notify = Callable[[events.Reason, str], None]


class Tracker:
    """The pod's state machine; each method is one thing the worker saw, at `now`.
    `notify` hears the facts an operator looks for (a re-form, a spare waiting or joining)."""

    def __init__(
        self,
        metrics: JobMetrics,
        min_nodes: int,
        max_nodes: int,
        max_restarts: int,
        clock: Callable[[], float] = time.time,
        *,
        notify: Notify | None = None,
    ) -> None:
        self.m = metrics
        self.notify = notify
        self.max_nodes = max_nodes
        self.max_restarts = max_restarts
        self.clock = clock
        self._lock = threading.Lock()
        self.current: AttemptLine | None = None
        self.rounds = 0
        self.ended_at: float | None = None  # this node's last training process ended
        self.reform_started: float | None = None  # awaiting the first step of a re-form
        self.last_restart: tuple[str, int] | None = None
        self.step: int | None = None
        self.step_at: float | None = None
        self.members: int | None = None
        self.state = "gating"
        self._gate_end: list[float] = []
        metrics.min_nodes.set(min_nodes)
        metrics.group_rank.set(-1)
        metrics.restarts_left.set(max_restarts)
        metrics.state.state("gating")

    def _set(self, state: str) -> None:
        self.state = state
        self.m.state.state(state)

    def gate_begin(self) -> None:
        """The gate's wait is computed when scraped, so it grows while the gate waits."""
        start = self.clock()
        end: list[float] = []
        self.m.gate_wait.set_function(lambda: (end[0] if end else self.clock()) - start)
        self._gate_end = end

    def gate_end(self) -> None:
        if not self._gate_end:
            self._gate_end.append(self.clock())

    def torchrun_started(self) -> None:
        with self._lock:
            self._waiting()

    def _waiting(self) -> None:
        self.m.world_size.set(0)
        self.m.group_rank.set(-1)
        spare = self.members is not None and self.members > self.max_nodes
        if spare and self.state != "spare" and self.notify is not None:
            self.notify(
                events.WAITING_AS_SPARE,
                f"{self.members} pods registered and a round holds at most {self.max_nodes}: "
                "waiting as a spare for the next re-form",
            )
        self._set("spare" if spare else "waiting_rendezvous")

    def members_registered(self, count: int) -> None:
        """Pods registered under the job's members key: more than maxNodes while this pod
        waits means it waits as a spare (the round is full)."""
        with self._lock:
            self.members = count
            if self.state in {"waiting_rendezvous", "spare"}:
                self._waiting()

    def attempt(self, attempt: AttemptLine) -> None:
        now = self.clock()
        with self._lock:
            self.current = attempt
            self.rounds += 1
            was_spare = self.state == "spare"
            if self.rounds > 1:
                self.m.reforms.inc()
                took = ""
                if self.ended_at is not None:
                    self.m.reform_rendezvous.observe(max(0.0, now - self.ended_at))
                    self.reform_started = self.ended_at
                    took = f" after {max(0.0, now - self.ended_at):.1f} s"
                if self.notify is not None:
                    self.notify(
                        events.REFORMED,
                        f"re-formed at world size {attempt.nodes}{took} (round {self.rounds}, "
                        f"group rank {attempt.group_rank})",
                    )
            if was_spare and self.notify is not None:
                self.notify(
                    events.SPARE_JOINED,
                    f"joined round {self.rounds} at world size {attempt.nodes} after waiting "
                    "as a spare",
                )
            self.ended_at = None
            # TORCHELASTIC_RESTART_COUNT counts failures within one torchrun (run_id).
            previous = self.last_restart
            same_run = previous is not None and previous[0] == attempt.run_id
            used_before = previous[1] if previous is not None and same_run else 0
            if attempt.restart > used_before:
                self.m.restarts.inc(attempt.restart - used_before)
            self.last_restart = (attempt.run_id, attempt.restart)
            self.m.round.set(self.rounds)
            self.m.world_size.set(attempt.nodes)
            self.m.group_rank.set(attempt.group_rank)
            self.m.restarts_used.set(attempt.restart)
            self.m.restarts_left.set(max(0, self.max_restarts - attempt.restart))
            self._set("training")

    def attempt_ended(self) -> None:
        """The current attempt's training process (local rank 0) is gone."""
        now = self.clock()
        with self._lock:
            if self.current is None:
                return
            self.current = None
            self.ended_at = now
            self.reform_started = None
            if self.state == "training":
                self._waiting()

    def progress(self, step: int) -> None:
        now = self.clock()
        with self._lock:
            if self.step is not None and self.step_at is not None and step > self.step:
                self.m.step_seconds().set((now - self.step_at) / (step - self.step))
            if self.reform_started is not None and self.current is not None:
                self.m.reform_first_step.observe(max(0.0, now - self.reform_started))
                self.reform_started = None
            self.step, self.step_at = step, now
            self.m.last_step().set(step)
            self.m.last_progress().set(now)

    def hung(self, action: str) -> None:
        """The hang watch took this pod's rank out, or restarted the round (HANG_ACTIONS)."""
        with self._lock:
            self.m.hangs.labels(*self.m.values, action).inc()

    def restored(self, event: Restored) -> None:
        """The training process of this attempt loaded its state (a `restored=` line)."""
        with self._lock:
            self.m.restored_step.set(event.step)
            if event.source not in RESTORE_SOURCES:  # `none`: a first start, nothing lost
                return
            self.m.restores.labels(*self.m.values, event.source).inc()
            if event.lost is not None:
                self.m.steps_lost.observe(event.lost)
        if self.notify is not None:
            lost = "unknown" if event.lost is None else str(event.lost)
            self.notify(
                events.STATE_RESTORED,
                f"training state restored at step {event.step} from {event.source} "
                f"({lost} steps lost)",
            )

    def exit_barrier(self, waiting: int | None) -> None:
        """This node's training processes exited 0 and its torchrun waits for `waiting`
        other nodes (None: it cannot tell which) in torch's exit barrier."""
        with self._lock:
            self.m.exit_barrier_waiting.set(-1 if waiting is None else waiting)
            self._set("exit_barrier")

    def finished(self, completed: bool) -> None:
        with self._lock:
            self.m.exit_barrier_waiting.set(0)
            self.current = None
            self.m.world_size.set(0)
            self.m.group_rank.set(-1)
            if completed:
                self.m.completed.set(1)
            self._set("completed" if completed else "failed")
