"""charts/etcd-rendezvous templates/statefulset.yaml: one etcd 3.5 member, v2 API on (off,
and 3.6 allowed, with global.rendezvousBackend=etcd-v3), flags in `command` that Debian's
etcd 3.4 also starts with (run here for real)."""

from __future__ import annotations

import base64
import json
import re
import subprocess
import time
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Any

import pytest
from chart_render import ELASTIC_JOB, ETCD, NAMESPACE, RELEASE, container, objects, one, pod_spec
from testlib import ETCD_VERSIONS, etcd_binary, free_port

NAME = f"{RELEASE}-etcd-rendezvous"


def _sts(chart: Path = ETCD, **kwargs: Any) -> dict[str, Any]:
    return one(objects(chart, **kwargs), "StatefulSet", NAME)


def _flags(sts: dict[str, Any]) -> dict[str, str]:
    command = container(sts, "etcd")["command"]
    return dict(arg[2:].split("=", 1) for arg in command[1:])


def test_same_objects_alone_and_as_a_dependency() -> None:
    """Installed alone or as elastic-job's dependency: the same etcd StatefulSet, Services,
    PDB and NetworkPolicy (full name `<release>-etcd-rendezvous`)."""
    alone = {(o["kind"], o["metadata"]["name"]): o for o in objects(ETCD)}
    within = {
        (o["kind"], o["metadata"]["name"]): o
        for o in objects(ELASTIC_JOB)
        if o["metadata"]["labels"].get("app.kubernetes.io/component") == "rendezvous"
    }
    assert alone == within
    assert set(alone) == {
        ("StatefulSet", NAME),
        ("Service", NAME),
        ("Service", f"{NAME}-headless"),
        ("PodDisruptionBudget", NAME),
        ("NetworkPolicy", NAME),
    }


def test_one_replica_container_etcd_flags_in_command_only() -> None:
    """replicas 1, container `etcd`, every flag in `command`, no `args`."""
    sts = _sts()
    assert sts["spec"]["replicas"] == 1
    etcd = container(sts, "etcd")
    assert etcd["command"][0] == "etcd"
    assert all(arg.startswith("--") for arg in etcd["command"][1:])
    assert "args" not in etcd


def test_image_is_pinned_to_etcd_3_5() -> None:
    """image.repository:image.tag, a 3.5 release >= 3.5.11, IfNotPresent."""
    etcd = container(_sts(), "etcd")
    repo, tag = etcd["image"].rsplit(":", 1)
    assert repo in ("gcr.io/etcd-development/etcd", "quay.io/coreos/etcd")
    major, minor, patch = (int(x) for x in tag.lstrip("v").split("."))
    assert (major, minor) == (3, 5) and patch >= 11
    assert etcd["imagePullPolicy"] == "IfNotPresent"


def test_a_digest_may_follow_the_tag() -> None:
    """image.tag `v3.5.21@sha256:...` is accepted (pinned by digest)."""
    digest = "v3.5.21@sha256:" + "a" * 64
    assert container(_sts(sets=[f"image.tag={digest}"]), "etcd")["image"].endswith(digest)


def test_v2_api_and_member_flags_are_consistent() -> None:
    """--enable-v2=true; --name is the pod name and the one --initial-cluster member, whose
    peer URL is --initial-advertise-peer-urls; clients advertised at the Service FQDN."""
    flags = _flags(_sts())
    assert flags["enable-v2"] == "true"
    assert flags["name"] == f"{NAME}-0"
    assert flags["initial-cluster"] == f"{flags['name']}={flags['initial-advertise-peer-urls']}"
    assert flags["initial-cluster-state"] == "new"
    assert flags["advertise-client-urls"] == f"http://{NAME}.{NAMESPACE}.svc.cluster.local:2379"
    assert flags["listen-client-urls"] == "http://0.0.0.0:2379"
    assert flags["listen-metrics-urls"] == "http://0.0.0.0:2381"
    assert flags["data-dir"].startswith("/var/lib/etcd/")


