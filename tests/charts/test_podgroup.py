"""templates/podgroup.yaml: the Volcano gang (gang.volcano.enabled)."""

from __future__ import annotations

from pathlib import Path

import pytest
from chart_render import ELASTIC_JOB, EXAMPLES, RELEASE, objects, of_kind, one


@pytest.mark.parametrize(("min_nodes", "replicas"), [(1, 1), (2, 3), (5, 8)])
def test_min_member_equals_torchrun_min_nodes(min_nodes: int, replicas: int) -> None:
    """PodGroup minMember == job.minNodes == ELASTIC_MIN_NODES, whatever the replicas."""
    objs = objects(
        ELASTIC_JOB,
        sets=[
            "gang.volcano.enabled=true",
            f"job.minNodes={min_nodes}",
            f"job.maxNodes={replicas}",
            f"workerGroups.default.replicas={replicas}",
        ],
    )
    podgroup = one(objs, "PodGroup")
    assert podgroup["spec"]["minMember"] == min_nodes
    (sts,) = [s for s in of_kind(objs, "StatefulSet") if s["metadata"]["name"].endswith("default")]
    env = {
        e["name"]: e.get("value") for e in sts["spec"]["template"]["spec"]["containers"][0]["env"]
    }
    assert env["ELASTIC_MIN_NODES"] == str(podgroup["spec"]["minMember"])


def test_min_member_equals_min_nodes_in_every_gang_example() -> None:
    """values-examples with gang.volcano.enabled: minMember == job.minNodes."""
    for name in ("eks-efa.yaml", "onprem-infiniband.yaml"):
        objs = objects(ELASTIC_JOB, values=[EXAMPLES / name])
        podgroup = one(objs, "PodGroup")
        worker = next(
            s for s in of_kind(objs, "StatefulSet") if "worker" in str(s["metadata"]["labels"])
        )
        env = {
            e["name"]: e.get("value")
            for e in worker["spec"]["template"]["spec"]["containers"][0]["env"]
        }
        assert str(podgroup["spec"]["minMember"]) == env["ELASTIC_MIN_NODES"]


def test_min_resources_are_min_nodes_times_the_smallest_pod() -> None:
    """minResources = job.minNodes x the smallest group's per-pod requests (GPUs included)."""
    objs = objects(
        ELASTIC_JOB,
        sets=[
            "gang.volcano.enabled=true",
            "job.minNodes=2",
            "job.maxNodes=3",
            "worker.gpus=4",
            "job.nprocPerNode=4",
            "worker.resources.requests.cpu=8",
            "worker.resources.requests.memory=64Gi",
            "workerGroups.default=null",
            "workerGroups.big.replicas=1",
            "workerGroups.big.resources.requests.cpu=16",
            "workerGroups.big.resources.requests.memory=128Gi",
            "workerGroups.small.replicas=2",
        ],
    )
    assert one(objs, "PodGroup")["spec"]["minResources"] == {
        "cpu": "16",
        "memory": "128Gi",
        "nvidia.com/gpu": "8",
    }


def test_queue_and_priority_class() -> None:
    """gang.volcano.queue and priorityClassName on the PodGroup; named after the release."""
    podgroup = one(
        objects(
            ELASTIC_JOB,
            sets=[
                "gang.volcano.enabled=true",
                "gang.volcano.queue=research",
                "gang.volcano.priorityClassName=high",
            ],
        ),
        "PodGroup",
    )
    assert podgroup["metadata"]["name"] == f"{RELEASE}-elastic-job"
    assert podgroup["spec"]["queue"] == "research"
    assert podgroup["spec"]["priorityClassName"] == "high"


def test_no_podgroup_by_default() -> None:
    """gang.volcano.enabled=false (default): no PodGroup (no CRD needed)."""
    assert not of_kind(objects(ELASTIC_JOB), "PodGroup")


def test_min_resources_leave_out_what_some_group_does_not_request() -> None:
    """A CPU-only group beside a GPU group: the GPU is not in minResources (the smallest
    gang may need none)."""
    objs = objects(
        ELASTIC_JOB,
        sets=[
            "gang.volcano.enabled=true",
            "job.minNodes=2",
            "job.maxNodes=3",
            "worker.resources.requests.cpu=4",
            "workerGroups.default=null",
            "workerGroups.gpu.replicas=2",
            "workerGroups.gpu.gpus=1",
            "workerGroups.cpu.replicas=1",
        ],
    )
    assert one(objs, "PodGroup")["spec"]["minResources"] == {"cpu": "8"}


@pytest.mark.parametrize(("other", "expected"), [("2.5G", "5G"), ("4e9", "6000000000")])
def test_min_resources_compare_quantities_written_as_yaml_numbers(
    tmp_path: Path, other: str, expected: str
) -> None:
    """A YAML integer request (Helm holds 3000000000 as 3e+09) is compared by its size,
    and job.minNodes times it is written in full."""
    values = tmp_path / "numbers.yaml"
    values.write_text(
        "gang:\n  volcano:\n    enabled: true\njob:\n  minNodes: 2\n  maxNodes: 2\n"
        "worker:\n  shmSizeLimit: 1Mi\nworkerGroups:\n  default: null\n"
        "  a:\n    replicas: 1\n    resources:\n      requests:\n        memory: 3000000000\n"
        f"  b:\n    replicas: 1\n    resources:\n      requests:\n        memory: {other}\n"
    )
    podgroup = one(objects(ELASTIC_JOB, values=[values]), "PodGroup")
    assert podgroup["spec"]["minResources"] == {"memory": expected}
