"""The pod's metrics (docs/contracts.md, "Metrics"): what each series says after what the
worker saw, the HTTP endpoint, and three real agents (etcd, torchrun, train.py) of which
one is killed. The attempt shim's log line is in tests/worker/test_attempt_line.py, the
follower in observe/test_attempts.py."""

from __future__ import annotations

import contextlib
import subprocess
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from elastic_worker.attempt_line import AttemptLine as Attempt
from elastic_worker.attempt_line import parse_attempt
from elastic_worker.observe.metrics import (
    STATES,
    Identity,
    JobMetrics,
    Tracker,
    parse_progress,
    serve,
)
from elastic_worker.settings import config
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families
from testlib import EtcdServer, free_port

from worker.worker_helpers import TRAIN, Agent, wait_until, worker_env

WHO = Identity("default-run42", "workers")


def values(text: str) -> dict[str, float]:
    """Sample name -> value; a state set's samples as name:state; buckets left out."""
    out: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name.endswith("_bucket") or sample.name.endswith("_created"):
                continue
            state = sample.labels.get("elastic_job_pod_state")
            source = sample.labels.get("source")
            name = f'{sample.name}{{source="{source}"}}' if source else sample.name
            out[f"{name}:{state}" if state else name] = sample.value
    return out


def state(v: dict[str, float]) -> str:
    on = [s for s in STATES if v.get(f"elastic_job_pod_state:{s}") == 1]
    assert len(on) == 1, v
    return on[0]


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def tracked(max_nodes: int = 3, max_restarts: int = 5) -> tuple[Tracker, JobMetrics, Clock]:
    clock = Clock()
    metrics = JobMetrics(WHO)
    return Tracker(metrics, 2, max_nodes, max_restarts, clock=clock), metrics, clock


def attempt(restart: int, rank: int, nodes: int, run_id: str = "default-run42") -> Attempt:
    line = (
        f"[elastic-worker] attempt run_id={run_id} restart={restart} group_rank={rank} "
        f"nodes={nodes} world_size={nodes} pid=1"
    )
    parsed = parse_attempt(line)
    assert parsed is not None
    return parsed


def scrape(metrics: JobMetrics) -> dict[str, float]:
    return values(generate_latest(metrics.registry).decode())


# The labels Prometheus and prometheus-operator put on a pod's scrape target (a PodMonitor's
# generated relabelings: namespace, pod, container, endpoint, job; Prometheus: instance; a
# ServiceMonitor adds service). A series label of the same name is renamed `exported_<name>`
# unless the scrape honours labels, which kube-prometheus-stack's conventions avoid.
TARGET_LABELS = {"job", "instance", "namespace", "pod", "container", "endpoint", "service"}


def test_every_series_carries_elastic_job_and_group_and_nothing_else() -> None:
    """Labels of our own (elastic_job, group): the scrape adds namespace and pod, and no
    series label clashes with a target label, so no honorLabels is needed."""
    tracker, metrics, _ = tracked()
    tracker.attempt(attempt(0, 0, 2))
    tracker.progress(3)
    metrics.node.info({"node": "n1", **{label: "x" for label, _ in config.NODE_INFO}})
    for family in text_string_to_metric_families(generate_latest(metrics.registry).decode()):
        assert family.name.startswith("elastic_job_")
        for sample in family.samples:
            assert not set(sample.labels) & TARGET_LABELS, sample
            extra = set(sample.labels) - {"elastic_job", "group"}
            # the node's info series is the one with more: one per pod, constant
            node = {"node", *(label for label, _ in config.NODE_INFO)}
            assert (
                extra <= {"le", "elastic_job_pod_state"}
                or (sample.name == "elastic_job_node_info" and extra == node)
                or (sample.name.startswith("elastic_job_restores_") and extra == {"source"})
                or (sample.name.startswith("elastic_job_hangs_") and extra == {"action"})
            ), sample
            assert (sample.labels["elastic_job"], sample.labels["group"]) == (WHO.job, WHO.group)


def test_the_node_info_series_carries_the_topology_init_topology_wrote(tmp_path: Path) -> None:
    """What a dashboard groups pods by (spot vs on-demand, GPU model), from /etc/inject/env."""
    inject = tmp_path / "env"
    inject.write_text(
        "NODE_NAME='gpu-7'\nNODE_INSTANCE_TYPE='p5.48xlarge'\nNODE_CAPACITY_TYPE='spot'\n"
        "NODE_GPU_MODEL='H100'\nNODE_ZONE='us-east-1a'\n"
    )
    env = {
        "ELASTIC_JOB_ID": WHO.job,
        "ELASTIC_RDZV_ENDPOINT": "127.0.0.1:2379",
        "ELASTIC_MIN_NODES": "1",
        "ELASTIC_MAX_NODES": "2",
        "ELASTIC_INJECT_ENV": str(inject),
    }
    cfg = config.load(["train.py"], env)
    metrics = JobMetrics(WHO)
    metrics.node.info({"node": cfg.node_name, **dict(cfg.node_info)})
    text = generate_latest(metrics.registry).decode()
    assert (
        'elastic_job_node_info{capacity_type="spot",elastic_job="default-run42",'
        'gpu_model="H100",group="workers",instance_type="p5.48xlarge",node="gpu-7",'
        'zone="us-east-1a"} 1.0'
    ) in text, text


