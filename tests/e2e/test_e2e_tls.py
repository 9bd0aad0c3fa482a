"""The chart's TLS configurations, run end to end (issue 9.2): etcd serves https only, with
the Secrets the local run's cert-manager issues from the rendered Certificates, and the
workers train through a lost node over it."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from localrun_e2e import (
    ETCD_POD,
    LocalRun,
    assert_cleaned_up,
    assert_nothing_lost,
    pod,
    reform,
    root_with_namespaces,
    run_local,
)
from testlib import EXISTING_SECRETS_TLS, MUTUAL_TLS, SERVER_TLS

pytestmark = [
    pytest.mark.netns,
    pytest.mark.skipif(bool(root_with_namespaces()), reason=root_with_namespaces() or "ok"),
]


def _etcd_log(run: LocalRun) -> list[dict[str, object]]:
    out = []
    for line in run.log(ETCD_POD, "etcd").splitlines():
        if line.startswith("{"):
            out.append(json.loads(line))
    return out


def assert_https_only(run: LocalRun, client_auth: bool) -> None:
    log = _etcd_log(run)
    listen = [str(u) for e in log for u in e.get("listen-client-urls") or []]  # type: ignore[attr-defined]
    assert listen and all(u.startswith("https://") for u in listen), listen
    tls = [str(e["tls-info"]) for e in log if e.get("msg") == "starting with client TLS"]
    assert tls, "etcd did not start with client TLS"
    assert all(f"client-cert-auth = {str(client_auth).lower()}" in t for t in tls), tls
    msgs = [e.get("msg") for e in log]
    assert "serving client traffic securely" in msgs
    assert "serving client traffic insecurely; this is strongly discouraged!" not in msgs
    # No client was refused for its certificate: the workers, the run's marker reads, and
    # etcd's own gateway, which dials etcd with the server certificate as a client one (so
    # the chart's server Certificate has the `client auth` usage too). A handshake cut by
    # the SIGKILL of a pod (EOF, reset) is the fault injected, not a refusal.
    refused = [
        e
        for e in log
        if e.get("msg") == "rejected connection"
        and any(w in str(e.get("error", "")) for w in ("certificate", "key usage", "authority"))
    ]
    assert not refused, refused


def _issued_secrets(sets: list[str]) -> list[str]:
    values = dict(s.split("=", 1) for s in sets)
    server = values.get("etcd-rendezvous.tls.existingSecret", "e2e-etcd-rendezvous-server-tls")
    client = values.get("rendezvous.tls.clientCertSecret", "e2e-etcd-rendezvous-client-tls")
    mutual = values.get("etcd-rendezvous.tls.clientCertAuth") == "true"
    return [server, client] if mutual else [server]


def _completes_through_a_sigkill(tmp_path: Path, sets: list[str]) -> LocalRun:
    # pod 1 is SIGKILLed at step 8 and stays down 10 s: the survivors re-form at two over
    # https, resume from memory (train.py keeps snapshots) and finish.
    run = run_local(tmp_path, f"--kill={pod(1)}@step=8:10", steps=40, every=5, sets=sets)
    assert run.rc == 0, run.describe()
    assert_nothing_lost(run, 40)
    s = run.summary
    assert all(p["exit_code"] == 0 for p in s["pods"].values()), run.describe()
    kill = reform(run, f"kill {pod(1)}")
    assert kill["world_size"] == 2, run.describe()
    assert kill["state_from"] in ("peer-memory", "local-memory"), kill
    assert kill["steps_lost"] == 0, kill
    assert "exited 137" in run.events()
    for name in _issued_secrets(sets):
        assert f"certificate issued: Secret {name}" in run.stdout
    assert_cleaned_up(run)
    return run


@pytest.mark.slow
def test_mutual_tls_job_loses_a_node_reforms_and_completes_over_https(tmp_path: Path) -> None:
    run = _completes_through_a_sigkill(tmp_path, MUTUAL_TLS)
    assert_https_only(run, client_auth=True)


@pytest.mark.slow
@pytest.mark.extended  # CI budget: a variant; the backend/TLS is covered by the SIGKILL scenario
def test_server_tls_job_loses_a_node_reforms_and_completes_over_https(tmp_path: Path) -> None:
    run = _completes_through_a_sigkill(tmp_path, SERVER_TLS)
    assert_https_only(run, client_auth=False)
    assert "Secret e2e-etcd-rendezvous-client-tls" not in run.stdout  # no client cert asked


@pytest.mark.slow
@pytest.mark.extended  # CI budget: mutual TLS is the scenario above; these Secrets render-tested
def test_existing_secrets_job_loses_a_node_reforms_and_completes_over_mutual_tls(
    tmp_path: Path,
) -> None:
    # the Secrets a user brings (no cert-manager in the chart): issued by the run's CA
    run = _completes_through_a_sigkill(tmp_path, EXISTING_SECRETS_TLS)
    assert_https_only(run, client_auth=True)


@pytest.mark.slow
@pytest.mark.parametrize(
    "backend",
    ["etcd-v3", pytest.param("etcd-lease", marks=pytest.mark.extended)],
)
def test_v3_mutual_tls_job_loses_a_node_reforms_and_completes_over_https(
    tmp_path: Path, backend: str
) -> None:
    # global.rendezvousBackend=etcd-v3 or etcd-lease: torch-etcd-v3's handlers and the
    # worker's v3 client take the same protocol/ca_cert/ssl_cert/ssl_cert_key, over the v3
    # JSON gateway (each watch of etcd-lease a connection of its own, over TLS too).
    run = _completes_through_a_sigkill(
        tmp_path, [*MUTUAL_TLS, f"global.rendezvousBackend={backend}"]
    )
    assert_https_only(run, client_auth=True)
    assert f"--rdzv-backend={backend} " in run.log(pod(0)), run.log(pod(0))[-3000:]
