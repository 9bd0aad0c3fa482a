"""The pod model: containers, volumes and environment resolved as the kubelet would.

Pure functions over the rendered objects (plain dicts from YAML); nothing here starts a
process. `resolve_env` follows the kubelet: explicit `env` entries in order, each value's
`$(VAR)` references expanded against the variables defined before it (`$$` escapes), and
`valueFrom` resolved from the downward API (fieldRef, resourceFieldRef) or from the
rendered ConfigMaps and Secrets.
"""

from __future__ import annotations

import base64
import logging
import math
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from decimal import Decimal
from typing import Any

log = logging.getLogger(__name__)

Obj = dict[str, Any]

#: Where the kubelet mounts a pod's service-account token, CA and namespace. A Kubernetes
#: fact, so the mini-cluster keeps its own; each image has one too (worker settings/schema.py,
#: init-topology config.py), and tests/localrun checks the three agree.
SERVICEACCOUNT_PATH = "/var/run/secrets/kubernetes.io/serviceaccount"


class PodSpecError(ValueError):
    """Something in a rendered pod the runner cannot resolve (names the field)."""


@dataclass(frozen=True)
class PodIdentity:
    """What the downward API can say about one pod incarnation."""

    name: str
    namespace: str
    uid: str
    node_name: str
    pod_ip: str
    host_ip: str
    service_account: str = "default"
    labels: Mapping[str, str] = field(default_factory=dict)
    annotations: Mapping[str, str] = field(default_factory=dict)
    node_allocatable: Mapping[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class Mount:
    volume: str
    path: str
    read_only: bool = False
    sub_path: str = ""


@dataclass(frozen=True)
class Container:
    name: str
    image: str
    command: list[str]
    args: list[str]
    env: list[Obj]
    env_from: list[Obj]
    mounts: list[Mount]
    working_dir: str
    resources: Obj

    @classmethod
    def from_obj(cls, obj: Obj) -> Container:
        mounts = [
            Mount(
                volume=m["name"],
                path=m["mountPath"],
                read_only=bool(m.get("readOnly", False)),
                sub_path=m.get("subPath", ""),
            )
            for m in obj.get("volumeMounts") or []
        ]
        return cls(
            name=obj["name"],
            image=obj.get("image", ""),
            command=[str(x) for x in obj.get("command") or []],
            args=[str(x) for x in obj.get("args") or []],
            env=list(obj.get("env") or []),
            env_from=list(obj.get("envFrom") or []),
            mounts=mounts,
            working_dir=obj.get("workingDir", ""),
            resources=dict(obj.get("resources") or {}),
        )


@dataclass(frozen=True)
class Volume:
    """One pod volume, reduced to what the runner needs to provide it."""

    name: str
    kind: str  # emptyDir, pvc, claimTemplate, configMap, secret, projected, hostPath, other
    medium: str = ""  # emptyDir medium ("Memory" for tmpfs)
    size_limit: str = ""
    claim: str = ""  # PVC claim name (pvc) or template name (claimTemplate)
    source: Obj = field(default_factory=dict)


def parse_volumes(pod_spec: Obj, claim_templates: list[Obj]) -> dict[str, Volume]:
    vols: dict[str, Volume] = {}
    for v in pod_spec.get("volumes") or []:
        name = v["name"]
        if "emptyDir" in v:
            ed = v.get("emptyDir") or {}
            vols[name] = Volume(
                name,
                "emptyDir",
                medium=ed.get("medium", ""),
                size_limit=str(ed.get("sizeLimit", "")),
            )
        elif "persistentVolumeClaim" in v:
            vols[name] = Volume(name, "pvc", claim=v["persistentVolumeClaim"]["claimName"])
        elif "configMap" in v:
            vols[name] = Volume(name, "configMap", source=v["configMap"])
        elif "secret" in v:
            vols[name] = Volume(name, "secret", source=v["secret"])
        elif "projected" in v:
            vols[name] = Volume(name, "projected", source=v["projected"])
        elif "hostPath" in v:
            vols[name] = Volume(name, "hostPath", source=v["hostPath"])
        else:
            vols[name] = Volume(name, "other", source=v)
    for t in claim_templates:
        name = t["metadata"]["name"]
        vols.setdefault(name, Volume(name, "claimTemplate", claim=name))
    return vols


_REF = re.compile(r"\$\$|\$\(([A-Za-z_][A-Za-z0-9_.-]*)\)")


def expand(value: str, env: Mapping[str, str]) -> str:
    """Kubernetes `$(VAR)` expansion: unknown references stay as written, `$$` is `$`."""

    def repl(m: re.Match[str]) -> str:
        if m.group(0) == "$$":
            return "$"
        name = m.group(1)
        return env[name] if name in env else m.group(0)

    return _REF.sub(repl, value)


_FIELD_LABEL = re.compile(r"^metadata\.(labels|annotations)\['(.+)'\]$")


def field_ref(path: str, pod: PodIdentity) -> str:
    """The value the kubelet gives a `fieldRef.fieldPath` (the supported downward API set)."""
    simple = {
        "metadata.name": pod.name,
        "metadata.namespace": pod.namespace,
        "metadata.uid": pod.uid,
        "spec.nodeName": pod.node_name,
        "spec.serviceAccountName": pod.service_account,
        "status.podIP": pod.pod_ip,
        "status.podIPs": pod.pod_ip,
        "status.hostIP": pod.host_ip,
        "status.hostIPs": pod.host_ip,
    }
    if path in simple:
        return simple[path]
    m = _FIELD_LABEL.match(path)
    if m:
        source = pod.labels if m.group(1) == "labels" else pod.annotations
        return source.get(m.group(2), "")
    raise PodSpecError(f"fieldRef {path!r} is not a downward API field the runner knows")


_QUANTITY = re.compile(r"^([+-]?[0-9.]+)([a-zA-Z]*)$")
_SUFFIX = {
    "": Decimal(1),
    "m": Decimal("0.001"),
    "k": Decimal(10**3),
    "M": Decimal(10**6),
    "G": Decimal(10**9),
    "T": Decimal(10**12),
    "Ki": Decimal(2**10),
    "Mi": Decimal(2**20),
    "Gi": Decimal(2**30),
    "Ti": Decimal(2**40),
}


def quantity(text: str) -> Decimal:
    m = _QUANTITY.match(str(text).strip())
    if not m or m.group(2) not in _SUFFIX:
        raise PodSpecError(f"resource quantity {text!r} does not parse")
    return Decimal(m.group(1)) * _SUFFIX[m.group(2)]


def resource_field_ref(
    ref: Obj, containers: Mapping[str, Container], default: str, pod: PodIdentity
) -> str:
    """`resourceFieldRef`: the container's limit (else the node's allocatable) over the divisor,
    rounded up as the kubelet does."""
    cname = ref.get("containerName") or default
    if cname not in containers:
        raise PodSpecError(f"resourceFieldRef names container {cname!r}, which the pod lacks")
    kind, _, res = ref["resource"].partition(".")
    resources = containers[cname].resources
    value = (resources.get(kind) or {}).get(res)
    if value is None and kind == "requests":
        value = (resources.get("limits") or {}).get(res)
    if value is None:
        value = pod.node_allocatable.get(res, "0")
    divisor = quantity(str(ref.get("divisor", "1")))
    return str(math.ceil(quantity(str(value)) / divisor))


def resolve_env(
    container: Container,
    pod: PodIdentity,
    containers: Mapping[str, Container],
    *,
    configmaps: Mapping[str, Mapping[str, str]],
    secrets: Mapping[str, Mapping[str, str]],
    base: Mapping[str, str] | None = None,
) -> dict[str, str]:
    """The container's environment as the kubelet builds it.

    `base` holds what the runtime provides first (PATH, HOSTNAME, KUBERNETES_SERVICE_*);
    `envFrom` sources come next, then `env` entries in order (later entries win).
    """
    env: dict[str, str] = dict(base or {})
    for src in container.env_from:
        data = _env_from_data(src, configmaps, secrets)
        prefix = src.get("prefix", "")
        for k, v in (data or {}).items():
            env[prefix + k] = v
    for entry in container.env:
        name = entry["name"]
        if "valueFrom" not in entry:
            env[name] = expand(str(entry.get("value", "")), env)
            continue
        value = _value_from(
            name,
            entry["valueFrom"],
            container=container,
            pod=pod,
            containers=containers,
            configmaps=configmaps,
            secrets=secrets,
        )
        if value is not None:
            env[name] = value
    return env


def _env_from_data(
    src: Obj,
    configmaps: Mapping[str, Mapping[str, str]],
    secrets: Mapping[str, Mapping[str, str]],
) -> Mapping[str, str] | None:
    """One `envFrom` source's data; None when it is missing and optional."""
    is_cm = "configMapRef" in src
    kind, objects = ("configMapRef", configmaps) if is_cm else ("secretRef", secrets)
    ref = src[kind]
    data = objects.get(ref["name"])
    if data is None and not ref.get("optional"):
        raise PodSpecError(f"envFrom {kind} {ref['name']!r} is not rendered")
    return data


def _value_from(
    name: str,
    vf: Obj,
    *,
    container: Container,
    pod: PodIdentity,
    containers: Mapping[str, Container],
    configmaps: Mapping[str, Mapping[str, str]],
    secrets: Mapping[str, Mapping[str, str]],
) -> str | None:
    """One `env[].valueFrom`; None when it names a missing optional key (the entry is skipped)."""
    if "fieldRef" in vf:
        return field_ref(vf["fieldRef"]["fieldPath"], pod)
    if "resourceFieldRef" in vf:
        return resource_field_ref(vf["resourceFieldRef"], containers, container.name, pod)
    if "configMapKeyRef" not in vf and "secretKeyRef" not in vf:
        raise PodSpecError(f"env {name}: valueFrom {sorted(vf)} is not supported")
    is_cm = "configMapKeyRef" in vf
    ref = vf["configMapKeyRef" if is_cm else "secretKeyRef"]
    data = (configmaps if is_cm else secrets).get(ref["name"])
    if data is None or ref["key"] not in data:
        if ref.get("optional"):
            return None
        what = "ConfigMap" if is_cm else "Secret"
        raise PodSpecError(f"env {name}: {what} {ref['name']!r} key {ref['key']!r} is not rendered")
    return data[ref["key"]]


def command_line(container: Container, env: Mapping[str, str]) -> list[str]:
    """command + args with `$(VAR)` expanded against the container's environment."""
    argv = [expand(a, env) for a in container.command + container.args]
    if not argv:
        raise PodSpecError(
            f"container {container.name!r} has no command: the runner has no image entrypoint"
        )
    return argv


def configmap_data(obj: Obj) -> dict[str, str]:
    data = {k: str(v) for k, v in (obj.get("data") or {}).items()}
    for k, v in (obj.get("binaryData") or {}).items():
        data[k] = base64.b64decode(v).decode(errors="replace")
    return data


def secret_data(obj: Obj) -> dict[str, str]:
    data = {
        k: base64.b64decode(v).decode(errors="replace") for k, v in (obj.get("data") or {}).items()
    }
    data.update({k: str(v) for k, v in (obj.get("stringData") or {}).items()})
    return data


def wants_serviceaccount(pod_spec: Obj, service_accounts: Mapping[str, Obj]) -> bool:
    """Whether the kubelet would mount the service-account token (pod setting wins)."""
    if "automountServiceAccountToken" in pod_spec:
        return bool(pod_spec["automountServiceAccountToken"])
    sa = service_accounts.get(pod_spec.get("serviceAccountName") or "default") or {}
    return bool(sa.get("automountServiceAccountToken", True))


def grace_period(pod_spec: Obj) -> float:
    return float(pod_spec.get("terminationGracePeriodSeconds", 30))
