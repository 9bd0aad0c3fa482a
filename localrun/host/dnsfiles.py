"""A pod's /etc/hosts and /etc/resolv.conf, written from the cluster DNS table: every name
is in the hosts file, and the nameserver refuses at once, so a name that is not there
fails fast, as NXDOMAIN would."""

from __future__ import annotations

from collections.abc import Mapping

from localrun.cluster.dns import PodRecord, pod_names


def hosts_file(own: PodRecord, table: Mapping[str, list[str]], domain: str) -> str:
    """/etc/hosts for one pod: localhost, the pod's own names (as the kubelet writes them),
    then one line per address with every name that resolves to it."""
    lines = [
        "# written by elastic-local (localrun/host/dnsfiles.py)",
        "127.0.0.1\tlocalhost",
        "::1\tlocalhost ip6-localhost ip6-loopback",
    ]
    own_names = [*pod_names(own, domain), own.name]
    by_ip: dict[str, list[str]] = {own.ip: own_names}
    for name, ips in sorted(table.items()):
        if name in own_names:
            continue
        for ip in ips:
            by_ip.setdefault(ip, []).append(name)
    for ip, names in by_ip.items():
        lines.append(f"{ip}\t{' '.join(names)}")
    return "\n".join(lines) + "\n"


def resolv_conf(namespace: str, domain: str) -> str:
    return (
        "# written by elastic-local: names come from /etc/hosts; this nameserver refuses\n"
        "nameserver 127.0.0.1\n"
        f"search {namespace}.svc.{domain} svc.{domain} {domain}\n"
        "options ndots:5 timeout:1 attempts:1\n"
    )
