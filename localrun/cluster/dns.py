"""Cluster DNS: the names kube-dns would serve for the pods and Services, as a table.

The host layer (localrun/host/dnsfiles.py) writes the table into each pod's /etc/hosts."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass


@dataclass(frozen=True)
class ServiceRecord:
    """A Service as DNS sees it: its name and the pods behind it."""

    name: str
    namespace: str
    headless: bool
    pods: tuple[str, ...]  # pod names selected (running), in ordinal order


@dataclass(frozen=True)
class PodRecord:
    name: str
    namespace: str
    ip: str
    subdomain: str  # spec.subdomain / StatefulSet serviceName ("" for none)


def service_names(svc: str, ns: str, domain: str) -> list[str]:
    """FQDN first, then the shorter forms a pod in the same namespace can use."""
    return [f"{svc}.{ns}.svc.{domain}", f"{svc}.{ns}.svc", f"{svc}.{ns}", svc]


def pod_names(pod: PodRecord, domain: str) -> list[str]:
    if not pod.subdomain:
        return []
    base = f"{pod.name}.{pod.subdomain}"
    return [
        f"{base}.{pod.namespace}.svc.{domain}",
        f"{base}.{pod.namespace}.svc",
        f"{base}.{pod.namespace}",
        base,
    ]


def dns_table(
    pods: Iterable[PodRecord], services: Iterable[ServiceRecord], domain: str
) -> dict[str, list[str]]:
    """name -> addresses, for every pod DNS name and Service name the cluster DNS serves.

    A normal Service resolves to one address (its first selected pod stands in for the
    ClusterIP); a headless one to every selected pod."""
    by_name = {p.name: p for p in pods}
    table: dict[str, list[str]] = {}
    for p in by_name.values():
        for n in pod_names(p, domain):
            table[n] = [p.ip]
    for s in services:
        ips = [by_name[n].ip for n in s.pods if n in by_name]
        if not ips:
            continue
        for n in service_names(s.name, s.namespace, domain):
            table[n] = ips if s.headless else ips[:1]
    return table
