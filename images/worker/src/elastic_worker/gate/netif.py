"""Choose the network interface NCCL and gloo use (NCCL_SOCKET_IFNAME, GLOO_SOCKET_IFNAME).

Order: an up interface matching the mesh globs (ELASTIC_MESH_INTERFACES, `wg*` by
default); else the interface that routes to the rendezvous endpoint's address (asked of
the kernel by connecting a UDP socket, which sends nothing, and mapping the source
address back to its interface); never `lo` or `docker0`. NCCL prefix-matches names
(`eth0` also matches `eth0.100`), so it gets `=eth0`; gloo takes a plain name.
Only the standard library is used: SIOCGIFADDR for IPv4, /proc/net/if_inet6 for IPv6.
"""

from __future__ import annotations

import fcntl
import fnmatch
import ipaddress
import logging
import socket
import struct
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from elastic_worker.settings.config import Config

logger = logging.getLogger(__name__)

EXCLUDED = frozenset({"lo", "docker0"})
_SIOCGIFADDR = 0x8915
_IFF_UP = 0x1


@dataclass(frozen=True)
class Interface:
    name: str
    up: bool
    addresses: tuple[str, ...]


@dataclass(frozen=True)
class Choice:
    name: str
    address: str
    reason: str

    @property
    def nccl(self) -> str:
        return f"={self.name}"

    @property
    def gloo(self) -> str:
        return self.name


def _ipv4(name: str) -> list[str]:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        try:
            packed = fcntl.ioctl(
                sock.fileno(), _SIOCGIFADDR, struct.pack("256s", name.encode()[:15])
            )
        except OSError:
            return []
    return [socket.inet_ntoa(packed[20:24])]


def _ipv6(proc: Path = Path("/proc/net/if_inet6")) -> dict[str, list[str]]:
    found: dict[str, list[str]] = {}
    try:
        lines = proc.read_text().splitlines()
    except OSError:
        return found
    for line in lines:
        fields = line.split()
        if len(fields) == 6:
            addr = str(ipaddress.IPv6Address(bytes.fromhex(fields[0])))
            found.setdefault(fields[5], []).append(addr)
    return found


def _is_up(name: str) -> bool:
    try:
        flags = int(Path(f"/sys/class/net/{name}/flags").read_text().strip(), 16)
    except (OSError, ValueError):
        return False
    return bool(flags & _IFF_UP)


def interfaces() -> list[Interface]:
    """Every interface in this network namespace, sorted by name."""
    v6 = _ipv6()
    result = []
    for _, name in sorted(socket.if_nameindex(), key=lambda item: item[1]):
        addrs = tuple(_ipv4(name) + v6.get(name, []))
        result.append(Interface(name=name, up=_is_up(name), addresses=addrs))
    return result


def source_address(ip: str, port: int) -> str | None:
    """The local address the kernel would use to reach ip:port (no packet is sent)."""
    family = socket.AF_INET6 if ":" in ip else socket.AF_INET
    with socket.socket(family, socket.SOCK_DGRAM) as sock:
        try:
            sock.connect((ip, port))
        except OSError:
            return None
        return str(sock.getsockname()[0])


def mesh_interface(ifaces: Sequence[Interface], globs: Sequence[str]) -> Interface | None:
    """The first up interface matching the globs (in glob order, then by name)."""
    for glob in globs:
        for iface in ifaces:
            if iface.up and iface.name not in EXCLUDED and fnmatch.fnmatchcase(iface.name, glob):
                return iface
    return None


def choose(
    globs: Sequence[str],
    endpoint_ip: str | None,
    endpoint_port: int,
    ifaces: Sequence[Interface] | None = None,
) -> tuple[Choice | None, str]:
    """The interface to use, or None, and the reason (one sentence) either way."""
    ifaces = interfaces() if ifaces is None else ifaces
    mesh = mesh_interface(ifaces, globs)
    if mesh is not None:
        addr = mesh.addresses[0] if mesh.addresses else ""
        reason = f"mesh interface {mesh.name} is up (matches {','.join(globs)})"
        return Choice(mesh.name, addr, reason), reason
    if not endpoint_ip:
        return None, "no mesh interface is up and the rendezvous endpoint did not resolve"
    source = source_address(endpoint_ip, endpoint_port)
    if source is None:
        return None, f"no mesh interface is up and there is no route to {endpoint_ip}"
    for iface in ifaces:
        if source in iface.addresses:
            if iface.name in EXCLUDED:
                return None, (
                    f"no mesh interface is up and the route to {endpoint_ip} goes through "
                    f"{iface.name}, which is never chosen"
                )
            reason = f"no mesh interface is up; {iface.name} ({source}) routes to {endpoint_ip}"
            return Choice(iface.name, source, reason), reason
    return None, f"no interface holds {source}, the source address for {endpoint_ip}"


def local_address(config: Config, choice: Choice | None, mesh: bool) -> str | None:
    """What the other nodes use to reach this one (rank 0's store, MASTER_ADDR).

    ELASTIC_LOCAL_ADDR, else the mesh interface's address when the mesh was chosen,
    else POD_IP, else the chosen interface's address; None lets torchrun use the FQDN.
    """
    if config.local_addr:
        return config.local_addr
    if mesh and choice is not None and choice.address:
        return choice.address
    if config.pod_ip:
        return config.pod_ip
    return choice.address if choice is not None and choice.address else None