V3 = "global.rendezvousBackend=etcd-v3"


LEASE = "global.rendezvousBackend=etcd-lease"


@pytest.mark.parametrize("backend", [V3, LEASE], ids=["etcd-v3", "etcd-lease"])
def test_v3_backends_leave_the_v2_api_off(backend: str) -> None:
    """global.rendezvousBackend=etcd-v3 or etcd-lease: no --enable-v2 flag (off by default
    since 3.4, gone in 3.6), alone and as elastic-job's dependency (the parent's global)."""
    for chart in (ETCD, ELASTIC_JOB):
        flags = _flags(_sts(chart, sets=[backend]))
        assert "enable-v2" not in flags, chart.name
        assert flags["name"] == f"{NAME}-0"


@pytest.mark.parametrize("backend", [V3, LEASE], ids=["etcd-v3", "etcd-lease"])
def test_v3_backends_accept_etcd_3_6(backend: str) -> None:
    """global.rendezvousBackend=etcd-v3 or etcd-lease: image.tag v3.6.x renders (3.6 has no
    v2 API, and these backends need none); 3.5 still does."""
    for tag in ("v3.6.0", "v3.6.5", "v3.5.21"):
        for chart, key in ((ETCD, "image.tag"), (ELASTIC_JOB, "etcd-rendezvous.image.tag")):
            etcd = container(_sts(chart, sets=[backend, f"{key}={tag}"]), "etcd")
            assert etcd["image"] == f"gcr.io/etcd-development/etcd:{tag}"


def test_probes_use_livez_and_readyz_on_the_metrics_port() -> None:
    """Liveness /livez and readiness /readyz on port `metrics` (2381, plain HTTP)."""
    etcd = container(_sts(), "etcd")
    ports = {p["name"]: p["containerPort"] for p in etcd["ports"]}
    assert ports == {"client": 2379, "peer": 2380, "metrics": 2381}
    assert etcd["livenessProbe"]["httpGet"] == {"path": "/livez", "port": "metrics"}
    assert etcd["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": "metrics"}
    assert "scheme" not in etcd["readinessProbe"]["httpGet"]


def test_tls_serves_https_clients_and_keeps_probes_on_plain_metrics() -> None:
    """tls.enabled: https client URLs and cert flags; probes unchanged on 2381."""
    sts = _sts(sets=["tls.enabled=true", "tls.existingSecret=etcd-tls", "tls.clientCertAuth=true"])
    flags = _flags(sts)
    assert flags["listen-client-urls"].startswith("https://")
    assert flags["advertise-client-urls"].startswith("https://")
    assert flags["cert-file"] == "/etc/etcd/tls/tls.crt"
    assert flags["client-cert-auth"] == "true"
    assert flags["listen-metrics-urls"] == "http://0.0.0.0:2381"
    assert container(sts, "etcd")["readinessProbe"]["httpGet"]["port"] == "metrics"
    volumes = {v["name"]: v for v in pod_spec(sts)["volumes"]}
    assert volumes["tls"]["secret"]["secretName"] == "etcd-tls"


def test_data_volume_is_an_empty_dir_by_default() -> None:
    """persistence.enabled=false: volume `data` (emptyDir) at /var/lib/etcd."""
    sts = _sts()
    mounts = {m["name"]: m["mountPath"] for m in container(sts, "etcd")["volumeMounts"]}
    assert mounts["data"] == "/var/lib/etcd"
    volumes = {v["name"]: v for v in pod_spec(sts)["volumes"]}
    assert "emptyDir" in volumes["data"]
    assert "volumeClaimTemplates" not in sts["spec"]


