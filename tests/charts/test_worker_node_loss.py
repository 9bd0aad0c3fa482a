"""The worker pods' tolerations of a lost node (`nodeLoss.notReadyTolerationSeconds`,
`nodeLoss.unreachableTolerationSeconds`): how long Kubernetes leaves a pod bound to a
NotReady or unreachable node before it evicts it, written on every pod (so Kubernetes'
DefaultTolerationSeconds admission adds no 300 s of its own), and a user's own toleration
of the same taint left to win."""

from __future__ import annotations

from typing import Any

from chart_render import ELASTIC_JOB, objects, pod_spec, worker_statefulsets

NOT_READY = "node.kubernetes.io/not-ready"
UNREACHABLE = "node.kubernetes.io/unreachable"


def tolerations(*sets: str) -> list[dict[str, Any]]:
    (sts,) = worker_statefulsets(objects(ELASTIC_JOB, sets=list(sets)))
    return list(pod_spec(sts).get("tolerations") or [])


def seconds(tols: list[dict[str, Any]], key: str) -> list[int | None]:
    """tolerationSeconds of each NoExecute toleration of `key` (None: no limit)."""
    return [
        t.get("tolerationSeconds")
        for t in tols
        if t.get("key") == key and t.get("effect") == "NoExecute"
    ]


def test_node_loss_tolerations_default_to_300_s_not_ready_and_an_hour_unreachable() -> None:
    tols = tolerations()
    assert {
        "key": NOT_READY,
        "operator": "Exists",
        "effect": "NoExecute",
        "tolerationSeconds": 300,
    } in tols
    assert seconds(tols, UNREACHABLE) == [3600]
    assert len(tols) == 2


def test_node_loss_toleration_seconds_are_set_and_null_means_no_limit() -> None:
    tols = tolerations(
        "nodeLoss.notReadyTolerationSeconds=60", "nodeLoss.unreachableTolerationSeconds=null"
    )
    assert seconds(tols, NOT_READY) == [60]
    unreachable = [t for t in tols if t["key"] == UNREACHABLE]
    assert unreachable == [{"key": UNREACHABLE, "operator": "Exists", "effect": "NoExecute"}]


def test_node_loss_tolerations_join_the_workers_and_each_groups_own() -> None:
    tols = tolerations(
        "worker.tolerations[0].key=nvidia.com/gpu", "worker.tolerations[0].operator=Exists"
    )
    assert tols[0] == {"key": "nvidia.com/gpu", "operator": "Exists"}
    assert seconds(tols, NOT_READY) == [300] and seconds(tols, UNREACHABLE) == [3600]


def test_node_loss_leaves_a_users_own_toleration_of_the_taint_alone() -> None:
    # theirs, for ever: the chart adds no second toleration of the same taint
    tols = tolerations(
        f"worker.tolerations[0].key={UNREACHABLE}",
        "worker.tolerations[0].operator=Exists",
        "worker.tolerations[0].effect=NoExecute",
    )
    assert seconds(tols, UNREACHABLE) == [None]
    assert seconds(tols, NOT_READY) == [300]
    # a toleration of every taint covers both (admission's rule, too)
    assert tolerations("worker.tolerations[0].operator=Exists") == [{"operator": "Exists"}]
