"""The fake API server's pods, logs, pod proxy, events and watches, read with the official
client (as elastic-job and kubectl read them), and the pod objects the mini-cluster's
lifecycle becomes (podobject.py)."""

from __future__ import annotations

import http.server
import json
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client, watch  # type: ignore[import-untyped]
from kubernetes.client.rest import ApiException  # type: ignore[import-untyped]
from localrun_fakes import Harness, statefulset
from test_localrun_apiserver import api_client

from localrun.cluster import podlogs
from localrun.cluster.apiserver import FakeApiServer
from localrun.cluster.apistore import SelectorError, label_matches
from localrun.cluster.podobject import pod_object

NS = "ml"


def message(exc: ApiException) -> str:
    return str(json.loads(exc.body)["message"])


@pytest.fixture
def api(tmp_path: Path) -> Iterator[FakeApiServer]:
    with FakeApiServer({}, workdir=tmp_path / "api", namespace=NS) as server:
        yield server


@pytest.fixture
def core(api: FakeApiServer) -> Iterator[client.CoreV1Api]:
    with api_client(api) as c:
        yield client.CoreV1Api(c)


def pod(name: str, *, running: bool = True, ip: str = "127.0.0.1", **labels: str) -> dict[str, Any]:
    state = (
        {"running": {"startedAt": "2026-11-23T10:00:00Z"}}
        if running
        else {"waiting": {"reason": "CrashLoopBackOff"}}
    )
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": name,
            "namespace": NS,
            "uid": f"uid-{name}",
            "labels": {"app.kubernetes.io/instance": "run42", **labels},
            "creationTimestamp": "2026-11-23T10:00:00Z",
        },
        "spec": {
            "containers": [
                {"name": "worker", "image": "w:1",
                 "ports": [{"name": "metrics", "containerPort": 0}]}
            ]
        },
        "status": {
            "phase": "Running",
            "podIP": ip,
            "containerStatuses": [
                {"name": "worker", "image": "w:1", "imageID": "", "ready": running,
                 "restartCount": 0, "state": state}
            ],
        },
    }  # fmt: skip


def test_pods_list_by_label_and_get_deserialize(api: FakeApiServer, core: client.CoreV1Api) -> None:
    api.publish_pods(NS, [pod("w-0", group="a"), pod("w-1", group="b")])
    listed = core.list_namespaced_pod(NS, label_selector="app.kubernetes.io/instance=run42,group=b")
    assert [p.metadata.name for p in listed.items] == ["w-1"]
    assert int(listed.metadata.resource_version) >= int(listed.items[0].metadata.resource_version)
    got = core.read_namespaced_pod("w-0", NS)
    assert got.status.container_statuses[0].state.running is not None
    with pytest.raises(ApiException) as err:
        core.read_namespaced_pod("w-9", NS)
    assert err.value.status == 404 and 'pods "w-9" not found' in message(err.value)
    assert [p.metadata.name for p in core.list_pod_for_all_namespaces().items] == ["w-0", "w-1"]


def test_statefulsets_of_one_namespace_and_of_all(api: FakeApiServer) -> None:
    api.add_statefulset(NS, "run42-w", 2)
    api.add_statefulset("team-b", "solo-w", 1)
    with api_client(api) as c:
        apps = client.AppsV1Api(c)
        assert [s.metadata.name for s in apps.list_namespaced_stateful_set(NS).items] == ["run42-w"]
        every = apps.list_stateful_set_for_all_namespaces().items
    assert [(s.metadata.namespace, s.metadata.name) for s in every] == [
        (NS, "run42-w"), ("team-b", "solo-w")
    ]  # fmt: skip


def test_unchanged_pods_keep_their_resource_version(api: FakeApiServer) -> None:
    api.publish_pods(NS, [pod("w-0")])
    first = api.store.get("pods", NS, "w-0")
    api.publish_pods(NS, [pod("w-0")])
    assert api.store.get("pods", NS, "w-0") == first


def test_watch_streams_added_modified_deleted_in_order(
    api: FakeApiServer, core: client.CoreV1Api
) -> None:
    api.publish_pods(NS, [pod("w-0")])
    listed = core.list_namespaced_pod(NS)
    seen: list[tuple[str, str, str]] = []

    def changes() -> None:
        time.sleep(0.3)
        api.publish_pods(NS, [pod("w-0", running=False), pod("w-1")])
        api.publish_pods(NS, [pod("w-1")])

    threading.Thread(target=changes, daemon=True).start()
    w = watch.Watch()
    for ev in w.stream(
        core.list_namespaced_pod,
        NS,
        resource_version=listed.metadata.resource_version,
        timeout_seconds=5,
    ):
        seen.append(
            (ev["type"], ev["object"].metadata.name, ev["object"].metadata.resource_version)
        )
        if len(seen) == 3:
            w.stop()
    assert [(t, n) for t, n, _ in seen] == [
        ("MODIFIED", "w-0"),
        ("ADDED", "w-1"),
        ("DELETED", "w-0"),
    ]
    versions = [int(v) for _, _, v in seen]
    assert versions == sorted(versions) and len(set(versions)) == 3