def test_the_node_info_reads_variables_init_topology_writes() -> None:
    from init_topology.main import SUMMARY_KEYS  # noqa: PLC0415 - the other image's package

    assert {var for _, var in config.NODE_INFO} <= set(SUMMARY_KEYS)


def test_a_reform_is_counted_once_and_timed_from_this_nodes_process_ending() -> None:
    tracker, metrics, clock = tracked(max_restarts=5)
    tracker.gate_begin()
    clock.now += 2
    assert scrape(metrics)["elastic_job_gate_wait_seconds"] == 2  # grows while it waits
    clock.now += 1
    tracker.gate_end()
    clock.now += 50
    v = scrape(metrics)
    assert v["elastic_job_gate_wait_seconds"] == 3 and state(v) == "gating"

    tracker.torchrun_started()
    v = scrape(metrics)
    assert state(v) == "waiting_rendezvous"
    assert (v["elastic_job_world_size_nodes"], v["elastic_job_group_rank"]) == (0, -1)

    tracker.attempt(attempt(0, 1, 3))
    assert "elastic_job_last_step" not in scrape(metrics)  # until the script reports
    clock.now += 1
    tracker.progress(1)
    clock.now += 1
    tracker.progress(3)
    v = scrape(metrics)
    assert state(v) == "training"
    assert (v["elastic_job_rendezvous_round"], v["elastic_job_world_size_nodes"]) == (1, 3)
    assert v["elastic_job_group_rank"] == 1
    assert v["elastic_job_reforms_total"] == 0  # the first round is no re-form
    assert v["elastic_job_step_seconds"] == 0.5  # 2 steps in 1 s
    assert (v["elastic_job_last_step"], v["elastic_job_last_progress_timestamp_seconds"]) == (
        3,
        clock.now,
    )
    assert v["elastic_job_torchrun_restarts_remaining"] == 5

    clock.now += 4
    tracker.attempt_ended()  # a peer died: this node's process failed
    assert state(scrape(metrics)) == "waiting_rendezvous"
    clock.now += 5.5
    tracker.attempt(attempt(1, 0, 2))
    clock.now += 2.5
    tracker.progress(4)
    tracker.progress(5)  # only the first step after the re-form is timed
    v = scrape(metrics)
    assert v["elastic_job_reforms_total"] == 1
    assert (
        v["elastic_job_reform_rendezvous_seconds_count"],
        v["elastic_job_reform_rendezvous_seconds_sum"],
    ) == (1, 5.5)
    assert (
        v["elastic_job_reform_first_step_seconds_count"],
        v["elastic_job_reform_first_step_seconds_sum"],
    ) == (1, 8)
    assert v["elastic_job_worker_restarts_total"] == 1
    assert (
        v["elastic_job_torchrun_restarts_used"],
        v["elastic_job_torchrun_restarts_remaining"],
    ) == (1, 4)
    assert (v["elastic_job_rendezvous_round"], v["elastic_job_world_size_nodes"]) == (2, 2)
    assert v["elastic_job_group_rank"] == 0

    tracker.finished(completed=True)
    v = scrape(metrics)
    assert state(v) == "completed" and v["elastic_job_completed"] == 1
    assert v["elastic_job_world_size_nodes"] == 0


def test_a_membership_reform_costs_no_restart_and_a_new_torchrun_starts_its_count_again() -> None:
    tracker, metrics, _ = tracked(max_restarts=3)
    tracker.attempt(attempt(2, 0, 2, run_id="job"))
    tracker.attempt_ended()
    tracker.attempt(attempt(2, 0, 3, run_id="job"))  # a node joined: same restart count
    v = scrape(metrics)
    assert (v["elastic_job_worker_restarts_total"], v["elastic_job_reforms_total"]) == (2, 1)
    tracker.attempt_ended()
    tracker.attempt(attempt(0, 0, 2, run_id="job-e1"))  # the next epoch's torchrun
    tracker.attempt_ended()
    tracker.attempt(attempt(1, 0, 2, run_id="job-e1"))
    v = scrape(metrics)
    assert v["elastic_job_worker_restarts_total"] == 3
    assert (
        v["elastic_job_torchrun_restarts_used"],
        v["elastic_job_torchrun_restarts_remaining"],
    ) == (1, 2)


