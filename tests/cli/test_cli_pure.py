"""elastic-job's pure parts: state derivation, the event merge, pricing, the metrics text."""

from __future__ import annotations

from datetime import datetime, timezone
from typing import Any

import pytest
from elastic_job_cli import jobstate, pricing, promtext, timeline
from elastic_job_cli.responses import object_list, watch_event
from elastic_worker.attempt_line import AttemptLine as Attempt
from elastic_worker.observe.metrics import Identity, JobMetrics, Tracker
from prometheus_client import generate_latest

from localrun.cluster.nodes import load_nodes

D = "2026-11-23T"  # the day of every time below
NODES = load_nodes("all")
STS = {
    "metadata": {"name": "run42-w", "labels": {"elastic-job.pytorch.org/group": "default"}},
    "spec": {
        "replicas": 3,
        "template": {
            "spec": {
                "containers": [
                    {
                        "name": "worker",
                        "env": [
                            {"name": "ELASTIC_MIN_NODES", "value": "2"},
                            {"name": "ELASTIC_MAX_NODES", "value": "3"},
                        ],
                    }
                ]
            }
        },
    },
}


def pod(
    name: str,
    node: str = "local-spot-0",
    *,
    ready: bool = True,
    restarts: int = 0,
    last_exit: int | None = None,
    disruption: str | None = None,
    start: str = D + "10:00:00Z",
) -> dict[str, Any]:
    conditions = [{"type": "Ready", "status": "True" if ready else "False"}]
    if disruption:
        conditions.append(
            {"type": "DisruptionTarget", "status": "True", "reason": disruption,
             "message": "Pod was terminated in response to imminent node shutdown.",
             "lastTransitionTime": D + "10:05:00Z"}
        )  # fmt: skip
    status: dict[str, Any] = {"name": "worker", "restartCount": restarts, "state": {"running": {}}}
    if last_exit is not None:
        status["lastState"] = {"terminated": {"exitCode": last_exit, "finishedAt": D + "10:03:00Z"}}
    return {
        "metadata": {
            "name": name,
            "uid": f"uid-{name}",
            "labels": {"elastic-job.pytorch.org/group": "default"},
            "ownerReferences": [{"kind": "StatefulSet", "name": "run42-w"}],
        },
        "spec": {"nodeName": node, "containers": [{"name": "worker"}]},
        "status": {
            "phase": "Running",
            "startTime": start,
            "conditions": conditions,
            "containerStatuses": [status],
        },
    }


def event(reason: str, name: str, message: str, when: str, kind: str = "Pod") -> dict[str, Any]:
    return {
        "metadata": {"name": f"{name}.{when}", "creationTimestamp": when},
        "involvedObject": {"kind": kind, "name": name},
        "reason": reason,
        "message": message,
        "lastTimestamp": when,
        "type": "Normal",
    }


def metrics(state: str, rank: int, world: int, **more: float) -> dict[str, float]:
    m = {
        f"elastic_job_pod_state{{state={s}}}": float(s == state)
        for s in ("gating", "training", "spare", "completed", "failed", "waiting_rendezvous")
    }
    m.update(
        elastic_job_group_rank=rank,
        elastic_job_world_size_nodes=world,
        elastic_job_rendezvous_round=2,
        **more,
    )
    return m


def derive(
    pods: list[dict[str, Any]], m: dict[str, Any], events: list[Any] | None = None
) -> jobstate.JobView:
    return jobstate.derive(
        "run42", "ml", statefulsets=[STS], pods=pods, nodes=NODES, metrics=m, events=events or [],
        metrics_note="on" if any(m.values()) else "off",
    )  # fmt: skip


# -- state -------------------------------------------------------------------------------


