"""The host's container runtime without namespaces (no root, or --loopback)."""

from __future__ import annotations

from localrun.cluster.runtime import BindMount
from localrun.host.runtime import loopback_rewrite


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
    new_env, argv = loopback_rewrite(env, ["etcd", "--name=demo-etcd-0"], mounts, table)
    assert new_env == {
        "ELASTIC_RDZV_ENDPOINT": "127.1.2.10:2379",
        "POD_NAME": "demo-etcd-0",
        "TOPOLOGY_OUTPUT": "/tmp/pod/inject/env",
    }
    assert argv == ["etcd", "--name=demo-etcd-0"]