def test_persistence_uses_a_claim_template() -> None:
    """persistence.enabled: a `data` volumeClaimTemplate (size, storage class)."""
    sts = _sts(
        sets=["persistence.enabled=true", "persistence.size=2Gi", "persistence.storageClass=ssd"]
    )
    (claim,) = sts["spec"]["volumeClaimTemplates"]
    assert claim["metadata"]["name"] == "data"
    assert claim["spec"]["resources"]["requests"]["storage"] == "2Gi"
    assert claim["spec"]["storageClassName"] == "ssd"
    assert "data" not in {v["name"] for v in pod_spec(sts).get("volumes", [])}


def test_persistence_claim_is_deleted_on_uninstall_unless_retained() -> None:
    """persistence.retainOnUninstall: a reinstall must not inherit the old job's etcd state
    (its completion marker would end the new job at once), so the claim goes by default."""
    sts = _sts(sets=["persistence.enabled=true"])
    assert sts["spec"]["persistentVolumeClaimRetentionPolicy"] == {
        "whenDeleted": "Delete",
        "whenScaled": "Retain",
    }
    kept = _sts(sets=["persistence.enabled=true", "persistence.retainOnUninstall=true"])
    assert kept["spec"]["persistentVolumeClaimRetentionPolicy"]["whenDeleted"] == "Retain"
    assert "persistentVolumeClaimRetentionPolicy" not in _sts()["spec"]