def test_training_from_metrics_with_reforms_and_the_last_reforms_cost() -> None:
    pods = [pod("run42-w-0"), pod("run42-w-1", "local-ondemand-0")]
    m = {
        "run42-w-0": metrics(
            "training", 0, 2, elastic_job_reforms_total=1, elastic_job_last_step=40
        ),
        "run42-w-1": metrics(
            "training", 1, 2, elastic_job_reforms_total=1, elastic_job_last_step=40
        ),
    }
    events = [
        event("Reformed", "run42-w-0", "re-formed at world size 3 after 9.0 s", D + "10:01:00Z"),
        event("Reformed", "run42-w-0", "re-formed at world size 2 after 5.6 s", D + "10:04:00Z"),
    ]  # fmt: skip
    view = derive(pods, m, events)
    assert (view.state, view.world_size, view.min_nodes, view.max_nodes) == ("training", 2, 2, 3)
    assert (view.reforms, view.last_reform_seconds, view.last_step) == (1, 5.6, 40)
    assert [(p.capacity_type, p.group_rank) for p in view.pods] == [("spot", 0), ("on-demand", 1)]
    assert view.groups == {"default": {"replicas": 3, "ready": 2}}


def test_below_min_when_fewer_nodes_train_than_min() -> None:
    m = {"run42-w-0": metrics("waiting_rendezvous", -1, 0)}
    view = derive([pod("run42-w-0")], m)
    assert view.state == "below-min" and view.pods[0].group_rank is None


def test_without_metrics_the_state_comes_from_ready_pods() -> None:
    view = derive([pod("run42-w-0"), pod("run42-w-1")], {"run42-w-0": None, "run42-w-1": None})
    assert (view.state, view.world_size, view.pods[0].state) == ("running", 2, "")
    view = derive([pod("run42-w-0"), pod("run42-w-1", ready=False)], {})
    assert (view.state, view.world_size) == ("below-min", 1)


def test_complete_from_the_workers_event_or_scaled_to_zero() -> None:
    done = event("JobCompleted", "run42-w", "training complete", D + "11:00:00Z", "StatefulSet")
    assert derive([pod("run42-w-0")], {}, [done]).state == "complete"
    scaled = {**STS, "spec": {**STS["spec"], "replicas": 0}}
    view = jobstate.derive(
        "run42", "ml", statefulsets=[scaled], pods=[], nodes={}, metrics={}, events=[],
        metrics_note="off",
    )  # fmt: skip
    assert view.state == "complete" and "0 replicas" in view.notes[0]


def test_failed_when_every_pod_failed() -> None:
    m = {"run42-w-0": metrics("failed", -1, 0)}
    assert derive([pod("run42-w-0")], m).state == "failed"


# -- the event merge ---------------------------------------------------------------------


def test_merge_orders_disruptions_exits_node_trouble_and_the_workers_events() -> None:
    nodes = {k: v for k, v in NODES.items()}
    unknown = {"type": "Ready", "status": "Unknown", "lastTransitionTime": D + "10:02:00Z"}
    bad = {**nodes["local-spot-1"], "status": {"conditions": [unknown]}}
    nodes["local-spot-1"] = bad
    pods = [
        pod("run42-w-0", restarts=1, last_exit=137),
        pod("run42-w-1", "local-spot-1", disruption="TerminationByKubelet"),
    ]
    events = [
        event("Reformed", "run42-w-0", "re-formed at world size 1 after 4.5 s", D + "10:06:00Z"),
        event("Started", "someone-else", "not ours", D + "10:00:30Z"),
    ]  # fmt: skip
    entries = timeline.merge(pods, nodes, events, {"run42-w-0", "run42-w-1", "run42-w"})
    assert [(e.time, e.object, e.reason) for e in entries] == [
        (D + "10:02:00Z", "node/local-spot-1", "NodeNotReady"),
        (D + "10:03:00Z", "pod/run42-w-0", "ContainerExited"),
        (D + "10:05:00Z", "pod/run42-w-1", "TerminationByKubelet"),
        (D + "10:06:00Z", "pod/run42-w-0", "Reformed"),
    ]
    assert "exited 137: killed (SIGKILL)" in entries[1].message
    assert "under run42-w-1" in entries[0].message