def test_a_watch_without_a_version_starts_with_every_pod_added(
    api: FakeApiServer, core: client.CoreV1Api
) -> None:
    api.publish_pods(NS, [pod("w-0"), pod("w-1")])
    w = watch.Watch()
    names = [
        e["object"].metadata.name for e in w.stream(core.list_namespaced_pod, NS, timeout_seconds=1)
    ]
    assert names == ["w-0", "w-1"]


def test_events_create_list_by_field_and_watch(api: FakeApiServer, core: client.CoreV1Api) -> None:
    body = {
        "metadata": {"generateName": "w-0."},
        "involvedObject": {"kind": "Pod", "name": "w-0", "namespace": NS, "uid": "uid-w-0"},
        "reason": "Reformed",
        "message": "re-formed at world size 2 after 5.6 s",
        "type": "Normal",
        "source": {"component": "elastic-worker"},
    }
    created = core.create_namespaced_event(NS, body)
    assert created.metadata.name.startswith("w-0.") and created.metadata.uid
    other = dict(body, involvedObject={"kind": "Pod", "name": "w-1", "namespace": NS})
    core.create_namespaced_event(NS, other)
    found = core.list_namespaced_event(NS, field_selector="involvedObject.name=w-0")
    assert [e.reason for e in found.items] == ["Reformed"]
    with pytest.raises(ApiException) as err:
        core.create_namespaced_event(NS, {"metadata": {"name": "x"}, "reason": "R"})
    assert err.value.status == 422 and "involvedObject" in message(err.value)
    with pytest.raises(ApiException) as err:
        core.create_namespaced_event(NS, dict(body, metadata={"name": created.metadata.name}))
    assert err.value.status == 409


def test_a_403_on_events_names_the_verb_and_resource(
    api: FakeApiServer, core: client.CoreV1Api
) -> None:
    api.set_fault(r"/events$", 403, method="POST")
    with pytest.raises(ApiException) as err:
        core.create_namespaced_event(
            NS, {"metadata": {"name": "e"}, "involvedObject": {"kind": "Pod", "name": "w-0"}}
        )
    assert err.value.status == 403
    assert 'cannot create resource "events" in API group "" in the namespace "ml"' in message(
        err.value
    )


def write_runs(path: Path, runs: list[tuple[int, int, str]]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("a") as fh:
        for inc, restarts, text in runs:
            fh.write(podlogs.start_line("worker", inc, restarts, "10:00:00") + text)


def test_logs_current_previous_tail_and_a_new_incarnation(
    api: FakeApiServer, core: client.CoreV1Api, tmp_path: Path
) -> None:
    log = tmp_path / "logs" / "w-0" / "worker.log"
    incarnation = {"w-0": 1}
    api.log_source = lambda ns, name, c: (log, incarnation[name]) if name in incarnation else None
    api.publish_pods(NS, [pod("w-0")])
    write_runs(log, [(1, 0, "first\n"), (1, 1, "second a\nsecond b\n")])
    assert core.read_namespaced_pod_log("w-0", NS) == "second a\nsecond b\n"
    assert core.read_namespaced_pod_log("w-0", NS, previous=True) == "first\n"
    assert core.read_namespaced_pod_log("w-0", NS, tail_lines=1) == "second b\n"
    assert core.read_namespaced_pod_log("w-0", NS, container="worker") == "second a\nsecond b\n"
    with pytest.raises(ApiException) as err:
        core.read_namespaced_pod_log("w-0", NS, container="nope")
    assert err.value.status == 400 and 'container "nope" in pod "w-0" is not valid' in message(
        err.value
    )
    # The pod deleted and made again: a new pod, whose previous run is not the old pod's.
    incarnation["w-0"] = 2
    write_runs(log, [(2, 0, "new pod\n")])
    assert core.read_namespaced_pod_log("w-0", NS) == "new pod\n"
    with pytest.raises(ApiException) as err:
        core.read_namespaced_pod_log("w-0", NS, previous=True)
    assert err.value.status == 400 and "previous terminated container" in message(err.value)


def test_log_follow_streams_until_the_container_stops(
    api: FakeApiServer, core: client.CoreV1Api, tmp_path: Path
) -> None:
    log = tmp_path / "w-0.log"
    api.log_source = lambda ns, name, c: (log, 1)
    api.publish_pods(NS, [pod("w-0")])
    write_runs(log, [(1, 0, "line 1\n")])

    def later() -> None:
        time.sleep(0.5)
        with log.open("a") as fh:
            fh.write("line 2\n")
        time.sleep(0.5)
        with log.open("a") as fh:
            fh.write("line 3\n")
        api.publish_pods(NS, [pod("w-0", running=False)])

    threading.Thread(target=later, daemon=True).start()
    started = time.monotonic()
    resp = core.read_namespaced_pod_log("w-0", NS, follow=True, _preload_content=False)
    text = b"".join(resp.stream(64)).decode()
    assert text == "line 1\nline 2\nline 3\n"
    assert time.monotonic() - started >= 0.9  # it followed, then ended with the container


class _Metrics(http.server.BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        body = b"elastic_job_world_size_nodes 3\n" if self.path == "/metrics" else b"no"
        self.send_response(200 if self.path == "/metrics" else 404)
        self.send_header("Content-Type", "text/plain; version=0.0.4")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: object) -> None:
        pass


def test_pod_proxy_reaches_the_named_port(api: FakeApiServer, core: client.CoreV1Api) -> None:
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Metrics)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        p = pod("w-0")
        p["spec"]["containers"][0]["ports"][0]["containerPort"] = server.server_address[1]
        api.publish_pods(NS, [p])
        text = core.connect_get_namespaced_pod_proxy_with_path("w-0:metrics", NS, "metrics")
        assert "elastic_job_world_size_nodes 3" in text
        port = server.server_address[1]
        text = core.connect_get_namespaced_pod_proxy_with_path(f"w-0:{port}", NS, "metrics")
        assert "elastic_job_world_size_nodes 3" in text
    finally:
        server.shutdown()
        server.server_close()
    with pytest.raises(ApiException) as err:  # nothing listens any more
        core.connect_get_namespaced_pod_proxy_with_path("w-0:metrics", NS, "metrics")
    assert err.value.status == 503 and "error trying to reach service" in message(err.value)


