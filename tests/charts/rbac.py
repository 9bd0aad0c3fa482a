"""Kubernetes RBAC's rule matching (pkg/apis/rbac/v1/evaluation_helpers.go), over rendered
Roles and ClusterRoles, so a test can ask "would the API server allow this request?".

Covers what the charts' rules and Kubernetes' `admin` role use: verbs, apiGroups, resources
with subresources (`statefulsets/scale`, `*/scale`, `*`) and resourceNames; who a rule
applies to (ClusterRoleBindings everywhere, RoleBindings in their namespace; User, Group and
ServiceAccount subjects); ClusterRole aggregation (matchLabels selectors); and the
escalation check on creating a Role or a binding (policy_comparator.go's Covers).
Non-resource URLs are left out: neither the charts nor the `admin` role grant them.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

# The request verb the API server derives from the HTTP method (for a named resource).
_VERBS = {"GET": "get", "PATCH": "patch", "PUT": "update", "DELETE": "delete", "POST": "create"}
_PATH = re.compile(
    r"^/(?:api/(?P<core>v1)|apis/(?P<group>[^/]+)/[^/]+)"
    r"(?:/namespaces/(?P<ns>[^/]+))?/(?P<resource>[^/]+)(?:/(?P<name>[^/]+)(?:/(?P<sub>[^/]+))?)?$"
)


@dataclass(frozen=True)
class Request:
    """The attributes RBAC authorizes: verb, API group, resource, subresource, name."""

    verb: str
    group: str
    resource: str
    subresource: str = ""
    name: str = ""

    @classmethod
    def from_http(cls, method: str, path: str) -> Request:
        """The attributes of an HTTP request to the API server (named resources only)."""
        m = _PATH.match(path.split("?", 1)[0])
        if not m or not m["name"]:
            raise ValueError(f"not a request for a named resource: {method} {path}")
        return cls(
            verb=_VERBS[method],
            group="" if m["core"] else m["group"],
            resource=m["resource"],
            subresource=m["sub"] or "",
            name=m["name"],
        )


def _resource_matches(rule_resources: Iterable[str], req: Request) -> bool:
    combined = f"{req.resource}/{req.subresource}" if req.subresource else req.resource
    for resource in rule_resources:
        if resource in ("*", combined):
            return True
        if req.subresource and resource == f"*/{req.subresource}":
            return True
    return False


def rule_allows(rule: Mapping[str, Any], req: Request) -> bool:
    verbs = rule.get("verbs") or []
    groups = rule.get("apiGroups") or []
    names = rule.get("resourceNames") or []
    return (
        ("*" in verbs or req.verb in verbs)
        and ("*" in groups or req.group in groups)
        and _resource_matches(rule.get("resources") or [], req)
        and (not names or req.name in names)
    )


def allows(roles: Iterable[Mapping[str, Any]], req: Request) -> bool:
    """Whether any rule of any of the roles allows the request (RBAC only adds)."""
    return any(rule_allows(rule, req) for role in roles for rule in role.get("rules") or [])


# -- who a request comes from, and which rules apply to it --------------------------------
# (pkg/registry/rbac/validation/rule.go: appliesTo, VisitRulesFor; the cluster role
# aggregation controller; policy_comparator.go: Covers)


@dataclass(frozen=True)
class User:
    """An authenticated user: its name and groups, as the authenticator gives them."""

    name: str
    groups: tuple[str, ...] = ()


def service_account(namespace: str, name: str) -> User:
    """A pod's ServiceAccount token: the user and the groups the API server gives it."""
    return User(
        f"system:serviceaccount:{namespace}:{name}",
        ("system:serviceaccounts", f"system:serviceaccounts:{namespace}", "system:authenticated"),
    )


def _applies_to(subject: Mapping[str, Any], user: User, namespace: str) -> bool:
    kind, name = subject.get("kind"), subject.get("name")
    if kind == "User":
        return bool(name == user.name)
    if kind == "Group":
        return name in user.groups
    if kind == "ServiceAccount":
        return user.name == f"system:serviceaccount:{subject.get('namespace') or namespace}:{name}"
    return False


def _selects(selector: Mapping[str, Any], labels: Mapping[str, str]) -> bool:
    if selector.get("matchExpressions"):
        raise NotImplementedError("matchExpressions in an aggregationRule")
    return all(labels.get(k) == v for k, v in (selector.get("matchLabels") or {}).items())