def test_waiting_while_more_pods_are_registered_than_max_nodes_is_spare() -> None:
    tracker, metrics, _ = tracked(max_nodes=2)
    tracker.torchrun_started()
    tracker.members_registered(2)
    assert state(scrape(metrics)) == "waiting_rendezvous"
    tracker.members_registered(3)
    assert state(scrape(metrics)) == "spare"
    tracker.attempt(attempt(0, 1, 2))
    tracker.members_registered(3)
    assert state(scrape(metrics)) == "training"  # a trainer is never a spare
    tracker.finished(completed=False)
    assert state(scrape(metrics)) == "failed"


def test_a_node_that_finished_waits_in_the_exit_barrier_for_the_others() -> None:
    """Its training processes exited 0 and torchrun waits for the other nodes': the state
    says so, the gauge says for how many (-1: it cannot tell), and both clear at the end."""
    tracker, metrics, _ = tracked()
    tracker.torchrun_started()
    tracker.attempt(attempt(0, 1, 3))
    assert scrape(metrics)["elastic_job_exit_barrier_waiting_nodes"] == 0
    tracker.attempt_ended()
    tracker.exit_barrier(2)
    v = scrape(metrics)
    assert (state(v), v["elastic_job_exit_barrier_waiting_nodes"]) == ("exit_barrier", 2)
    tracker.exit_barrier(None)
    assert scrape(metrics)["elastic_job_exit_barrier_waiting_nodes"] == -1
    tracker.finished(completed=True)
    v = scrape(metrics)
    assert (state(v), v["elastic_job_exit_barrier_waiting_nodes"]) == ("completed", 0)


@pytest.mark.parametrize(
    ("line", "step"),
    [
        ("step=7", 7),
        ("step=12 loss=0.3", 12),
        ("epoch=1 step=9", 9),
        ("step=-1", None),
        ("x", None),
    ],
)
def test_progress_lines(line: str, step: int | None) -> None:
    assert parse_progress(line) == step


def get_metrics(port: int) -> dict[str, float]:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as resp:
        return values(resp.read().decode())


def test_the_metrics_are_served_over_http() -> None:
    tracker, metrics, _ = tracked()
    port = free_port()
    server = serve(metrics, port, addr="127.0.0.1")
    try:
        tracker.torchrun_started()
        assert state(get_metrics(port)) == "waiting_rendezvous"
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as resp:
            assert "_created" not in resp.read().decode()  # only the series we define
    finally:
        server.shutdown()
        server.server_close()


Started = list[tuple[Agent, int]]


@pytest.fixture
def start_agents(etcd: EtcdServer, tmp_path: Path) -> Iterator[Callable[..., Started]]:
    """Start three elastic-worker agents with metrics on, each on a port of its own."""
    started: Started = []

    def start(job: str, steps: int, **extra: str) -> Started:
        args = ["python", str(TRAIN), "--checkpoint-dir", str(tmp_path / "ckpt")]
        args += ["--steps", str(steps), "--checkpoint-every", "5", "--step-seconds", "0.2"]
        for i in range(3):
            port = free_port()
            env = worker_env(
                etcd.endpoint,
                job,
                POD_NAME=f"w{i}",
                ELASTIC_GROUP="workers",
                ELASTIC_METRICS="true",
                ELASTIC_METRICS_PORT=str(port),
                **extra,
            )
            started.append((Agent.start(f"w{i}", args, env, tmp_path / f"w{i}.log"), port))
        return started

    yield start
    for agent, _ in started:
        agent.kill()
        with contextlib.suppress(subprocess.TimeoutExpired):
            agent.wait(10)


@pytest.fixture
def agents(start_agents: Callable[..., Started]) -> Started:
    return start_agents("metrics-kill", 60)


def maybe_metrics(port: int) -> dict[str, float]:
    try:
        return get_metrics(port)
    except OSError:
        return {}


