"""Kubernetes RBAC's rule matching (pkg/apis/rbac/v1/evaluation_helpers.go), over rendered
Roles and ClusterRoles, so a test can ask "would the API server allow this request?".

Covers what the charts' rules use: verbs, apiGroups, resources with subresources
(`statefulsets/scale`, `*/scale`, `*`) and resourceNames. Non-resource URLs, aggregation
and escalation checks are left out: the charts grant none of them.
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
