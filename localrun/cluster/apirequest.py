"""A request to the fake API server as its handlers see it (what the path names, its query
and body), and the answers they give: a JSON reply, raw bytes, or a stream."""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any, Protocol

JsonObject = dict[str, Any]
Query = dict[str, list[str]]

_NODE_PATH = re.compile(r"^/api/v1/nodes(?:/(?P<name>[^/]+))?$")
_STS_PATH = re.compile(
    r"^/apis/apps/v1/namespaces/(?P<ns>[^/]+)/statefulsets/(?P<name>[^/]+)(?P<scale>/scale)?$"
)
_STS_LIST = re.compile(r"^/apis/apps/v1/namespaces/(?P<ns>[^/]+)/statefulsets$")
_STS_ALL = re.compile(r"^/apis/apps/v1/statefulsets$")
_CORE_ALL = re.compile(r"^/api/v1/(?P<res>pods|events)$")
_CORE_NS = re.compile(
    r"^/api/v1/namespaces/(?P<ns>[^/]+)/(?P<res>pods|events)"
    r"(?:/(?P<name>[^/:]+)(?::(?P<port>[^/]+))?(?:/(?P<sub>log|proxy|eviction)(?P<rest>/.*)?)?)?$"
)


@dataclass(frozen=True)
class Target:
    """What a request path names, for routing and for error messages in the real
    server's words."""

    verb: str  # get, list, watch, create, patch, update
    group: str  # "" for the core group
    resource: str  # nodes, statefulsets, pods, events
    subresource: str  # "", "scale", "log", "proxy" or "eviction"
    namespace: str  # "" when cluster-scoped
    name: str
    port: str = ""  # pods/NAME:PORT/proxy
    rest: str = ""  # the path after .../proxy

    @property
    def qualified(self) -> str:
        return f"{self.resource}.{self.group}" if self.group else self.resource

    @property
    def details(self) -> JsonObject:
        details: JsonObject = {"name": self.name} if self.name else {}
        if self.group:
            details["group"] = self.group
        details["kind"] = self.resource
        return details


def target(method: str, path: str, watch: bool = False) -> Target | None:
    """What `path` names (None: nothing this server serves)."""
    verb = {"GET": "get", "PATCH": "patch", "PUT": "update", "POST": "create"}.get(
        method, method.lower()
    )
    collection = "watch" if watch else "list"
    if m := _NODE_PATH.match(path):
        name = m["name"] or ""
        return Target(verb if name else collection, "", "nodes", "", "", name)
    if m := _STS_PATH.match(path):
        scale = "scale" if m["scale"] else ""
        return Target(verb, "apps", "statefulsets", scale, m["ns"], m["name"])
    if m := _STS_LIST.match(path):
        return Target(
            collection if method == "GET" else verb, "apps", "statefulsets", "", m["ns"], ""
        )
    if _STS_ALL.match(path):
        return Target(collection if method == "GET" else verb, "apps", "statefulsets", "", "", "")
    if m := _CORE_ALL.match(path):
        return Target(collection if method == "GET" else verb, "", m["res"], "", "", "")
    if m := _CORE_NS.match(path):
        name = m["name"] or ""
        if not name and method == "GET":
            verb = collection
        return Target(
            verb, "", m["res"], m["sub"] or "", m["ns"], name, m["port"] or "", m["rest"] or ""
        )
    return None


@dataclass(frozen=True)
class Request:
    """One request, parsed once: its method, unescaped path, query, body (JSON when it
    parses), Content-Type, and what the path names."""

    method: str
    path: str
    query: Query
    body: Any
    content_type: str | None
    target: Target


@dataclass
class Reply:
    """A JSON object; `after` runs once it is sent (a callback the server's owner gave,
    such as acting on a scale: its exceptions are its own)."""

    code: int
    payload: JsonObject
    after: Callable[[], None] | None = None


@dataclass
class Raw:
    code: int
    content_type: str
    data: bytes


@dataclass
class Stream:
    content_type: str
    chunks: Iterator[bytes]
    code: int = 200
    headers: dict[str, str] = field(default_factory=dict)


Answer = Reply | Raw | Stream


def flag(query: Query, key: str) -> bool:
    return (query.get(key) or ["false"])[-1].lower() in {"true", "1"}


def one(query: Query, key: str) -> str:
    return (query.get(key) or [""])[-1]


class Resource(Protocol):
    """The handler of one resource (apinodes.py, apistatefulsets.py, apipods.py,
    apievents.py): the server routes every request whose path names `resource` to it,
    after authentication and faults."""

    resource: str

    def handle(self, req: Request) -> Answer: ...