def test_node_watch_sees_a_node_removed(tmp_path: Path) -> None:
    from localrun.cluster.nodes import load_nodes  # noqa: PLC0415

    with FakeApiServer(load_nodes("local"), workdir=tmp_path) as api, api_client(api) as c:
        core = client.CoreV1Api(c)
        rv = core.list_node().metadata.resource_version
        threading.Timer(0.3, api.remove_node, ["local-spot-1"]).start()
        w = watch.Watch()
        for ev in w.stream(core.list_node, resource_version=rv, timeout_seconds=5):
            assert (ev["type"], ev["object"].metadata.name) == ("DELETED", "local-spot-1")
            w.stop()
        assert "local-spot-1" not in [n.metadata.name for n in core.list_node().items]


def test_label_selectors() -> None:
    labels = {"a": "1", "b": "2"}
    assert label_matches("a=1,b==2", labels)
    assert label_matches("a in (1,3),c notin (x)", labels)
    assert not label_matches("a!=1", labels)
    assert label_matches("a,!c", labels) and not label_matches("c", labels)
    with pytest.raises(SelectorError):
        label_matches("a b", labels)


# -- the pod objects of the lifecycle ------------------------------------------------------


def test_lifecycle_pods_become_real_pod_objects(tmp_path: Path) -> None:
    h = Harness(tmp_path, statefulset(replicas=1, grace=5))
    h.tick(0)
    w0 = h.pod("w-0")
    obj = pod_object(w0, "sts-uid", "198.18.0.10")
    assert obj["status"]["phase"] == "Pending"
    assert obj["status"]["containerStatuses"][0]["state"]["waiting"]["reason"] == "PodInitializing"
    h.runtime.running("w-0", "init").rc = 0
    h.tick(0)
    obj = pod_object(w0, "sts-uid", "198.18.0.10")
    assert obj["status"]["phase"] == "Running" and obj["spec"]["nodeName"] == w0.node
    assert obj["metadata"]["ownerReferences"][0]["uid"] == "sts-uid"
    assert obj["metadata"]["labels"]["statefulset.kubernetes.io/pod-name"] == "w-0"
    ready = {c["type"]: c["status"] for c in obj["status"]["conditions"]}
    assert ready["Ready"] == "True" and "DisruptionTarget" not in ready
    assert obj["status"]["hostIP"] == "198.18.0.10" and obj["status"]["podIP"] == w0.ip
    h.runtime.running("w-0", "main").rc = 137  # SIGKILLed
    h.tick(1)
    status = pod_object(w0, "u")["status"]["containerStatuses"][0]
    assert status["state"]["waiting"]["reason"] == "CrashLoopBackOff"
    assert status["lastState"]["terminated"]["exitCode"] == 137
    h.tick(20)
    status = pod_object(w0, "u")["status"]["containerStatuses"][0]
    assert status["restartCount"] == 1 and "running" in status["state"]
    h.runtime.running("w-0", "main").exit_on_term = None
    h.cluster.delete(w0, 21)
    obj = pod_object(w0, "u")
    conditions = {c["type"]: c for c in obj["status"]["conditions"]}
    assert conditions["DisruptionTarget"]["reason"] == "TerminationByKubelet"
    assert conditions["Ready"]["status"] == "False" and obj["metadata"]["deletionTimestamp"]
    # the client reads it as a V1Pod
    assert client.ApiClient()._ApiClient__deserialize(obj, "V1Pod").metadata.name == "w-0"


