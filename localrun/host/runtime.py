"""The container runtime of this machine (cluster/runtime.py's protocol): a pod sandbox is
a network namespace (network.py), a container a process in mount, PID and UTS namespaces
of its own (process.py), its volumes bind-mounted onto mountpoints kept on the host
(mountpoints.py). Without namespaces (no root, or --loopback) pods share the host network
and cluster names and mount paths are substituted in env and args instead."""

from __future__ import annotations

from collections.abc import Mapping

from localrun.cluster.dns import PodRecord
from localrun.cluster.runtime import BindMount, ContainerSpec, LineSink
from localrun.host.mountpoints import Mountpoints
from localrun.host.network import Network
from localrun.host.process import ContainerProcess, container_argv


class HostRuntime:
    def __init__(self, network: Network, mountpoints: Mountpoints) -> None:
        self.network = network
        self.mountpoints = mountpoints
        self._table: dict[str, list[str]] = {}

    @property
    def isolated(self) -> bool:
        return self.network.isolated

    @property
    def host_ip(self) -> str:
        return self.network.host_ip

    def run_sandbox(self, pod: str, incarnation: int) -> str:
        return self.network.add_pod(pod, incarnation).ip

    def remove_sandbox(self, pod: str, incarnation: int) -> None:
        self.network.remove_pod(pod, incarnation)

    def set_link(self, pod: str, incarnation: int, up: bool) -> None:
        self.network.set_link(pod, up, incarnation)

    def publish_dns(self, pods: list[PodRecord], table: Mapping[str, list[str]]) -> None:
        self._table = dict(table)
        for rec in pods:
            self.network.write_hosts(rec, table, rec.namespace)

    def start(self, spec: ContainerSpec, on_line: LineSink) -> ContainerProcess:
        env, argv = spec.env, spec.argv
        if self.network.isolated:
            for m in spec.mounts:
                self.mountpoints.ensure(m.target)
        else:
            env, argv = loopback_rewrite(env, argv, spec.mounts, self._table)
        full = container_argv(
            self.network.exec_prefix(spec.pod, spec.incarnation),
            spec.mounts,
            spec.pod,
            spec.working_dir,
            argv,
        )
        return ContainerProcess(
            spec.pod,
            spec.container,
            full,
            env=env,
            log_path=spec.log_path,
            on_line=on_line,
            namespaced=self.network.isolated,
        )


def loopback_rewrite(
    env: dict[str, str], argv: list[str], mounts: list[BindMount], table: Mapping[str, list[str]]
) -> tuple[dict[str, str], list[str]]:
    """Without namespaces: DNS names in values become addresses, mount paths host paths.
    Only the forms with `.svc` are replaced: a bare pod or Service name is also part of
    other values (etcd's --name, the pod name itself)."""
    names = [(n, ips[0]) for n, ips in table.items() if ips and ".svc" in n]
    subs = sorted(names, key=lambda kv: -len(kv[0]))
    # The longest mount path first: /opt/elastic-worker-bundle before /opt/elastic-worker.
    subs += sorted(((m.target, m.source) for m in mounts if m.source), key=lambda kv: -len(kv[0]))

    def fix(v: str) -> str:
        for a, b in subs:
            v = v.replace(a, b)
        return v

    return {k: fix(v) for k, v in env.items()}, [fix(a) for a in argv]