def test_pod_security_restricted_and_no_token() -> None:
    """PSS restricted, read-only root filesystem, automountServiceAccountToken false."""
    sts = _sts()
    spec = pod_spec(sts)
    assert spec["automountServiceAccountToken"] is False
    assert spec["securityContext"]["runAsNonRoot"] is True
    assert spec["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
    ctx = container(sts, "etcd")["securityContext"]
    assert ctx["allowPrivilegeEscalation"] is False
    assert ctx["readOnlyRootFilesystem"] is True
    assert ctx["capabilities"] == {"drop": ["ALL"]}


def test_placed_off_gpu_nodes_by_default() -> None:
    """placement.avoidGpuNodes: required node affinity, each GPU label DoesNotExist."""
    spec = pod_spec(_sts())
    (term,) = spec["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"][
        "nodeSelectorTerms"
    ]
    keys = {e["key"] for e in term["matchExpressions"] if e["operator"] == "DoesNotExist"}
    assert "nvidia.com/gpu.present" in keys


def test_affinity_replaces_the_gpu_avoidance() -> None:
    """`affinity` set: used as given; placement.avoidGpuNodes=false: no affinity."""
    spec = pod_spec(_sts(extra=["--set-json", 'affinity={"podAffinity":{}}']))
    assert spec["affinity"] == {"podAffinity": {}}
    assert "affinity" not in pod_spec(_sts(sets=["placement.avoidGpuNodes=false"]))


def test_requests_set_and_limits_left_to_the_user() -> None:
    """resources: requests by default, no limits."""
    resources = container(_sts(), "etcd")["resources"]
    assert set(resources) == {"requests"}


def test_selector_holds_only_name_instance_component() -> None:
    """No version or chart label in the selector."""
    assert _sts()["spec"]["selector"]["matchLabels"] == {
        "app.kubernetes.io/name": "etcd-rendezvous",
        "app.kubernetes.io/instance": RELEASE,
        "app.kubernetes.io/component": "rendezvous",
    }


def test_fullname_override_and_long_release_names() -> None:
    """fullnameOverride names everything; long names are cut (StatefulSet to 52)."""
    objs = objects(ETCD, sets=["fullnameOverride=rdzv"])
    assert one(objs, "StatefulSet")["metadata"]["name"] == "rdzv"
    assert _flags(one(objs, "StatefulSet"))["name"] == "rdzv-0"
    long = objects(ETCD, release="r" * 53)
    sts = one(long, "StatefulSet")
    assert len(sts["metadata"]["name"]) <= 52
    for obj in long:
        assert len(obj["metadata"]["name"]) <= 63


# --- a real etcd (Debian's 3.4 here) started from the rendered command ---------------------


def _wait(url: str, deadline: float) -> bytes:
    last: Exception | None = None
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(url, timeout=1) as resp:
                return resp.read()
        except (OSError, urllib.error.URLError) as exc:
            last = exc
            time.sleep(0.2)
    raise AssertionError(f"{url} did not answer: {last}")


def _start_rendered(
    tmp_path: Path, sets: list[str], version: str = "3.4"
) -> tuple[subprocess.Popen[bytes], str, str]:
    """Start an installed etcd with the rendered flags (ports and data dir moved)."""
    etcd = etcd_binary(version)
    command = container(_sts(sets=sets), "etcd")["command"]
    client, peer, metrics = free_port(), free_port(), free_port()
    replaced = []
    for flag in command[1:]:
        moved = flag.replace("/var/lib/etcd", str(tmp_path))
        moved = re.sub(r"0\.0\.0\.0:2379", f"127.0.0.1:{client}", moved)
        moved = re.sub(r"0\.0\.0\.0:2381", f"127.0.0.1:{metrics}", moved)
        moved = re.sub(r"127\.0\.0\.1:2380", f"127.0.0.1:{peer}", moved)
        replaced.append(moved)
    with (tmp_path / "etcd.log").open("wb") as log:
        proc = subprocess.Popen([etcd, *replaced], stdout=log, stderr=subprocess.STDOUT)
    return proc, f"http://127.0.0.1:{client}", f"http://127.0.0.1:{metrics}"


def _stop(proc: subprocess.Popen[bytes]) -> None:
    proc.terminate()
    try:
        proc.wait(10)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(10)


@pytest.mark.parametrize("version", ETCD_VERSIONS)
def test_rendered_command_starts_etcd_with_the_v2_api(tmp_path: Path, version: str) -> None:
    """The rendered flags (ports and data dir moved to free ones) start etcd 3.4 (what the
    local run uses) and 3.5 (what the image runs), which then serve the v2 keys API and
    health on the metrics listener."""
    proc, base, metrics = _start_rendered(tmp_path, [], version)
    try:
        deadline = time.monotonic() + 30
        assert json.loads(_wait(f"{base}/v2/keys/", deadline))["node"]["dir"] is True
        body = urllib.parse.urlencode({"value": "ok"}).encode()
        request = urllib.request.Request(f"{base}/v2/keys/elastic-job/probe", body, method="PUT")
        with urllib.request.urlopen(request, timeout=5) as resp:
            assert json.load(resp)["node"]["value"] == "ok"
        health = json.loads(_wait(f"{metrics}/health", deadline))
        assert health["health"] == "true"
        assert proc.poll() is None
    finally:
        _stop(proc)


@pytest.mark.parametrize("version", ETCD_VERSIONS)
def test_rendered_etcd_v3_command_serves_v3_and_no_v2_api(tmp_path: Path, version: str) -> None:
    """global.rendezvousBackend=etcd-v3: the rendered flags start etcd 3.4 and 3.5, which
    answer the v3 API (a put and a range through the JSON gateway) and 404 /v2/keys/."""
    proc, base, metrics = _start_rendered(tmp_path, [V3], version)
    try:
        deadline = time.monotonic() + 30
        assert json.loads(_wait(f"{metrics}/health", deadline))["health"] == "true"
        key = base64.b64encode(b"/elastic-job/probe").decode()
        put = urllib.request.Request(
            f"{base}/v3/kv/put",
            json.dumps({"key": key, "value": base64.b64encode(b"ok").decode()}).encode(),
        )
        with urllib.request.urlopen(put, timeout=5):
            pass
        get = urllib.request.Request(f"{base}/v3/kv/range", json.dumps({"key": key}).encode())
        with urllib.request.urlopen(get, timeout=5) as resp:
            assert base64.b64decode(json.load(resp)["kvs"][0]["value"]) == b"ok"
        with pytest.raises(urllib.error.HTTPError) as err:
            urllib.request.urlopen(f"{base}/v2/keys/", timeout=5)
        assert err.value.code == 404
        assert proc.poll() is None
    finally:
        _stop(proc)
