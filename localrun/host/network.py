"""Pod networking: one network namespace per pod, `eth0` by veth to a host bridge.

Addresses come from 198.18.0.0/15 (the benchmarking range, RFC 2544) only: each run takes
one free /24 of it, the bridge holds `.1` (the fake API server listens there) and pods get
`.10` upwards, one address per pod name (kept when the pod is recreated, so a Service's
name keeps pointing at its pod without a kube-proxy), unless the pod's previous
incarnation still holds it: a pod force-deleted on a node that is down keeps running
there, in its own sandbox, while its new incarnation runs on another node with another
address, as in a cluster. Sandboxes are known by (pod, incarnation). Every pod has its own
/etc/netns/<ns>/hosts (bind-mounted over /etc/hosts by `ip netns exec`) with the
Services' and pods' DNS names, and a resolv.conf whose nameserver refuses at once, so a
name that is not in the hosts file fails fast, as NXDOMAIN would.

Without root there are no namespaces: pods share the host network on 127.x addresses and
runtime.py substitutes DNS names in environment values (LoopbackNetwork).
"""

from __future__ import annotations

import contextlib
import fcntl
import ipaddress
import logging
import os
import re
import shutil
import signal
import subprocess
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path

from localrun.cluster.dns import PodRecord
from localrun.host.dnsfiles import hosts_file, resolv_conf

log = logging.getLogger(__name__)

RANGE = ipaddress.IPv4Network("198.18.0.0/15")
STATE_DIR = Path("/run/elastic-local")
NETNS_ETC = Path("/etc/netns")


