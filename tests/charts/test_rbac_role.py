"""templates/rbac-role.yaml and rbac-rolebinding.yaml: scale this release's own StatefulSets."""

from __future__ import annotations

import http.server
import threading
from typing import Any, ClassVar

import pytest
from chart_render import (
    ELASTIC_JOB,
    NAMESPACE,
    RELEASE,
    etcd_statefulset,
    objects,
    of_kind,
    one,
    worker_statefulsets,
)
from elastic_worker import scaledown
from elastic_worker.settings.config import KubeApi
from rbac import Request, allows

MULTI = ELASTIC_JOB / "ci" / "multigroup-values.yaml"
SA = f"{RELEASE}-elastic-job"


def test_role_grants_only_patch_on_the_scale_of_own_statefulsets_by_name() -> None:
    """rbac.scaleDown: apps statefulsets/scale by name only: patch on exactly this
    release's worker StatefulSets, then get and patch on its bundled etcd's."""
    objs = objects(ELASTIC_JOB, values=[MULTI])
    workers, etcd = one(objs, "Role")["rules"]
    assert workers == {
        "apiGroups": ["apps"],
        "resources": ["statefulsets/scale"],
        "resourceNames": [s["metadata"]["name"] for s in worker_statefulsets(objs)],
        "verbs": ["patch"],
    }
    assert etcd == {
        "apiGroups": ["apps"],
        "resources": ["statefulsets/scale"],
        "resourceNames": [etcd_statefulset(objs)["metadata"]["name"]],
        "verbs": ["get", "patch"],
    }


def test_with_an_external_rendezvous_the_role_has_only_the_workers() -> None:
    objs = objects(
        ELASTIC_JOB,
        sets=["etcd-rendezvous.enabled=false", "rendezvous.endpoint=etcd.example:2379"],
    )
    (rule,) = one(objs, "Role")["rules"]
    assert rule["resourceNames"] == [s["metadata"]["name"] for s in worker_statefulsets(objs)]


class _Recorder(http.server.BaseHTTPRequestHandler):
    """Stands in for the API server (which cannot run here): records and accepts."""

    seen: ClassVar[list[tuple[str, str]]] = []

    def do_PATCH(self) -> None:
        self.rfile.read(int(self.headers.get("Content-Length", "0")))
        self.seen.append(("PATCH", self.path))
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", "2")
        self.end_headers()
        self.wfile.write(b"{}")

    def log_message(self, format: str, *args: Any) -> None:
        pass


def _worker_scale_down_requests(names: tuple[str, ...]) -> list[Request]:
    """The requests elastic-worker's scale-to-zero sends, as RBAC sees them."""
    _Recorder.seen = []
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Recorder)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        api = KubeApi(f"http://127.0.0.1:{server.server_port}", "token", None)
        assert scaledown.scale_to_zero(api, NAMESPACE, names) == len(names)
    finally:
        server.shutdown()
        server.server_close()
    return [Request.from_http(method, path) for method, path in _Recorder.seen]


def test_role_allows_every_request_of_the_workers_scale_down() -> None:
    """What elastic-worker sends when the job completes (ELASTIC_STATEFULSETS_FILE) is allowed."""
    objs = objects(ELASTIC_JOB, values=[MULTI])
    names = tuple(s["metadata"]["name"] for s in worker_statefulsets(objs))
    assert len(names) == 2
    requests = _worker_scale_down_requests(names)
    assert [(r.verb, r.subresource, r.name) for r in requests] == [
        ("patch", "scale", n) for n in names
    ]
    for req in requests:
        assert allows([one(objs, "Role")], req), req


@pytest.mark.parametrize(
    ("method", "suffix"),
    [
        ("PATCH", ""),  # the spec: image, command, volumes
        ("PUT", ""),
        ("DELETE", ""),
        ("GET", ""),
        ("PUT", "/scale"),
        ("GET", "/scale"),
        ("PATCH", "/status"),
    ],
)
def test_role_refuses_everything_else_on_own_statefulsets(method: str, suffix: str) -> None:
    """The training code shares the token: it may not rewrite its StatefulSet."""
    objs = objects(ELASTIC_JOB, values=[MULTI])
    for sts in worker_statefulsets(objs):
        path = f"/apis/apps/v1/namespaces/{NAMESPACE}/statefulsets/{sts['metadata']['name']}"
        assert not allows([one(objs, "Role")], Request.from_http(method, path + suffix))


def test_role_allows_the_etcd_scale_and_nothing_else_of_it() -> None:
    """The finished job scales its etcd to 0 (and a late pod reads that scale); the etcd's
    spec stays out of reach, and so does every other release's StatefulSet."""
    objs = objects(ELASTIC_JOB, values=[MULTI])
    role = one(objs, "Role")
    etcd = (
        f"/apis/apps/v1/namespaces/{NAMESPACE}/statefulsets/"
        + (etcd_statefulset(objs)["metadata"]["name"])
    )
    assert allows([role], Request.from_http("PATCH", etcd + "/scale"))
    assert allows([role], Request.from_http("GET", etcd + "/scale"))
    for method in ("PATCH", "PUT", "DELETE", "GET"):
        assert not allows([role], Request.from_http(method, etcd))
    other = f"/apis/apps/v1/namespaces/{NAMESPACE}/statefulsets/other-elastic-job-default/scale"
    assert not allows([role], Request.from_http("PATCH", other))


@pytest.mark.parametrize(
    "sets",
    [
        ("rbac.scaleDown.enabled=false",),
        ("worker.automountServiceAccountToken=false",),
        ("serviceAccount.create=false",),  # would bind the namespace's "default" account
    ],
)
def test_no_role_when_the_worker_does_not_scale_down(sets: tuple[str, ...]) -> None:
    """A grant nobody uses is not rendered (ELASTIC_SCALE_DOWN is false in each case)."""
    objs = objects(ELASTIC_JOB, sets=sets)
    assert not of_kind(objs, "Role") and not of_kind(objs, "RoleBinding")


def test_role_binding_binds_the_service_account() -> None:
    """The RoleBinding binds the Role to the ServiceAccount, in the release namespace."""
    objs = objects(ELASTIC_JOB)
    binding = one(objs, "RoleBinding")
    assert binding["metadata"]["namespace"] == NAMESPACE
    assert binding["roleRef"]["name"] == one(objs, "Role")["metadata"]["name"]
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": SA, "namespace": NAMESPACE}]


def test_no_other_rbac_objects_and_no_wildcards() -> None:
    """Exactly one Role (no ClusterRole: tests/charts/test_tenant.py), no `*` anywhere in
    its rules."""
    objs = objects(ELASTIC_JOB)
    roles = of_kind(objs, "ClusterRole") + of_kind(objs, "Role")
    assert len(roles) == 1
    for role in roles:
        for rule in role["rules"]:
            for key in ("apiGroups", "resources", "verbs"):
                assert "*" not in rule[key]
