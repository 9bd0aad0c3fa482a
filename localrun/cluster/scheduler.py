"""Node assignment, roughly as kube-scheduler filters and scores.

Filters: nodeSelector, required node affinity (In, NotIn, Exists, DoesNotExist, Gt, Lt),
NoSchedule/NoExecute taints against tolerations, and requests against allocatable
(cpu, memory, extended resources such as nvidia.com/gpu, and the pod count). Score:
preferred node affinity weights, then the fewest pods already placed, then the name.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from decimal import Decimal
from typing import Any

from localrun.cluster.podspec import PodSpecError, quantity

log = logging.getLogger(__name__)

Obj = dict[str, Any]


def _labels(node: Obj) -> dict[str, str]:
    return dict(node.get("metadata", {}).get("labels") or {})


def match_expression(expr: Obj, labels: Mapping[str, str]) -> bool:
    key, op = expr["key"], expr["operator"]
    values = [str(v) for v in expr.get("values") or []]
    if op == "In":
        return labels.get(key) in values
    if op == "NotIn":
        return labels.get(key) not in values
    if op == "Exists":
        return key in labels
    if op == "DoesNotExist":
        return key not in labels
    if op in ("Gt", "Lt"):
        try:
            have, want = int(labels[key]), int(values[0])
        except (KeyError, ValueError, IndexError):
            return False
        return have > want if op == "Gt" else have < want
    raise PodSpecError(f"node affinity operator {op!r} is not supported")


def _term_matches(term: Obj, labels: Mapping[str, str]) -> bool:
    return all(match_expression(e, labels) for e in term.get("matchExpressions") or [])


def required_affinity_ok(pod_spec: Obj, labels: Mapping[str, str]) -> bool:
    na = ((pod_spec.get("affinity") or {}).get("nodeAffinity") or {}).get(
        "requiredDuringSchedulingIgnoredDuringExecution"
    )
    if not na:
        return True
    terms = na.get("nodeSelectorTerms") or []
    return any(_term_matches(t, labels) for t in terms)  # terms are ORed


def preferred_score(pod_spec: Obj, labels: Mapping[str, str]) -> int:
    prefs = ((pod_spec.get("affinity") or {}).get("nodeAffinity") or {}).get(
        "preferredDuringSchedulingIgnoredDuringExecution"
    ) or []
    return sum(
        int(p.get("weight", 0)) for p in prefs if _term_matches(p.get("preference") or {}, labels)
    )


def tolerated(taint: Obj, tolerations: list[Obj]) -> bool:
    for t in tolerations:
        if t.get("effect") and t["effect"] != taint.get("effect"):
            continue
        if t.get("operator") == "Exists":
            if not t.get("key") or t["key"] == taint.get("key"):
                return True
        elif t.get("key") == taint.get("key") and str(t.get("value", "")) == str(
            taint.get("value", "")
        ):
            return True
    return False


def taints_ok(pod_spec: Obj, node: Obj) -> bool:
    tolerations = pod_spec.get("tolerations") or []
    for taint in (node.get("spec") or {}).get("taints") or []:
        if taint.get("effect") in ("NoSchedule", "NoExecute") and not tolerated(taint, tolerations):
            return False
    return True


def pod_requests(pod_spec: Obj) -> dict[str, Decimal]:
    """Sum of the containers' requests (limits stand in for missing requests), with init
    containers counted as the scheduler does: the max of any one and the sum of the rest."""

    def one(c: Obj) -> dict[str, Decimal]:
        res = c.get("resources") or {}
        merged = {**(res.get("limits") or {}), **(res.get("requests") or {})}
        return {k: quantity(str(v)) for k, v in merged.items()}

    total: dict[str, Decimal] = {}
    for c in pod_spec.get("containers") or []:
        for k, v in one(c).items():
            total[k] = total.get(k, Decimal(0)) + v
    for c in pod_spec.get("initContainers") or []:
        for k, v in one(c).items():
            total[k] = max(total.get(k, Decimal(0)), v)
    return total


def why_not(pod_spec: Obj, node: Obj, used: Mapping[str, Decimal], pods_on_node: int) -> str:
    """'' when the pod fits the node, else the reason (as kube-scheduler would say it)."""
    labels = _labels(node)
    for k, v in (pod_spec.get("nodeSelector") or {}).items():
        if labels.get(k) != str(v):
            return "didn't match Pod's node affinity/selector"
    if not required_affinity_ok(pod_spec, labels):
        return "didn't match Pod's node affinity/selector"
    if not taints_ok(pod_spec, node):
        return "had untolerated taint"
    alloc = (node.get("status") or {}).get("allocatable") or {}
    if pods_on_node + 1 > int(alloc.get("pods", 110)):
        return "Too many pods"
    for res, want in pod_requests(pod_spec).items():
        if res in ("ephemeral-storage",) or want == 0:
            continue
        have = quantity(str(alloc.get(res, "0")))
        if used.get(res, Decimal(0)) + want > have:
            return f"Insufficient {res}"
    return ""


def choose_node(
    pod_spec: Obj,
    nodes: Mapping[str, Obj],
    placed: Mapping[str, list[Obj]],
) -> tuple[str | None, str]:
    """(node name, "") or (None, "0/N nodes are available: ...") as the scheduler says it.

    `placed` maps node name -> pod specs already running there."""
    reasons: dict[str, int] = {}
    fits: list[tuple[int, int, str]] = []
    for name, node in sorted(nodes.items()):
        on_node = placed.get(name, [])
        used: dict[str, Decimal] = {}
        for spec in on_node:
            for k, v in pod_requests(spec).items():
                used[k] = used.get(k, Decimal(0)) + v
        reason = why_not(pod_spec, node, used, len(on_node))
        if reason:
            reasons[reason] = reasons.get(reason, 0) + 1
            continue
        fits.append((-preferred_score(pod_spec, _labels(node)), len(on_node), name))
    if fits:
        return sorted(fits)[0][2], ""
    detail = ", ".join(f"{n} node(s) {r}" for r, n in sorted(reasons.items()))
    return None, f"0/{len(nodes)} nodes are available: {detail}."
