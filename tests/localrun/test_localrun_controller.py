"""Restart back-off as the kubelet does it, and the scheduler's node choice."""

from __future__ import annotations

from typing import Any

from localrun.controller import Backoff, StatefulSet, _loopback_rewrite
from localrun.process import BindMount
from localrun.scheduler import choose_node


def test_backoff_doubles_up_to_the_cap() -> None:
    b = Backoff(base=10, cap=60, reset_after=600)
    assert [b.next_delay(1) for _ in range(6)] == [10, 20, 40, 60, 60, 60]


def test_backoff_resets_after_a_long_run() -> None:
    b = Backoff(base=1, cap=8, reset_after=30)
    assert [b.next_delay(1) for _ in range(3)] == [1, 2, 4]
    assert b.next_delay(31) == 1
    assert b.next_delay(1) == 2


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


def test_statefulset_knows_workers_from_the_rendezvous() -> None:
    def sts(component: str, group: str | None = None) -> StatefulSet:
        labels = {"app.kubernetes.io/component": component}
        if group:
            labels["elastic-job.pytorch.org/group"] = group
        return StatefulSet(
            {
                "metadata": {"name": f"x-{component}"},
                "spec": {
                    "replicas": 2,
                    "serviceName": "svc",
                    "template": {
                        "metadata": {"labels": labels},
                        "spec": {"containers": [{"name": "c"}]},
                    },
                },
            }
        )

    w = sts("worker", "default")
    assert w.is_worker and not w.is_rendezvous and w.group == "default"
    e = sts("rendezvous")
    assert e.is_rendezvous and not e.is_worker


def test_loopback_fallback_rewrites_cluster_names_and_mount_paths_only() -> None:
    table = {
        "demo-etcd.default.svc.cluster.local": ["127.1.2.10"],
        "demo-etcd": ["127.1.2.10"],
    }
    env = {
        "ELASTIC_RDZV_ENDPOINT": "demo-etcd.default.svc.cluster.local:2379",
        "POD_NAME": "demo-etcd-0",
        "TOPOLOGY_OUTPUT": "/etc/inject/env",
    }
    mounts = [
        BindMount("/tmp/pod/inject", "/etc/inject"),
        BindMount("", "/dev/shm", tmpfs_size="1"),
    ]
    new_env, argv = _loopback_rewrite(env, ["etcd", "--name=demo-etcd-0"], mounts, table)
    assert new_env == {
        "ELASTIC_RDZV_ENDPOINT": "127.1.2.10:2379",
        "POD_NAME": "demo-etcd-0",
        "TOPOLOGY_OUTPUT": "/tmp/pod/inject/env",
    }
    assert argv == ["etcd", "--name=demo-etcd-0"]
