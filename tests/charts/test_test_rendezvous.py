"""templates/tests/test-rendezvous.yaml: the `helm test` pod that checks the rendezvous
answers on the etcd API its backend needs (v2 for etcd-v2, v3 for etcd-v3). Its script is
run here against a real etcd."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from chart_render import ELASTIC_JOB, RELEASE, etcd_statefulset, objects, of_kind, one, selects
from testlib import free_port

TEST_POD = f"{RELEASE}-elastic-job-test-rendezvous"


def _pod(**kwargs: Any) -> dict[str, Any]:
    return one(objects(ELASTIC_JOB, **kwargs), "Pod", TEST_POD)


def test_is_a_helm_test_hook() -> None:
    """helm.sh/hook: test, deleted before re-creation and on success."""
    annotations = _pod()["metadata"]["annotations"]
    assert annotations["helm.sh/hook"] == "test"
    assert annotations["helm.sh/hook-delete-policy"] == "before-hook-creation,hook-succeeded"


def test_checks_the_v2_keys_endpoint_of_the_workers_rendezvous() -> None:
    """It reads ELASTIC_RDZV_ENDPOINT (the workers' value) and GETs /v2/keys/."""
    objs = objects(ELASTIC_JOB)
    pod = one(objs, "Pod", TEST_POD)
    ctr = pod["spec"]["containers"][0]
    worker = next(
        s for s in of_kind(objs, "StatefulSet") if s["metadata"]["name"].endswith("default")
    )
    worker_env = {
        e["name"]: e.get("value")
        for e in worker["spec"]["template"]["spec"]["containers"][0]["env"]
    }
    env = {e["name"]: e["value"] for e in ctr["env"]}
    assert env["ELASTIC_RDZV_ENDPOINT"] == worker_env["ELASTIC_RDZV_ENDPOINT"]
    assert "/v2/keys/" in ctr["command"][-1]
    assert pod["spec"]["restartPolicy"] == "Never"


def test_pod_security_restricted() -> None:
    """PSS restricted: non-root, seccomp, no escalation, drop ALL, read-only root, no token."""
    pod = _pod()
    assert pod["spec"]["automountServiceAccountToken"] is False
    assert pod["spec"]["securityContext"]["runAsNonRoot"] is True
    assert pod["spec"]["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
    ctx = pod["spec"]["containers"][0]["securityContext"]
    assert ctx["allowPrivilegeEscalation"] is False
    assert ctx["readOnlyRootFilesystem"] is True
    assert ctx["capabilities"] == {"drop": ["ALL"]}


def test_is_admitted_by_the_etcd_network_policy() -> None:
    """The test pod carries the client label the etcd NetworkPolicy admits."""
    objs = objects(ELASTIC_JOB)
    policy = one(objs, "NetworkPolicy", f"{RELEASE}-etcd-rendezvous")
    peer = policy["spec"]["ingress"][0]["from"][0]["podSelector"]["matchLabels"]
    assert selects(peer, one(objs, "Pod", TEST_POD)["metadata"]["labels"])
    assert etcd_statefulset(objs)


def test_network_policy_isolates_the_test_pod_before_it_starts() -> None:
    """networkPolicy.enabled: a test hook NetworkPolicy selects the test pod alone, admits
    no ingress (the pod serves nothing), leaves egress open (DNS, the rendezvous), and is
    created before the pod (lower hook weight)."""
    objs = objects(ELASTIC_JOB)
    policy = one(objs, "NetworkPolicy", TEST_POD)
    annotations = policy["metadata"]["annotations"]
    assert annotations["helm.sh/hook"] == "test"
    assert annotations["helm.sh/hook-delete-policy"] == "before-hook-creation,hook-succeeded"
    pod_weight = int(_pod()["metadata"]["annotations"].get("helm.sh/hook-weight", "0"))
    assert int(annotations["helm.sh/hook-weight"]) < pod_weight
    assert policy["spec"]["policyTypes"] == ["Ingress"]
    assert not policy["spec"].get("ingress")
    selector = policy["spec"]["podSelector"]["matchLabels"]
    selected = [
        o["metadata"]["name"]
        for o in objs
        if o["kind"] in ("Pod", "StatefulSet")
        and selects(
            selector,
            (o if o["kind"] == "Pod" else o["spec"]["template"])["metadata"]["labels"],
        )
    ]
    assert selected == [TEST_POD]


def test_no_test_network_policy_without_network_policies_or_tests() -> None:
    """networkPolicy.enabled=false or tests.enabled=false: no test NetworkPolicy."""
    for sets in (["networkPolicy.enabled=false"], ["tests.enabled=false"]):
        names = [
            p["metadata"]["name"] for p in of_kind(objects(ELASTIC_JOB, sets=sets), "NetworkPolicy")
        ]
        assert TEST_POD not in names, sets


def test_image_defaults_to_the_worker_image() -> None:
    """tests.image empty: the worker image (it has python3); overridable."""
    assert _pod()["spec"]["containers"][0]["image"] == "ghcr.io/elastic-job/worker:0.1.0"
    pod = _pod(sets=["tests.image.repository=reg.example/py", "tests.image.tag=3.12"])
    assert pod["spec"]["containers"][0]["image"] == "reg.example/py:3.12"


def test_disabled_renders_no_test_pod() -> None:
    """tests.enabled=false: no test pod."""
    assert not of_kind(objects(ELASTIC_JOB, sets=["tests.enabled=false"]), "Pod")


V3 = ["global.rendezvousBackend=etcd-v3"]


LEASE = ["global.rendezvousBackend=etcd-lease"]


def test_tells_the_script_the_backend_the_workers_use() -> None:
    """global.rendezvousBackend reaches the test pod as the workers' ELASTIC_RDZV_BACKEND."""
    for sets, backend in (([], "etcd-v2"), (V3, "etcd-v3"), (LEASE, "etcd-lease")):
        env = {e["name"]: e["value"] for e in _pod(sets=sets)["spec"]["containers"][0]["env"]}
        assert env["ELASTIC_RDZV_BACKEND"] == backend


def _run_script(endpoint: str, sets: list[str] | None = None) -> subprocess.CompletedProcess[str]:
    ctr = _pod(sets=sets or [])["spec"]["containers"][0]
    script = ctr["command"]
    assert script[:2] == ["python3", "-c"]
    pod_env = {e["name"]: e["value"] for e in ctr["env"]}
    env = {**os.environ, **pod_env, "ELASTIC_RDZV_ENDPOINT": endpoint}
    return subprocess.run(
        [sys.executable, "-c", script[2]],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def test_script_passes_against_etcd_with_the_v2_api(etcd_factory: Callable[..., Any]) -> None:
    """Against a real etcd with --enable-v2=true the check prints OK and exits 0."""
    server = etcd_factory(v2=True)
    proc = _run_script(server.endpoint)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith("OK ")


def test_script_fails_against_etcd_without_the_v2_api(etcd_factory: Callable[..., Any]) -> None:
    """Against a real etcd with the v2 API off (as 3.6 is) it fails, says so and names
    the backend that would work."""
    server = etcd_factory(v2=False)
    proc = _run_script(server.endpoint)
    assert proc.returncode != 0
    assert "v2 API" in proc.stderr
    assert "global.rendezvousBackend=etcd-v3" in proc.stderr


def test_etcd_v3_script_passes_against_etcd_without_the_v2_api(
    etcd_factory: Callable[..., Any],
) -> None:
    """global.rendezvousBackend=etcd-v3: against a real etcd with the v2 API off the check
    reads etcd's status through the v3 API, prints OK with its version and exits 0."""
    server = etcd_factory(v2=False)
    proc = _run_script(server.endpoint, V3)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith("OK ") and "v3 API" in proc.stdout


def test_etcd_v3_script_fails_when_nothing_answers_v3() -> None:
    """etcd-v3 against an endpoint where no etcd listens: non-zero, naming the v3 need."""
    proc = _run_script(f"127.0.0.1:{free_port()}", V3)
    assert proc.returncode != 0
    assert "etcd-v3 needs etcd 3.5 or 3.6" in proc.stderr


def test_etcd_lease_script_passes_where_a_lease_is_granted_renewed_and_revoked(
    etcd_factory: Callable[..., Any],
) -> None:
    """global.rendezvousBackend=etcd-lease: against a real etcd with the v2 API off the check
    reads etcd's status, then grants a lease, renews and revokes it (every node's membership
    lives under one), prints OK for both and exits 0."""
    server = etcd_factory(v2=False)
    proc = _run_script(server.endpoint, LEASE)
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert "v3 API" in lines[0] and "a lease is granted, renewed and revoked" in lines[1]


def test_etcd_lease_script_fails_when_nothing_answers_v3() -> None:
    """etcd-lease against an endpoint where no etcd listens: non-zero, naming the backend."""
    proc = _run_script(f"127.0.0.1:{free_port()}", LEASE)
    assert proc.returncode != 0
    assert "etcd-lease needs etcd 3.5 or 3.6" in proc.stderr


def test_secret_files_are_readable_by_the_pods_user() -> None:
    """Every Secret volume of the rendezvous TLS is readable: mode 0440 only with an
    fsGroup the container's user belongs to (here and in the workers and etcd)."""
    objs = objects(ELASTIC_JOB, values=[Path(__file__).parent / "values" / "tls-cert-manager.yaml"])
    for obj in objs:
        if obj["kind"] not in ("Pod", "StatefulSet"):
            continue
        spec = obj["spec"] if obj["kind"] == "Pod" else obj["spec"]["template"]["spec"]
        for volume in spec.get("volumes", []):
            mode = volume.get("secret", {}).get("defaultMode", 0o644)
            if mode & 0o004 == 0:
                assert spec["securityContext"].get("fsGroup"), obj["metadata"]["name"]