def test_an_eviction_reaches_the_cluster(api: FakeApiServer, core: client.CoreV1Api) -> None:
    evicted: list[tuple[str, str]] = []
    api.on_evict = lambda ns, name: evicted.append((ns, name))
    api.publish_pods(NS, [pod("w-0")])
    body = {"metadata": {"name": "w-0", "namespace": NS}}
    core.create_namespaced_pod_eviction("w-0", NS, body)
    assert evicted == [(NS, "w-0")]
    with pytest.raises(ApiException) as err:
        core.create_namespaced_pod_eviction("w-9", NS, {"metadata": {"name": "w-9"}})
    assert err.value.status == 404 and evicted == [(NS, "w-0")]


def test_a_delete_checks_its_preconditions_and_reaches_the_cluster(
    api: FakeApiServer, core: client.CoreV1Api
) -> None:
    deleted: list[tuple[str, str, int | None, str]] = []
    api.on_delete = lambda ns, name, grace, uid: deleted.append((ns, name, grace, uid))
    api.publish_pods(NS, [pod("w-0")])
    version = core.read_namespaced_pod("w-0", NS).metadata.resource_version
    stale = client.V1DeleteOptions(
        grace_period_seconds=0, preconditions=client.V1Preconditions(uid="uid-of-another")
    )
    with pytest.raises(ApiException) as err:
        core.delete_namespaced_pod("w-0", NS, body=stale)
    assert err.value.status == 409 and message(err.value) == (
        'Operation cannot be fulfilled on pods "w-0": Precondition failed: UID in '
        "precondition: uid-of-another, UID in object meta: uid-w-0"
    )
    moved = client.V1DeleteOptions(
        grace_period_seconds=0,
        preconditions=client.V1Preconditions(uid="uid-w-0", resource_version="1"),
    )
    with pytest.raises(ApiException) as err:
        core.delete_namespaced_pod("w-0", NS, body=moved)
    assert err.value.status == 409 and "ResourceVersion in precondition: 1" in message(err.value)
    assert deleted == []
    exact = client.V1DeleteOptions(
        grace_period_seconds=0,
        preconditions=client.V1Preconditions(uid="uid-w-0", resource_version=version),
    )
    core.delete_namespaced_pod("w-0", NS, body=exact)
    assert deleted == [(NS, "w-0", 0, "uid-w-0")]
    answer = core.delete_namespaced_pod("w-0", NS, grace_period_seconds=30)
    assert answer.metadata.deletion_grace_period_seconds == 30
    assert deleted[-1] == (NS, "w-0", 30, "uid-w-0")
    with pytest.raises(ApiException) as err:
        core.delete_namespaced_pod("w-9", NS)
    assert err.value.status == 404


def test_the_clusters_events_for_a_pod_made_placed_deleted_and_made_again(tmp_path: Path) -> None:
    from localrun.cluster.podobject import lifecycle_events  # noqa: PLC0415

    h = Harness(tmp_path, statefulset(replicas=1, grace=5))
    h.tick(0)
    w0 = h.pod("w-0")
    first = [pod_object(w0, "sts-uid")]
    said = lifecycle_events({}, first)
    assert [(e["involvedObject"]["kind"], e["reason"]) for e in said] == [
        ("StatefulSet", "SuccessfulCreate"),
        ("Pod", "Scheduled"),
    ]
    assert said[1]["message"] == f"Successfully assigned ns/w-0 to {w0.node}"
    before = {"w-0": first[0]}
    assert lifecycle_events(before, [pod_object(w0, "sts-uid")]) == []  # nothing new
    h.cluster.delete(w0, 1)
    deleting = [pod_object(w0, "sts-uid")]
    assert [e["reason"] for e in lifecycle_events(before, deleting)] == ["Killing"]
    h.tick(7)
    h.tick(8)
    again = [pod_object(h.pod("w-0"), "sts-uid")]
    reasons = [e["reason"] for e in lifecycle_events({"w-0": deleting[0]}, again)]
    assert reasons[0] == "SuccessfulCreate" and "Killing" not in reasons