@pytest.mark.slow
def test_a_killed_node_shows_as_one_reform_to_two_nodes_with_its_cost(agents: Started) -> None:
    """Real torchrun: the shim's lines, the training processes' ends and train.py's
    progress give the survivors' series; TORCHELASTIC_RESTART_COUNT counts the failure."""

    def training(port: int, nodes: int) -> bool:
        v = maybe_metrics(port)
        return (
            v.get("elastic_job_pod_state:training") == 1
            and v.get("elastic_job_world_size_nodes") == nodes
            and v.get("elastic_job_last_step", 0) >= 3
        )

    wait_until("three pods training", lambda: all(training(p, 3) for _, p in agents), timeout=120)
    ranks = {p: get_metrics(p)["elastic_job_group_rank"] for _, p in agents}
    assert sorted(ranks.values()) == [0, 1, 2]
    dead = next(a for a, p in agents if ranks[p] == 1)
    survivors = [p for a, p in agents if a is not dead]
    dead.kill()
    wait_until("two pods training", lambda: all(training(p, 2) for p in survivors), timeout=90)
    wait_until(
        "the first step after the re-form",
        lambda: all(
            maybe_metrics(p).get("elastic_job_reform_first_step_seconds_count") == 1
            for p in survivors
        ),
        timeout=60,
    )
    for port in survivors:
        v = get_metrics(port)
        assert v["elastic_job_reforms_total"] == 1
        assert v["elastic_job_rendezvous_round"] == 2
        assert v["elastic_job_reform_rendezvous_seconds_count"] == 1
        # seconds (keep-alive expiry and last call: docs/recovery.md)
        assert 0 < v["elastic_job_reform_rendezvous_seconds_sum"] < 60
        assert (
            v["elastic_job_reform_rendezvous_seconds_sum"]
            <= v["elastic_job_reform_first_step_seconds_sum"]
        )
        assert v["elastic_job_worker_restarts_total"] == 1
        assert v["elastic_job_torchrun_restarts_used"] == 1
        assert v["elastic_job_torchrun_restarts_remaining"] == 19
        assert v["elastic_job_gate_wait_seconds"] > 0
        assert v["elastic_job_completed"] == 0
        print(
            f"re-form on port {port}: rendezvous "
            f"{v['elastic_job_reform_rendezvous_seconds_sum']:.1f} s, first step "
            f"{v['elastic_job_reform_first_step_seconds_sum']:.1f} s"
        )
    for agent, _ in agents:
        if agent is not dead:
            assert agent.wait(180) == 0, agent.text()[-3000:]


@pytest.mark.slow
def test_a_pod_waiting_while_the_round_is_full_is_a_spare(
    start_agents: Callable[..., Started],
) -> None:
    """maxNodes 2 and three pods registered: two train, the third shows as spare."""
    agents = start_agents("metrics-spare", 40, ELASTIC_MIN_NODES="2", ELASTIC_MAX_NODES="2")

    def states() -> list[str]:
        found = []
        for _, port in agents:
            v = maybe_metrics(port)
            found += [s for s in STATES if v.get(f"elastic_job_pod_state:{s}") == 1]
        return sorted(found)

    wait_until(
        "two pods training and one spare",
        lambda: states() == ["spare", "training", "training"],
        timeout=120,
    )
    spare = next(p for _, p in agents if maybe_metrics(p).get("elastic_job_pod_state:spare") == 1)
    v = get_metrics(spare)
    assert (v["elastic_job_world_size_nodes"], v["elastic_job_group_rank"]) == (0, -1)
    assert v["elastic_job_rendezvous_round"] == 0


@pytest.mark.parametrize("loss_detection", ["false", "true"])
def test_metrics_off_sets_no_files_for_torchrun(
    etcd: EtcdServer, tmp_path: Path, loss_detection: str
) -> None:
    """ELASTIC_METRICS unset: no port; the attempt log and the progress file only when the
    round liveness (ELASTIC_LOSS_DETECTION) reads them (the progress file for a script's
    snapshot lines: whether to stop it with SIGTERM first)."""
    out = tmp_path / "env"
    code = f"import os; open({str(out)!r}, 'w').write(repr(sorted(os.environ)))"
    env = worker_env(
        etcd.endpoint,
        "metrics-off",
        ELASTIC_MIN_NODES="1",
        ELASTIC_MAX_NODES="1",
        ELASTIC_LOSS_DETECTION=loss_detection,
    )
    agent = Agent.start("w0", ["python", "-c", code], env, tmp_path / "w0.log")
    try:
        assert agent.wait(120) == 0, agent.text()
    finally:
        agent.kill()
    names = out.read_text()
    assert ("ELASTIC_ATTEMPT_LOG" in names) is (loss_detection == "true")
    assert ("ELASTIC_PROGRESS_FILE" in names) is (loss_detection == "true")
    assert "metrics on port" not in agent.text()


def test_each_hang_the_watch_acted_on_is_counted_by_what_this_pod_did() -> None:
    """elastic_job_hangs_total{action}: both series from the start (a rate() sees the
    first), one more per hang this pod's rank held (took-out) or no rank held (restarted)."""
    tracker, metrics, _ = tracked()

    def hangs() -> dict[str, float]:
        text = generate_latest(metrics.registry).decode()
        return {
            s.labels["action"]: s.value
            for family in text_string_to_metric_families(text)
            for s in family.samples
            if s.name == "elastic_job_hangs_total"
        }

    assert hangs() == {"took-out": 0.0, "restarted-round": 0.0}
    tracker.hung("took-out")
    tracker.hung("took-out")
    tracker.hung("restarted-round")
    assert hangs() == {"took-out": 2.0, "restarted-round": 1.0}