def test_a_watched_deletion_and_node_removal_are_said_once() -> None:
    seen: set[timeline.Entry] = set()
    names = {"run42-w-0"}
    now = D + "10:09:00Z"
    gone = timeline.entries_for_change(
        "pods", "DELETED", pod("run42-w-0"), seen=seen, names=names, now=now
    )
    assert [e.reason for e in gone] == ["PodDeleted"]
    again = timeline.entries_for_change(
        "pods", "DELETED", pod("run42-w-0"), seen=seen, names=names, now=now
    )
    assert again == []
    node = timeline.entries_for_change(
        "nodes", "DELETED", NODES["local-spot-0"], seen=seen, names=names, now=now
    )
    assert [e.reason for e in node] == ["NodeRemoved"]


# -- pricing -----------------------------------------------------------------------------

PRICES = "currency: USD\nprices:\n  c-4x-amd64-linux:\n    spot: 0.1\n    on-demand: 0.4\n"


def test_prices_file_errors_name_the_entry() -> None:
    with pytest.raises(
        pricing.PricesError, match=r"prices.c-4x.reserved: capacity type must be spot or on-demand"
    ):
        pricing.load_prices("prices:\n  c-4x:\n    reserved: 1\n", "p.yaml")
    with pytest.raises(pricing.PricesError, match=r"prices.c-4x.spot='cheap': give a price"):
        pricing.load_prices("prices:\n  c-4x:\n    spot: cheap\n", "p.yaml")
    with pytest.raises(pricing.PricesError, match="needs a `prices` map"):
        pricing.load_prices("[]", "p.yaml")


def test_cost_from_scheduled_events_and_pod_lifetimes_with_the_reform_share() -> None:
    prices = pricing.load_prices(PRICES, "p.yaml")
    assigned = "Successfully assigned ml/{} to {}".format
    events = [
        # run42-w-1: one hour on a spot node, deleted (its node reclaimed), then back on
        # an on-demand node for an hour (still running now).
        event("Scheduled", "run42-w-1", assigned("run42-w-1", "local-spot-1"), D + "10:00:00Z"),
        event("Killing", "run42-w-1", "Stopping container worker", D + "11:00:00Z"),
        event("Scheduled", "run42-w-1", assigned("run42-w-1", "local-ondemand-0"), D + "11:00:00Z"),
        event("Reformed", "run42-w-0", "re-formed at world size 1 after 36 s", D + "11:00:40Z"),
    ]  # fmt: skip
    pods = [
        pod("run42-w-0", "local-spot-0", start=D + "10:00:00Z"),  # no Event: startTime
        pod("run42-w-1", "local-ondemand-0", start=D + "11:00:00Z"),
    ]
    now = datetime(2026, 11, 23, 12, 0, tzinfo=timezone.utc)
    spans = pricing.intervals(pods, events, now)
    assert sorted((s.pod, s.node, s.hours) for s in spans) == [
        ("run42-w-0", "local-spot-0", 2.0),
        ("run42-w-1", "local-ondemand-0", 1.0),
        ("run42-w-1", "local-spot-1", 1.0),
    ]
    result = pricing.cost(spans, NODES, prices, pricing.reform_seconds(events, {}))
    assert [(x.capacity_type, x.node_hours, x.cost) for x in result.lines] == [
        ("on-demand", 1.0, 0.4),
        ("spot", 3.0, 0.3),
    ]
    assert result.total == 0.7 and result.node_hours == 4.0 and result.gpu_hours == 0.0
    assert result.reform_cost == pytest.approx(36 / 3600 * 0.1, abs=1e-4)
    assert result.reform_share == pytest.approx(result.reform_cost / 0.7, abs=1e-4)


