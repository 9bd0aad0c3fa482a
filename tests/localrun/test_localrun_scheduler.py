"""The scheduler's node choice: selectors, affinity, taints, requests."""

from __future__ import annotations

from typing import Any

from localrun.cluster.scheduler import choose_node


def _node(
    name: str, labels: dict[str, str], cpu: str = "4", taints: list[Any] | None = None
) -> Any:
    return {
        "metadata": {"name": name, "labels": labels},
        "spec": {"taints": taints or []},
        "status": {"allocatable": {"cpu": cpu, "memory": "16Gi", "pods": "110"}},
    }


NODES = {
    "cpu-0": _node("cpu-0", {"pool": "system"}, cpu="2"),
    "gpu-0": _node(
        "gpu-0",
        {"pool": "gpu", "nvidia.com/gpu.present": "true"},
        taints=[{"key": "nvidia.com/gpu", "effect": "NoSchedule"}],
    ),
    "spot-0": _node("spot-0", {"pool": "spot"}),
}


def test_affinity_keeps_etcd_off_gpu_nodes_and_taints_are_respected() -> None:
    spec = {
        "affinity": {
            "nodeAffinity": {
                "requiredDuringSchedulingIgnoredDuringExecution": {
                    "nodeSelectorTerms": [
                        {
                            "matchExpressions": [
                                {"key": "nvidia.com/gpu.present", "operator": "DoesNotExist"}
                            ]
                        }
                    ]
                }
            }
        }
    }
    node, _ = choose_node(spec, NODES, {})
    assert node in ("cpu-0", "spot-0")
    tolerating = {
        "tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists"}],
        "nodeSelector": {"pool": "gpu"},
    }
    assert choose_node(tolerating, NODES, {})[0] == "gpu-0"
    assert choose_node({"nodeSelector": {"pool": "gpu"}}, NODES, {})[0] is None


def test_spreads_by_pod_count_and_reports_why_nothing_fits() -> None:
    spec = {"containers": [{"resources": {"requests": {"cpu": "1500m"}}}]}
    placed = {"cpu-0": [], "spot-0": [spec]}
    assert choose_node(spec, NODES, placed)[0] == "cpu-0"
    full = {"cpu-0": [spec], "spot-0": [spec, spec]}
    node, why = choose_node(spec, NODES, full)
    assert node is None
    assert why.startswith("0/3 nodes are available:")
    assert "Insufficient cpu" in why
