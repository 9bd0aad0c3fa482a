"""DNS names and hosts files of the pods, the choice of a free subnet, and the host's
address staying reachable while pods come and go."""

from __future__ import annotations

import ipaddress
import os
import shutil
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from localrun.cluster.dns import PodRecord, ServiceRecord, dns_table
from localrun.host.dnsfiles import hosts_file, resolv_conf
from localrun.host.network import RANGE, Network, pick_subnet

D = "cluster.local"
W0 = PodRecord("demo-w-0", "default", "198.18.5.11", "demo-workers")
W1 = PodRecord("demo-w-1", "default", "198.18.5.12", "demo-workers")
ETCD = PodRecord("demo-etcd-0", "default", "198.18.5.10", "demo-etcd-headless")
SERVICES = [
    ServiceRecord("demo-workers", "default", True, ("demo-w-0", "demo-w-1")),
    ServiceRecord("demo-etcd", "default", False, ("demo-etcd-0",)),
    ServiceRecord("demo-etcd-headless", "default", True, ("demo-etcd-0",)),
    ServiceRecord("demo-nothing", "default", False, ()),
]


def test_table_has_pod_and_service_names_in_every_form() -> None:
    t = dns_table([W0, W1, ETCD], SERVICES, D)
    assert t["demo-w-1.demo-workers.default.svc.cluster.local"] == ["198.18.5.12"]
    assert t["demo-w-1.demo-workers"] == ["198.18.5.12"]
    assert t["demo-etcd.default.svc.cluster.local"] == ["198.18.5.10"]
    assert t["demo-etcd.default.svc"] == ["198.18.5.10"]
    assert t["demo-etcd.default"] == ["198.18.5.10"]
    assert t["demo-etcd"] == ["198.18.5.10"]
    assert t["demo-workers.default.svc.cluster.local"] == ["198.18.5.11", "198.18.5.12"]
    assert not any(n.startswith("demo-nothing") for n in t)
    assert "demo-w-0" not in t  # a peer's bare hostname is not a cluster DNS name


def test_hosts_file_lists_own_name_first_and_every_peer() -> None:
    t = dns_table([W0, W1, ETCD], SERVICES, D)
    text = hosts_file(W0, t, D)
    lines = text.splitlines()
    assert "127.0.0.1\tlocalhost" in lines
    own = next(ln for ln in lines if ln.startswith("198.18.5.11\t"))
    assert own.split("\t")[1].split()[0] == "demo-w-0.demo-workers.default.svc.cluster.local"
    assert "demo-w-0" in own.split()[1:]
    peer = next(ln for ln in lines if ln.startswith("198.18.5.12\t"))
    assert "demo-w-1.demo-workers.default.svc.cluster.local" in peer.split()
    etcd = next(ln for ln in lines if ln.startswith("198.18.5.10\t"))
    assert "demo-etcd.default.svc.cluster.local" in etcd.split()
    # every address appears on one line only, so lookups are unambiguous
    addrs = [ln.split("\t")[0] for ln in lines if not ln.startswith("#")]
    assert len(addrs) == len(set(addrs))


def test_resolv_conf_searches_the_namespace_and_fails_fast() -> None:
    text = resolv_conf("team-a", D)
    assert "search team-a.svc.cluster.local svc.cluster.local cluster.local" in text
    assert "nameserver 127.0.0.1" in text


def test_pick_subnet_stays_in_the_benchmark_range_and_avoids_used_ones() -> None:
    first = pick_subnet([], 0)
    assert first == ipaddress.ip_network("198.18.0.0/24")
    used = [ipaddress.IPv4Network("198.18.0.0/16"), ipaddress.IPv4Network("198.19.0.0/24")]
    got = pick_subnet(used, 0)
    assert got.subnet_of(RANGE)
    assert not any(got.overlaps(u) for u in used)
    assert got == ipaddress.ip_network("198.19.1.0/24")


def _connects(net: Network, pod: tuple[str, int], host: str, port: int) -> bool:
    code = f"import socket; socket.create_connection(({host!r}, {port}), timeout=2).close()"
    proc = subprocess.run(
        [*net.exec_prefix(*pod), sys.executable, "-c", code],
        check=False,
        capture_output=True,
        timeout=30,
    )
    return proc.returncode == 0


@pytest.mark.skipif(
    os.geteuid() != 0 or shutil.which("ip") is None, reason="network namespaces need root and ip"
)
def test_the_host_stays_reachable_when_the_pod_whose_port_gave_the_bridge_its_address_goes() -> (
    None
):
    # The API server listens on the bridge's address. A bridge that takes its address from
    # its lowest port changes it when that pod is deleted, and the other pods' cached ARP
    # entries then reach nobody: the workers stopped at a job's end could not read the scale.
    net = Network(f"e{os.getpid()}", "cluster.local")
    net.setup()
    listener = socket.create_server((net.host_ip, 0))
    try:
        port = listener.getsockname()[1]
        for pod in ("a", "b", "c"):
            net.add_pod(pod, 0)
        mac = {
            p: Path(f"/sys/class/net/{n.host_veth}/address").read_text()
            for p, n in net.pods.items()
        }
        keeper = max(mac, key=mac.__getitem__)  # the others include the lowest address
        assert _connects(net, keeper, net.host_ip, port)  # its ARP cache now holds the host
        for pod in [p for p in mac if p != keeper]:
            net.remove_pod(*pod)
        assert _connects(net, keeper, net.host_ip, port), (
            "the host is unreachable from the pod left"
        )
    finally:
        listener.close()
        net.teardown()


@pytest.mark.skipif(
    os.geteuid() != 0 or shutil.which("ip") is None, reason="network namespaces need root and ip"
)
def test_a_pod_made_again_while_its_old_sandbox_still_runs_gets_an_address_of_its_own() -> None:
    # A pod force-deleted on a node that is down still runs there; its new incarnation on
    # another node has another address, and each keeps its own link.
    net = Network(f"e{os.getpid()}", "cluster.local")
    net.setup()
    try:
        old = net.add_pod("w-0", 1)
        new = net.add_pod("w-0", 2)
        assert old.ip != new.ip and old.netns != new.netns
        assert net.sandbox("w-0") is new and net.sandbox("w-0", 1) is old
        net.set_link("w-0", False, 1)
        assert not old.up and new.up
        net.remove_pod("w-0", 1)
        net.remove_pod("w-0", 2)
        third = net.add_pod("w-0", 3)  # nothing holds the name's address now: kept
        assert third.ip == new.ip
        net.remove_pod("w-0", 3)
    finally:
        net.teardown()