def aggregate(cluster_roles: Iterable[Mapping[str, Any]]) -> dict[str, list[Mapping[str, Any]]]:
    """name -> rules of each ClusterRole, an aggregated one's filled from the roles its
    aggregationRule selects, until nothing changes (as the controller converges: `admin`
    selects `edit`, itself aggregated from `view`)."""
    roles = {r["metadata"]["name"]: r for r in cluster_roles}
    rules = {name: list(r.get("rules") or []) for name, r in roles.items()}
    changed = True
    while changed:
        changed = False
        for name, role in roles.items():
            selectors = (role.get("aggregationRule") or {}).get("clusterRoleSelectors")
            if not selectors:
                continue
            gathered: list[Mapping[str, Any]] = []
            for other, candidate in sorted(roles.items()):
                labels = candidate["metadata"].get("labels") or {}
                if other != name and any(_selects(s, labels) for s in selectors):
                    gathered += [r for r in rules[other] if r not in gathered]
            if gathered != rules[name]:
                rules[name], changed = gathered, True
    return rules


def rules_for(
    user: User,
    namespace: str,
    bindings: Iterable[Mapping[str, Any]],
    roles: Iterable[Mapping[str, Any]],
) -> list[Mapping[str, Any]]:
    """The rules that apply to `user` for a request in `namespace` ("" for a cluster-scoped
    one): every ClusterRoleBinding's, and the RoleBindings' of that namespace."""
    all_roles = list(roles)
    cluster = aggregate(r for r in all_roles if r["kind"] == "ClusterRole")
    local = {
        (r["metadata"].get("namespace", ""), r["metadata"]["name"]): r.get("rules") or []
        for r in all_roles
        if r["kind"] == "Role"
    }
    out: list[Mapping[str, Any]] = []
    for b in bindings:
        meta = b["metadata"]
        if b["kind"] == "RoleBinding" and meta.get("namespace") != namespace:
            continue
        bound_ns = meta.get("namespace", "")
        if not any(_applies_to(s, user, bound_ns) for s in b.get("subjects") or []):
            continue
        ref = b["roleRef"]
        if ref["kind"] == "ClusterRole":
            out += cluster.get(ref["name"], [])
        else:
            out += local.get((bound_ns, ref["name"]), [])
    return out


def authorized(
    user: User,
    req: Request,
    namespace: str,
    bindings: Iterable[Mapping[str, Any]],
    roles: Iterable[Mapping[str, Any]],
) -> bool:
    """Whether RBAC allows `req` (in `namespace`, "" at the cluster scope) to `user`."""
    return any(rule_allows(r, req) for r in rules_for(user, namespace, bindings, roles))


def _covers_resources(owner: list[str], wanted: str) -> bool:
    if "*" in owner or wanted in owner:
        return True
    if "/" not in wanted:
        return False
    return "*/" + wanted.split("/", 1)[1] in owner


def _covers(owner: Mapping[str, Any], verb: str, group: str, resource: str, name: str) -> bool:
    """policy_comparator.go's ruleCovers for one verb, group, resource and name ("": any)."""
    verbs, groups = owner.get("verbs") or [], owner.get("apiGroups") or []
    names = owner.get("resourceNames") or []
    return (
        ("*" in verbs or verb in verbs)
        and ("*" in groups or group in groups)
        and _covers_resources(list(owner.get("resources") or []), resource)
        and (not names or (bool(name) and name in names))
    )


def uncovered(
    owner_rules: Iterable[Mapping[str, Any]], rules: Iterable[Mapping[str, Any]]
) -> list[str]:
    """The parts of `rules` the owner's rules do not cover, each as "verb group/resource
    [name]": the escalation check the API server makes when someone creates a Role, or a
    binding to a role, without the `escalate` or `bind` verb (a role grants only what its
    creator holds). Empty: nothing escalates."""
    owners = list(owner_rules)
    missing: list[str] = []
    for rule in rules:
        if rule.get("nonResourceURLs"):
            raise NotImplementedError("nonResourceURLs")
        for group in rule.get("apiGroups") or []:
            for resource in rule.get("resources") or []:
                for verb in rule.get("verbs") or []:
                    for name in rule.get("resourceNames") or [""]:
                        if not any(_covers(o, verb, group, resource, name) for o in owners):
                            where = f"{group or 'core'}/{resource}"
                            missing.append(f"{verb} {where} {name}".rstrip())
    return missing