def test_gpu_hours_from_the_nodes_capacity_and_unpriced_types_are_named() -> None:
    prices = pricing.load_prices(PRICES, "p.yaml")
    node_name = "gke-train-a3-spot-pool-8f3c2a1b-x7k2"  # fixtures/gke-a3-h100-spot.json
    start = datetime(2026, 11, 23, 10, tzinfo=timezone.utc)
    spans = [pricing.Interval("p", node_name, start, start.replace(hour=12))]
    result = pricing.cost(spans, NODES, prices, {})
    (line,) = result.lines
    assert line.gpus_per_node == 8 and line.gpu_hours == 16.0 and line.cost is None
    assert (line.instance_type, line.capacity_type) == ("a3-highgpu-8g", "spot")
    assert result.unpriced == ["a3-highgpu-8g/spot"]


# -- metrics text ------------------------------------------------------------------------


def test_the_workers_own_metrics_parse() -> None:
    m = JobMetrics(Identity("run42", "default"))
    t = Tracker(m, 2, 3, 5, clock=lambda: 0.0)
    t.torchrun_started()
    t.attempt(Attempt("r", 0, 1, 3, 3, 9))
    parsed = promtext.parse(generate_latest(m.registry).decode())
    assert jobstate.pod_state(parsed) == "training"
    assert parsed["elastic_job_group_rank"] == 1 and parsed["elastic_job_world_size_nodes"] == 3
    assert parsed["elastic_job_reforms_total"] == 0


def test_the_labels_that_name_the_job_and_pod_are_not_read() -> None:
    """The workers' labels (`elastic_job`, `group`; kube-prometheus-stack keeps `job` for
    the scrape) and an older worker's (`job`, `pod`) read the same: not read at all."""
    m = JobMetrics(Identity("run42", "default"))
    t = Tracker(m, 2, 3, 5, clock=lambda: 0.0)
    t.torchrun_started()
    t.attempt(Attempt("r", 2, 0, 3, 3, 9))
    text = generate_latest(m.registry).decode()
    renamed = text.replace('elastic_job="run42"', 'job="run42",pod="run42-w-0"')
    assert renamed != text
    assert promtext.parse(renamed) == promtext.parse(text)
    assert promtext.parse(text)["elastic_job_torchrun_restarts_remaining"] == 3


def test_pods_that_trained_and_wait_again_are_a_reform_not_the_gate() -> None:
    waiting = {f"run42-w-{i}": metrics("waiting_rendezvous", -1, 0) for i in (0, 1)}
    assert derive([pod("run42-w-0"), pod("run42-w-1")], waiting).state == "re-forming"
    for m in waiting.values():
        m["elastic_job_rendezvous_round"] = 0
    assert derive([pod("run42-w-0"), pod("run42-w-1")], waiting).state == "gating"


def test_a_list_body_is_read_into_the_shape_the_command_reads_and_nothing_else() -> None:
    pod = {"metadata": {"name": "run42-w-0"}}
    assert object_list({"metadata": {"resourceVersion": "7"}, "items": [pod]}) == {
        "metadata": {"resourceVersion": "7"},
        "items": [pod],
    }
    assert object_list({"items": []}) == {"metadata": {}, "items": []}
    assert object_list({"items": None}) == {"metadata": {}, "items": []}  # Go's empty slice
    # What a server that is not Kubernetes (or a proxy's error page) answers: not a list.
    for body in ({"kind": "Status"}, {"items": ["x"]}, {"items": {}}, [pod], "nope"):
        assert object_list(body) is None, body
    # The client's Watch: `raw_object` is the object as served, `object` its own model.
    assert watch_event({"type": "ADDED", "object": object(), "raw_object": pod}) == {
        "type": "ADDED",
        "object": pod,
    }
    assert watch_event({"type": "ERROR", "object": {"kind": "Status"}}) == {
        "type": "ERROR",
        "object": {"kind": "Status"},
    }
    assert watch_event({"object": pod}) is None
