"""localrun.cluster.apiserver: the fake kube-apiserver the init-topology tests and the local runner
use. Driven with the official client, so what passes here is what real clients see."""

from __future__ import annotations

import http.client
import json
import ssl
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client  # type: ignore[import-untyped]
from kubernetes.config.incluster_config import (  # type: ignore[import-untyped]
    InClusterConfigLoader,
)

from localrun.cluster.apiserver import FakeApiServer
from localrun.cluster.nodes import NODE_PROFILES, load_nodes


@pytest.fixture
def server(tmp_path: Path) -> Iterator[FakeApiServer]:
    with FakeApiServer(
        load_nodes("all"), workdir=tmp_path, namespace="ml", serviceaccount="run42"
    ) as api:
        yield api


def api_client(api: FakeApiServer) -> client.ApiClient:
    cfg = client.Configuration()
    sa = api.serviceaccount_dir
    InClusterConfigLoader(str(sa / "token"), str(sa / "ca.crt"), environ=api.env()).load_and_set(
        cfg
    )
    cfg.retries = False
    return client.ApiClient(cfg)


def raw(api: FakeApiServer, path: str, *, token: str | None = None, method: str = "GET") -> Any:
    ctx = ssl.create_default_context(cafile=str(api.ca_path))
    req = urllib.request.Request(
        api.url + path, method=method, headers={"Authorization": f"Bearer {token or api.token}"}
    )
    try:
        with urllib.request.urlopen(req, context=ctx, timeout=10) as resp:
            return resp.status, json.load(resp)
    except urllib.error.HTTPError as exc:
        return exc.code, json.load(exc)


def test_every_fixture_deserializes_as_a_v1node(server: FakeApiServer) -> None:
    with api_client(server) as c:
        core = client.CoreV1Api(c)
        for name in load_nodes("all"):
            node = core.read_node(name)
            assert node.metadata.name == name and node.status.node_info.kubelet_version
        assert len(core.list_node().items) == len(NODE_PROFILES["all"])


def test_profiles_name_distinct_nodes() -> None:
    local = load_nodes("local")
    assert len(local) == len(NODE_PROFILES["local"]) == 5
    capacity = sorted(n["metadata"]["labels"]["karpenter.sh/capacity-type"] for n in local.values())
    assert capacity == ["on-demand", "on-demand", "on-demand", "spot", "spot"]


def test_serviceaccount_dir_is_what_the_kubelet_mounts(server: FakeApiServer) -> None:
    sa = server.serviceaccount_dir
    assert sorted(p.name for p in sa.iterdir()) == ["ca.crt", "namespace", "token"]
    assert (sa / "token").read_text() == server.token
    assert (sa / "namespace").read_text() == "ml"
    assert (sa / "ca.crt").read_text().startswith("-----BEGIN CERTIFICATE-----")


def test_a_wrong_token_gets_401(server: FakeApiServer) -> None:
    status, body = raw(server, "/api/v1/nodes/cpu-node-01", token="wrong")
    assert (status, body["reason"], body["message"]) == (401, "Unauthorized", "Unauthorized")


def test_statuses_have_the_real_servers_shape(server: FakeApiServer) -> None:
    server.add_statefulset("ml", "run42-w", replicas=2)
    server.set_fault("/scale$", 403, method="PATCH")
    server.set_fault("^/api/v1/nodes/cpu-node-01$", 500, times=1)
    status, body = raw(
        server, "/apis/apps/v1/namespaces/ml/statefulsets/run42-w/scale", method="PATCH"
    )
    assert status == 403
    assert body == {
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Failure",
        "message": 'statefulsets.apps "run42-w" is forbidden: User '
        '"system:serviceaccount:ml:run42" cannot patch resource "statefulsets/scale" in API '
        'group "apps" in the namespace "ml"',
        "reason": "Forbidden",
        "details": {"name": "run42-w", "group": "apps", "kind": "statefulsets"},
        "code": 403,
    }
    assert raw(server, "/apis/apps/v1/namespaces/ml/statefulsets/run42-w/scale")[0] == 200
    assert raw(server, "/api/v1/nodes/cpu-node-01")[0] == 500
    assert raw(server, "/api/v1/nodes/cpu-node-01")[0] == 200  # times=1 used up
    status, body = raw(server, "/apis/apps/v1/namespaces/ml/statefulsets/nope")
    assert (status, body["message"]) == (404, 'statefulsets.apps "nope" not found')
    status, body = raw(server, "/api/v1/nodes/nope")
    assert (status, body["message"], body["details"]) == (
        404,
        'nodes "nope" not found',
        {"name": "nope", "kind": "nodes"},
    )


