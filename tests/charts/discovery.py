"""Which resource, and which scope, a rendered object's kind is: the API discovery data a
client (Helm, kubectl) reads before it creates an object, taken from data rather than a
hand-written list.

- Built-in kinds: the official Python client (`kubernetes`, pinned in requirements/dev.txt),
  generated from the OpenAPI document of its Kubernetes release. Each of its `create_*`
  operations is called against a recorder instead of a server, which gives the HTTP
  request the client would send: `POST /apis/apps/v1/namespaces/{namespace}/statefulsets`
  names the group, version and resource, and `/namespaces/{namespace}/` in the path says
  the kind is namespaced. (kubernetes-validate, the schema validator, ships the OpenAPI
  definitions without their paths, so it cannot say.)
- Custom resources: `spec.scope` and `spec.names.plural` of the upstream CRDs in
  ../shared/crds (tests/testlib.py's shared_dir()).
"""

from __future__ import annotations

import functools
import inspect
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import kubernetes.client
import yaml

_CREATE_PATH = re.compile(
    r"^/(?:api/(?P<core>v1)|apis/(?P<group>[^/]+)/(?P<version>[^/]+))"
    r"(?P<namespaced>/namespaces/\{namespace\})?/(?P<resource>[^/{}]+)$"
)


@dataclass(frozen=True)
class Resource:
    """What the API serves a kind as."""

    group: str
    version: str
    kind: str
    resource: str  # the plural, as RBAC rules and URLs name it
    namespaced: bool


class _Recorder:
    """Stands in for kubernetes.client.ApiClient: records the request, sends nothing."""

    def __init__(self) -> None:
        self.configuration = kubernetes.client.Configuration()
        self.client_side_validation = False
        self.calls: list[tuple[str, str]] = []

    def call_api(self, path: str, method: str, *args: Any, **kwargs: Any) -> None:
        self.calls.append((method, path))

    def select_header_accept(self, *args: Any) -> None:
        return None

    def select_header_content_type(self, *args: Any, **kwargs: Any) -> None:
        return None


def _kind_of(method: str) -> str:
    """create_namespaced_stateful_set -> statefulset (kinds compare case-insensitively)."""
    return method.removeprefix("create_").removeprefix("namespaced_").replace("_", "")


@functools.cache
def builtin() -> dict[tuple[str, str, str], Resource]:
    """(group, version, lower-case kind) -> Resource for every kind the client can create."""
    out: dict[tuple[str, str, str], Resource] = {}
    for api_name, api_class in inspect.getmembers(kubernetes.client, inspect.isclass):
        if not api_name.endswith("Api") or api_name in {"ApiClient", "CustomObjectsApi"}:
            continue
        recorder = _Recorder()
        api = api_class(api_client=recorder)
        for method, function in inspect.getmembers(api, inspect.ismethod):
            if not method.startswith("create_") or method.endswith("_with_http_info"):
                continue
            params = [
                p
                for p in inspect.signature(function).parameters.values()
                if p.kind is p.POSITIONAL_OR_KEYWORD and p.default is p.empty
            ]
            if [p.name for p in params] not in (["body"], ["namespace", "body"]):
                continue  # a subresource of a named object (pods/eviction, .../token)
            recorder.calls.clear()
            function(*(["ns"] if len(params) == 2 else []), {})
            ((http, path),) = recorder.calls
            m = _CREATE_PATH.match(path)
            if http != "POST" or m is None:
                continue
            group = "" if m["core"] else m["group"]
            version = m["core"] or m["version"]
            kind = _kind_of(method)
            out[(group, version, kind)] = Resource(
                group, version, kind, m["resource"], bool(m["namespaced"])
            )
    return out


@functools.cache
def custom(shared: Path) -> dict[tuple[str, str, str], Resource]:
    """The same for every CRD under `shared`/crds, each served version."""
    out: dict[tuple[str, str, str], Resource] = {}
    for path in sorted((shared / "crds").rglob("*.yaml")):
        for doc in yaml.safe_load_all(path.read_text()):
            if not doc or doc.get("kind") != "CustomResourceDefinition":
                continue
            spec = doc["spec"]
            kind = spec["names"]["kind"]
            for version in spec["versions"]:
                out[(spec["group"], version["name"], kind.lower())] = Resource(
                    spec["group"],
                    version["name"],
                    kind,
                    spec["names"]["plural"],
                    spec["scope"] == "Namespaced",
                )
    return out


def resource_of(obj: dict[str, Any], shared: Path | None) -> Resource | None:
    """The Resource of a rendered object; None when neither source knows its kind."""
    group, _, version = obj["apiVersion"].rpartition("/")
    key = (group, version, obj["kind"].lower())
    found = builtin().get(key)
    if found is None and shared is not None:
        found = custom(shared).get(key)
    return found
