"""The Pod Security Standards (kubernetes.io/docs/concepts/security/pod-security-standards,
policy version "latest" of Kubernetes 1.29-1.35) as data, evaluated over rendered pod
templates, so a test can ask "at which level would Pod Security Admission admit this?".

The rule data follows pod-security-admission's checks
(staging/src/k8s.io/pod-security-admission/policy/check_*.go). Every baseline and
restricted control is covered; Windows-only fields other than hostProcess are left out
(the charts run Linux pods).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Iterator, Mapping
from typing import Any

# Strictest first: the level of a pod is the first one whose rules it passes.
LEVELS = ("restricted", "baseline", "privileged")

# check_capabilities_baseline.go, capabilities_allowed_1_0: the runtime's default set.
BASELINE_CAPABILITIES = frozenset(
    {
        "AUDIT_WRITE",
        "CHOWN",
        "DAC_OVERRIDE",
        "FOWNER",
        "FSETID",
        "KILL",
        "MKNOD",
        "NET_BIND_SERVICE",
        "SETFCAP",
        "SETGID",
        "SETPCAP",
        "SETUID",
        "SYS_CHROOT",
    }
)
# check_capabilities_restricted.go: drop ALL, add at most this.
RESTRICTED_CAPABILITIES = frozenset({"NET_BIND_SERVICE"})
# check_restrictedVolumes.go.
RESTRICTED_VOLUME_TYPES = frozenset(
    {
        "configMap",
        "csi",
        "downwardAPI",
        "emptyDir",
        "ephemeral",
        "persistentVolumeClaim",
        "projected",
        "secret",
    }
)
# check_sysctls.go (1.29's list, the newest).
SAFE_SYSCTLS = frozenset(
    {
        "kernel.shm_rmid_forced",
        "net.ipv4.ip_local_port_range",
        "net.ipv4.ip_unprivileged_port_start",
        "net.ipv4.tcp_syncookies",
        "net.ipv4.ping_group_range",
        "net.ipv4.ip_local_reserved_ports",
        "net.ipv4.tcp_keepalive_time",
        "net.ipv4.tcp_fin_timeout",
        "net.ipv4.tcp_keepalive_intvl",
        "net.ipv4.tcp_keepalive_probes",
    }
)
# check_seLinuxOptions.go: allowed types (unset is allowed too); user and role must be unset.
SELINUX_TYPES = frozenset(
    {"container_t", "container_init_t", "container_kvm_t", "container_engine_t"}
)
SECCOMP_ALLOWED = frozenset({"RuntimeDefault", "Localhost"})
# check_appArmorProfile.go: the field's types (unset is allowed too).
APPARMOR_ALLOWED = frozenset({"RuntimeDefault", "Localhost"})
APPARMOR_ANNOTATION = "container.apparmor.security.beta.kubernetes.io/"

_CLAIM = re.compile(r"^# Pod Security: (\S+)\s*$", re.MULTILINE)


def _containers(spec: Mapping[str, Any]) -> Iterator[Mapping[str, Any]]:
    for key in ("initContainers", "containers", "ephemeralContainers"):
        yield from spec.get(key) or []


def _ctx(obj: Mapping[str, Any]) -> Mapping[str, Any]:
    return obj.get("securityContext") or {}


def baseline_violations(spec: Mapping[str, Any], annotations: Mapping[str, str]) -> list[str]:
    """What keeps a pod spec out of "baseline" (each item names the field)."""
    out: list[str] = []
    pod = _ctx(spec)
    for field in ("hostNetwork", "hostPID", "hostIPC"):
        if spec.get(field):
            out.append(f"{field}: true")
    out += [f"volume {v['name']}: hostPath" for v in spec.get("volumes") or [] if "hostPath" in v]
    out += [
        f"sysctl {s['name']} is not a safe sysctl"
        for s in pod.get("sysctls") or []
        if s["name"] not in SAFE_SYSCTLS
    ]
    for key, value in annotations.items():
        if key.startswith(APPARMOR_ANNOTATION) and not (
            value == "runtime/default" or value.startswith("localhost/")
        ):
            out.append(f"annotation {key}: {value}")
    scopes: list[tuple[str, Mapping[str, Any]]] = [("pod", pod)]
    scopes += [(f"container {c['name']}", _ctx(c)) for c in _containers(spec)]
    for where, ctx in scopes:
        if (ctx.get("windowsOptions") or {}).get("hostProcess"):
            out.append(f"{where}: windowsOptions.hostProcess")
        if (ctx.get("seccompProfile") or {}).get("type") == "Unconfined":
            out.append(f"{where}: seccompProfile Unconfined")
        apparmor = (ctx.get("appArmorProfile") or {}).get("type")
        if apparmor is not None and apparmor not in APPARMOR_ALLOWED:
            out.append(f"{where}: appArmorProfile {apparmor}")
        selinux = ctx.get("seLinuxOptions") or {}
        if selinux.get("type", "") not in {"", *SELINUX_TYPES}:
            out.append(f"{where}: seLinuxOptions.type {selinux['type']}")
        out += [f"{where}: seLinuxOptions.{k} set" for k in ("user", "role") if selinux.get(k)]
    for ctr in _containers(spec):
        name, ctx = ctr["name"], _ctx(ctr)
        if ctx.get("privileged"):
            out.append(f"container {name}: privileged")
        if ctx.get("procMount", "Default") != "Default":
            out.append(f"container {name}: procMount {ctx['procMount']}")
        extra = sorted(
            set((ctx.get("capabilities") or {}).get("add") or []) - BASELINE_CAPABILITIES
        )
        if extra:
            out.append(f"container {name}: capabilities.add {extra} (not in baseline's list)")
        out += [
            f"container {name}: hostPort {p['hostPort']}"
            for p in ctr.get("ports") or []
            if p.get("hostPort")
        ]
    return out


def restricted_violations(spec: Mapping[str, Any]) -> list[str]:
    """What keeps a pod spec that passes baseline out of "restricted"."""
    out: list[str] = []
    pod = _ctx(spec)
    for vol in spec.get("volumes") or []:
        kinds = set(vol) - {"name"} - RESTRICTED_VOLUME_TYPES
        if kinds:
            out.append(f"volume {vol['name']}: {sorted(kinds)} is not an allowed volume type")
    if pod.get("runAsUser") == 0:
        out.append("pod: runAsUser 0")
    # An explicit false on the pod fails even when every container says true.
    if pod.get("runAsNonRoot") is False:
        out.append("pod: runAsNonRoot false")
    pod_seccomp = (pod.get("seccompProfile") or {}).get("type") in SECCOMP_ALLOWED
    for ctr in _containers(spec):
        name, ctx = ctr["name"], _ctx(ctr)
        if ctx.get("allowPrivilegeEscalation") is not False:
            out.append(f"container {name}: allowPrivilegeEscalation is not false")
        non_root = ctx.get("runAsNonRoot", pod.get("runAsNonRoot"))
        if non_root is not True:
            out.append(f"container {name}: runAsNonRoot is not true (pod or container)")
        if ctx.get("runAsUser") == 0:
            out.append(f"container {name}: runAsUser 0")
        seccomp = (ctx.get("seccompProfile") or {}).get("type")
        if not (seccomp in SECCOMP_ALLOWED or (seccomp is None and pod_seccomp)):
            out.append(f"container {name}: seccompProfile is not RuntimeDefault or Localhost")
        caps = ctx.get("capabilities") or {}
        if "ALL" not in (caps.get("drop") or []):
            out.append(f"container {name}: capabilities.drop lacks ALL")
        extra = sorted(set(caps.get("add") or []) - RESTRICTED_CAPABILITIES)
        if extra:
            out.append(f"container {name}: capabilities.add {extra} (restricted allows none)")
    return out


def pod_level(spec: Mapping[str, Any], annotations: Mapping[str, str] | None = None) -> str:
    """The strictest Pod Security level that admits a pod spec."""
    if baseline_violations(spec, annotations or {}):
        return "privileged"
    return "restricted" if not restricted_violations(spec) else "baseline"


def pod_templates(objs: Iterable[Mapping[str, Any]]) -> Iterator[tuple[str, Mapping[str, Any]]]:
    """(kind/name, pod template or Pod) of every object that makes pods."""
    for obj in objs:
        name = f"{obj['kind']}/{obj['metadata']['name']}"
        spec = obj.get("spec") or {}
        if obj["kind"] == "Pod":
            yield name, obj
        elif obj["kind"] == "CronJob":
            yield name, spec["jobTemplate"]["spec"]["template"]
        elif "template" in spec and "containers" in (spec["template"].get("spec") or {}):
            yield name, spec["template"]


def level(objs: Iterable[Mapping[str, Any]]) -> tuple[str, dict[str, list[str]]]:
    """The strictest level a namespace can enforce and still admit every pod of a render,
    with what each pod breaks of the stricter levels (empty when it is restricted)."""
    worst = 0
    why: dict[str, list[str]] = {}
    for name, template in pod_templates(objs):
        spec = template["spec"]
        annotations = (template.get("metadata") or {}).get("annotations") or {}
        found = pod_level(spec, annotations)
        worst = max(worst, LEVELS.index(found))
        why[name] = baseline_violations(spec, annotations) + (
            restricted_violations(spec) if found != "restricted" else []
        )
    if not why:
        raise ValueError("the render has no pods: no level to judge")
    return LEVELS[worst], why


def claimed_level(text: str) -> str:
    """The level a values file states in its leading comment (`# Pod Security: <level>`)."""
    comments = []
    # The comment block before the first key (blank lines inside it allowed).
    for line in text.splitlines():
        if line.startswith("#") or not line.strip():
            comments.append(line)
        else:
            break
    found = _CLAIM.findall("\n".join(comments))
    if len(found) != 1 or found[0] not in LEVELS:
        raise ValueError(
            f"expected one line `# Pod Security: <{'|'.join(LEVELS)}>` in the leading "
            f"comment, found {found or 'none'}"
        )
    return str(found[0])