# kubernetes 35 builds ApiException with HTTPResponse.getheaders(), deprecated in urllib3 2.5.
@pytest.mark.filterwarnings("ignore:HTTPResponse.getheaders:DeprecationWarning")
def test_scale_patch_put_and_the_controller_callback(server: FakeApiServer) -> None:
    calls: list[tuple[str, str, int]] = []
    server.on_scale = lambda ns, name, replicas: calls.append((ns, name, replicas))
    server.add_statefulset("ml", "run42-w", replicas=3)
    with api_client(server) as c:
        apps = client.AppsV1Api(c)
        scale = apps.patch_namespaced_stateful_set_scale("run42-w", "ml", {"spec": {"replicas": 0}})
        assert scale.spec.replicas == 0 and scale.kind == "Scale"
        patch = [{"op": "replace", "path": "/spec/replicas", "value": 2}]
        apps.patch_namespaced_stateful_set_scale("run42-w", "ml", patch)
        body = client.V1Scale(metadata=client.V1ObjectMeta(name="run42-w"), spec={"replicas": 1})
        apps.replace_namespaced_stateful_set_scale("run42-w", "ml", body)
        sts = apps.read_namespaced_stateful_set("run42-w", "ml")
        assert sts.spec.replicas == 1 and sts.metadata.generation == 4
        assert apps.read_namespaced_stateful_set_scale("run42-w", "ml").spec.replicas == 1
        with pytest.raises(client.ApiException) as exc:
            apps.patch_namespaced_stateful_set_scale("run42-w", "ml", {"spec": {"replicas": -1}})
        assert exc.value.status == 422
    assert calls == [("ml", "run42-w", 0), ("ml", "run42-w", 2), ("ml", "run42-w", 1)]
    assert server.replicas("ml", "run42-w") == 1
    assert [r.content_type for r in server.requests if r.method == "PATCH"][:2] == [
        "application/strategic-merge-patch+json",
        "application/json-patch+json",
    ]


def test_a_failing_callback_does_not_fail_the_request(server: FakeApiServer) -> None:
    def boom(ns: str, name: str, replicas: int) -> None:
        raise RuntimeError("runner bug")

    server.on_scale = boom
    server.add_statefulset("ml", "w", replicas=1)
    with api_client(server) as c:
        client.AppsV1Api(c).patch_namespaced_stateful_set_scale(
            "w", "ml", {"spec": {"replicas": 0}}
        )
    assert server.replicas("ml", "w") == 0


def test_a_hang_ends_when_the_server_stops(tmp_path: Path) -> None:
    api = FakeApiServer(load_nodes(["cpu-bare"]), workdir=tmp_path).start()
    api.set_fault(".*", "hang")
    errors: list[BaseException] = []

    def call() -> None:
        try:
            raw(api, "/api/v1/nodes/cpu-node-01")
        except (OSError, http.client.HTTPException) as exc:  # closed without an answer
            errors.append(exc)

    thread = threading.Thread(target=call)
    thread.start()
    deadline = time.monotonic() + 10
    while not api.requests and time.monotonic() < deadline:
        time.sleep(0.05)
    assert [r.status for r in api.requests] == ["hang"]
    api.stop()
    thread.join(15)
    assert not thread.is_alive() and errors


def test_bad_fault_is_refused(server: FakeApiServer) -> None:
    with pytest.raises(ValueError, match="HTTP error status or 'hang'"):
        server.set_fault(".*", 200)


def test_without_a_workdir_it_cleans_up_after_itself() -> None:
    with FakeApiServer({}) as api:
        workdir = api.workdir
        assert (workdir / "serviceaccount" / "token").exists()
    assert not workdir.exists()
