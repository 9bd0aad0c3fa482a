"""The Pod Security Standards level a rendered pod template needs: the checks of the
Kubernetes Pod Security admission (pod-security.kubernetes.io, policy version "latest"),
written out for what these charts can render. No API server runs here, so the rules are
the documented ones (kubernetes.io/docs/concepts/security/pod-security-standards/):
a pod is `restricted` if it passes every baseline and restricted check, `baseline` if it
passes every baseline check, else `privileged`.
"""

from __future__ import annotations

from typing import Any

# Capabilities baseline lets a container add; restricted lets it add only NET_BIND_SERVICE.
BASELINE_CAPS = frozenset(
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
# Volume types restricted allows (every other one, hostPath included, is refused).
RESTRICTED_VOLUMES = frozenset(
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


def _containers(spec: dict[str, Any]) -> list[dict[str, Any]]:
    return [*spec.get("initContainers", []), *spec.get("containers", [])]


def baseline_violations(spec: dict[str, Any]) -> list[str]:
    out = []
    for key in ("hostNetwork", "hostPID", "hostIPC"):
        if spec.get(key):
            out.append(f"{key}: host namespaces")
    out += [f"volume {v['name']}: hostPath" for v in spec.get("volumes", []) if "hostPath" in v]
    for ctr in _containers(spec):
        ctx = ctr.get("securityContext") or {}
        name = ctr["name"]
        if ctx.get("privileged"):
            out.append(f"{name}: privileged")
        added = set((ctx.get("capabilities") or {}).get("add") or [])
        if added - BASELINE_CAPS:
            out.append(f"{name}: adds {sorted(added - BASELINE_CAPS)}")
        if any(p.get("hostPort") for p in ctr.get("ports", [])):
            out.append(f"{name}: hostPort")
        if ctx.get("procMount", "Default") != "Default":
            out.append(f"{name}: procMount")
        profile = (ctx.get("seccompProfile") or {}).get("type")
        if profile == "Unconfined":
            out.append(f"{name}: seccomp Unconfined")
    pod_profile = ((spec.get("securityContext") or {}).get("seccompProfile") or {}).get("type")
    if pod_profile == "Unconfined":
        out.append("pod: seccomp Unconfined")
    return out


def restricted_violations(spec: dict[str, Any]) -> list[str]:
    out = baseline_violations(spec)
    pod_ctx = spec.get("securityContext") or {}
    out += [
        f"volume {v['name']}: type not allowed"
        for v in spec.get("volumes", [])
        if not (set(v) - {"name"}) <= RESTRICTED_VOLUMES
    ]
    pod_seccomp = (pod_ctx.get("seccompProfile") or {}).get("type")
    for ctr in _containers(spec):
        ctx = ctr.get("securityContext") or {}
        name = ctr["name"]
        if ctx.get("allowPrivilegeEscalation") is not False:
            out.append(f"{name}: allowPrivilegeEscalation not false")
        non_root = ctx.get("runAsNonRoot", pod_ctx.get("runAsNonRoot"))
        if non_root is not True:
            out.append(f"{name}: runAsNonRoot not true")
        if ctx.get("runAsUser", pod_ctx.get("runAsUser")) == 0:
            out.append(f"{name}: runAsUser 0")
        seccomp = (ctx.get("seccompProfile") or {}).get("type") or pod_seccomp
        if seccomp not in ("RuntimeDefault", "Localhost"):
            out.append(f"{name}: seccompProfile not set")
        caps = ctx.get("capabilities") or {}
        if "ALL" not in (caps.get("drop") or []):
            out.append(f"{name}: capabilities not dropping ALL")
        if set(caps.get("add") or []) - {"NET_BIND_SERVICE"}:
            out.append(f"{name}: adds capabilities beyond NET_BIND_SERVICE")
    return out


def level(spec: dict[str, Any]) -> str:
    """`restricted`, `baseline` or `privileged`: the least privileged level admitting it."""
    if not restricted_violations(spec):
        return "restricted"
    if not baseline_violations(spec):
        return "baseline"
    return "privileged"
