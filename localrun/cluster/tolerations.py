"""Taints and tolerations as the control plane reads them: kube-apiserver's
DefaultTolerationSeconds admission, whether a toleration matches a taint, and how long
taint eviction lets a pod stay on a node with NoExecute taints (nodelifecycle.py acts on
them).

Source: kubernetes/kubernetes plugin/pkg/admission/defaulttolerationseconds,
pkg/controller/tainteviction, k8s.io/api core/v1 toleration.go (ToleratesTaint).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # nodelifecycle.py imports this module
    from localrun.cluster.nodelifecycle import NodeTimings

Obj = dict[str, Any]

NOT_READY = "node.kubernetes.io/not-ready"
UNREACHABLE = "node.kubernetes.io/unreachable"


def admitted_tolerations(tolerations: Iterable[Obj], timings: NodeTimings) -> list[Obj]:
    """The pod's tolerations as DefaultTolerationSeconds leaves them at creation: one of
    not-ready and one of unreachable (NoExecute, Exists, 300 s by default) unless it has
    one already (that key or none, NoExecute or every effect)."""
    out = [dict(t) for t in tolerations]

    def has(key: str) -> bool:
        return any(
            t.get("key", "") in ("", key) and t.get("effect", "") in ("", "NoExecute") for t in out
        )

    for key, seconds in (
        (NOT_READY, timings.not_ready_toleration),
        (UNREACHABLE, timings.unreachable_toleration),
    ):
        if not has(key):
            out.append(
                {
                    "key": key,
                    "operator": "Exists",
                    "effect": "NoExecute",
                    "tolerationSeconds": seconds,
                }
            )
    return out


def tolerates(toleration: Obj, taint: Obj) -> bool:
    """Whether one toleration matches one taint (key, operator, value, effect)."""
    if toleration.get("effect") and toleration["effect"] != taint.get("effect"):
        return False
    key = toleration.get("key", "")
    if toleration.get("operator") == "Exists":
        return not key or key == taint.get("key")
    return key == taint.get("key") and str(toleration.get("value", "")) == str(
        taint.get("value", "")
    )


def eviction_delay(tolerations: Iterable[Obj], taints: Iterable[Obj]) -> float | None:
    """Seconds a pod may stay after NoExecute `taints` were added: 0 when one is not
    tolerated, None when all are tolerated for ever (taint eviction's rule: the shortest
    tolerationSeconds of the tolerations used)."""
    used: list[Obj] = []
    for taint in taints:
        if taint.get("effect") != "NoExecute":
            continue
        matching = [t for t in tolerations if tolerates(t, taint)]
        if not matching:
            return 0.0
        used += matching
    bounded = [
        float(t["tolerationSeconds"]) for t in used if t.get("tolerationSeconds") is not None
    ]
    if not bounded:
        return None
    return max(0.0, min(bounded))