def run_ip(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run(["ip", *args], capture_output=True, text=True, check=False)
    if check and proc.returncode != 0:
        raise NetworkError(f"ip {' '.join(args)}: {proc.stderr.strip()}")
    return proc


class NetworkError(RuntimeError):
    pass


@contextlib.contextmanager
def _state_lock() -> Iterator[None]:
    STATE_DIR.mkdir(parents=True, exist_ok=True)
    with open(STATE_DIR / "lock", "w") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


def used_ipv4_networks() -> list[ipaddress.IPv4Network]:
    out = run_ip("-o", "-4", "addr", "show").stdout
    nets: list[ipaddress.IPv4Network] = []
    for line in out.splitlines():
        parts = line.split()
        if "inet" in parts:
            nets.append(ipaddress.IPv4Interface(parts[parts.index("inet") + 1]).network)
    return nets


def pick_subnet(used: Iterable[ipaddress.IPv4Network], seed: int) -> ipaddress.IPv4Network:
    """A /24 of 198.18.0.0/15 that overlaps none in use, starting at a seed (the pid)."""
    subnets: list[ipaddress.IPv4Network] = list(RANGE.subnets(new_prefix=24))
    taken = list(used)
    for i in range(len(subnets)):
        cand = subnets[(seed + i) % len(subnets)]
        if not any(cand.overlaps(u) for u in taken):
            return cand
    raise NetworkError("no free /24 left in 198.18.0.0/15")


_OWNED = re.compile(r"^(?:el-)?e(\d+)(?:br|v\d+|-.*)$")


def _owner_gone(name: str) -> bool:
    """A name this tool gives (`el-e<pid>-...`, `e<pid>br`, `e<pid>v<n>`) whose run is dead."""
    m = _OWNED.match(name)
    if not m:
        return False
    try:
        os.kill(int(m.group(1)), 0)
    except ProcessLookupError:
        return True
    except PermissionError:
        return False
    return False


def remove_stale() -> None:
    """Remove what runs that were SIGKILLed left behind: their namespaces (and processes in
    them), links and /etc/netns entries. Only names of this tool whose run is gone."""
    for line in run_ip("netns", "list", check=False).stdout.splitlines():
        ns = line.split()[0] if line.split() else ""
        if not ns.startswith("el-e") or not _owner_gone(ns):
            continue
        pids = run_ip("netns", "pids", ns, check=False).stdout.split()
        for pid in pids:
            with contextlib.suppress(ProcessLookupError, ValueError):
                os.kill(int(pid), signal.SIGKILL)
        run_ip("netns", "del", ns, check=False)
        shutil.rmtree(NETNS_ETC / ns, ignore_errors=True)
        log.warning("removed network namespace %s left by a run that was killed", ns)
    for line in run_ip("-o", "link", "show", check=False).stdout.splitlines():
        parts = line.split(":")
        if len(parts) < 2:
            continue
        name = parts[1].strip().split("@")[0]
        if _owner_gone(name):
            run_ip("link", "del", name, check=False)
    if NETNS_ETC.is_dir():
        for d in NETNS_ETC.iterdir():
            if d.name.startswith("el-e") and _owner_gone(d.name):
                shutil.rmtree(d, ignore_errors=True)


def bridge_mac(subnet: ipaddress.IPv4Network) -> str:
    """A locally administered unicast address for the run's bridge, from its subnet."""
    return "02:00:" + ":".join(f"{b:02x}" for b in subnet.network_address.packed)


@dataclass
class PodNet:
    name: str  # pod name
    incarnation: int
    netns: str  # "" without namespaces
    ip: str
    host_veth: str = ""
    up: bool = True


class Network:
    """The bridge, the per-pod namespaces and their hosts files (needs root)."""

    isolated = True

    def __init__(self, prefix: str, domain: str) -> None:
        self.prefix = prefix  # short and unique per run, e.g. "e12345"
        self.domain = domain
        self.bridge = f"{prefix}br"
        self.subnet: ipaddress.IPv4Network | None = None
        self.host_ip = ""
        #: The sandboxes, by (pod name, incarnation).
        self.pods: dict[tuple[str, int], PodNet] = {}
        self._ips: dict[str, str] = {}  # pod name -> address, stable over recreation
        self._next_host = 10
        self._veths = 0
        self._made_bridge = False

    def describe(self) -> str:
        return f"network namespaces on bridge {self.bridge} {self.subnet} (host {self.host_ip})"

    def setup(self) -> None:
        with _state_lock():
            remove_stale()
            self.subnet = pick_subnet(used_ipv4_networks(), os.getpid())
            self.host_ip = str(self.subnet.network_address + 1)
            # A bridge without an address of its own takes the lowest of its ports' and
            # changes it when that port goes: the pods' ARP entries for the host then point
            # nowhere, and the API server is unreachable for up to a minute after a pod is
            # deleted (seen: workers stopped at the job's end timed out reading the scale).
            run_ip("link", "add", self.bridge, "address", bridge_mac(self.subnet), "type", "bridge")
            self._made_bridge = True
            run_ip("addr", "add", f"{self.host_ip}/24", "dev", self.bridge)
            run_ip("link", "set", self.bridge, "up")
        log.info("bridge %s %s", self.bridge, self.subnet)

    def sandbox(self, pod: str, incarnation: int | None = None) -> PodNet | None:
        """The pod's sandbox of that incarnation; None: its newest."""
        if incarnation is not None:
            return self.pods.get((pod, incarnation))
        mine = [pn for (name, _), pn in self.pods.items() if name == pod]
        return max(mine, key=lambda pn: pn.incarnation) if mine else None

    def address(self, pod: str) -> str:
        """The pod name's address; a new one when a sandbox of that name still holds it."""
        held = {pn.ip for (name, _), pn in self.pods.items() if name == pod}
        if pod not in self._ips or self._ips[pod] in held:
            assert self.subnet is not None
            if self._next_host > 254:
                raise NetworkError(f"no address left in {self.subnet}")
            self._ips[pod] = str(self.subnet.network_address + self._next_host)
            self._next_host += 1
        return self._ips[pod]

    def add_pod(self, pod: str, incarnation: int) -> PodNet:
        """A fresh namespace (the pod sandbox) with eth0 on the bridge and lo up."""
        ip = self.address(pod)
        self._veths += 1
        netns = f"el-{self.prefix}-{pod}-{incarnation}"
        veth = f"{self.prefix}v{self._veths}"
        run_ip("netns", "add", netns)
        pn = PodNet(pod, incarnation, netns, ip, veth)
        self.pods[(pod, incarnation)] = pn
        run_ip("link", "add", veth, "type", "veth", "peer", "name", "eth0", "netns", netns)
        run_ip("link", "set", veth, "master", self.bridge, "up")
        run_ip("-n", netns, "addr", "add", f"{ip}/24", "dev", "eth0")
        run_ip("-n", netns, "link", "set", "lo", "up")
        run_ip("-n", netns, "link", "set", "eth0", "up")
        run_ip("-n", netns, "route", "add", "default", "via", self.host_ip)
        etc = NETNS_ETC / netns
        etc.mkdir(parents=True, exist_ok=True)
        # The address may have belonged to the pod's previous incarnation: drop what the
        # neighbours cached for it (its old MAC), else they talk to nobody until it expires.
        run_ip("neigh", "flush", "to", ip, "dev", self.bridge, check=False)
        for other in self.pods.values():
            if other is not pn and other.netns:
                run_ip("-n", other.netns, "neigh", "flush", "to", ip, check=False)
        return pn

    def write_hosts(self, own: PodRecord, table: Mapping[str, list[str]], namespace: str) -> None:
        pn = next((p for (n, _), p in self.pods.items() if n == own.name and p.ip == own.ip), None)
        if pn is None or not pn.netns:
            return
        etc = NETNS_ETC / pn.netns
        # Rewritten in place: `ip netns exec` bind-mounts the file, so a new inode would
        # not be seen by the processes already running.
        for fname, text in (
            ("hosts", hosts_file(own, table, self.domain)),
            ("resolv.conf", resolv_conf(namespace, self.domain)),
        ):
            with open(etc / fname, "a+") as fh:
                fh.seek(0)
                if fh.read() == text:
                    continue
                fh.seek(0)
                fh.truncate()
                fh.write(text)

    def set_link(self, pod: str, up: bool, incarnation: int | None = None) -> None:
        """The sandbox's link up or down (None: the pod's newest sandbox)."""
        pn = self.sandbox(pod, incarnation)
        if pn is None:
            return
        run_ip("link", "set", pn.host_veth, "up" if up else "down", check=False)
        pn.up = up

    def remove_pod(self, pod: str, incarnation: int) -> None:
        pn = self.pods.pop((pod, incarnation), None)
        if pn is None:
            return
        run_ip("link", "del", pn.host_veth, check=False)
        run_ip("netns", "del", pn.netns, check=False)
        shutil.rmtree(NETNS_ETC / pn.netns, ignore_errors=True)

    def exec_prefix(self, pod: str, incarnation: int) -> list[str]:
        return ["ip", "netns", "exec", self.pods[(pod, incarnation)].netns]

    def teardown(self) -> None:
        for pod, incarnation in list(self.pods):
            self.remove_pod(pod, incarnation)
        if self._made_bridge:
            run_ip("link", "del", self.bridge, check=False)
            self._made_bridge = False
        with contextlib.suppress(OSError):
            NETNS_ETC.rmdir()  # only when empty: other runs may use it


class LoopbackNetwork(Network):
    """No root: pods share the host's network on 127.<a>.<b>.x addresses; no hosts files,
    no partitions (said once in the log)."""

    isolated = False

    def describe(self) -> str:
        return (
            "no namespaces (not root, or --loopback): pods share the host network on "
            f"{self.subnet}; cluster DNS names and mount paths are substituted in env and args"
        )

    def setup(self) -> None:
        pid = os.getpid()
        subnet = ipaddress.IPv4Network(f"127.{100 + (pid >> 8) % 100}.{pid % 256}.0/24")
        self.subnet = subnet
        self.host_ip = str(subnet.network_address + 1)

    def add_pod(self, pod: str, incarnation: int) -> PodNet:
        pn = PodNet(pod, incarnation, "", self.address(pod))
        self.pods[(pod, incarnation)] = pn
        return pn

    def write_hosts(self, own: PodRecord, table: Mapping[str, list[str]], namespace: str) -> None:
        return

    def set_link(self, pod: str, up: bool, incarnation: int | None = None) -> None:
        log.warning("link of %s left up: no network namespaces without root", pod)

    def remove_pod(self, pod: str, incarnation: int) -> None:
        self.pods.pop((pod, incarnation), None)

    def exec_prefix(self, pod: str, incarnation: int) -> list[str]:
        return []

    def teardown(self) -> None:
        self.pods.clear()
