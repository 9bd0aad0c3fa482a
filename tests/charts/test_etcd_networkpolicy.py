"""charts/etcd-rendezvous templates/networkpolicy.yaml: port 2379 admits the job's workers
and nothing else."""

from __future__ import annotations

from typing import Any

from chart_render import ELASTIC_JOB, ETCD, RELEASE, objects, of_kind, one, selects

NAME = f"{RELEASE}-etcd-rendezvous"


def _pod_labels(objs: list[dict[str, Any]]) -> dict[str, dict[str, str]]:
    out = {}
    for obj in objs:
        if obj["kind"] == "StatefulSet":
            out[obj["metadata"]["name"]] = obj["spec"]["template"]["metadata"]["labels"]
        elif obj["kind"] == "Pod":
            out[obj["metadata"]["name"]] = obj["metadata"]["labels"]
    return out


def test_policy_selects_the_etcd_pod_only() -> None:
    """podSelector = the etcd member; Ingress only."""
    objs = objects(ELASTIC_JOB, values=[ELASTIC_JOB / "ci" / "multigroup-values.yaml"])
    policy = one(objs, "NetworkPolicy", NAME)
    selected = [
        name
        for name, labels in _pod_labels(objs).items()
        if selects(policy["spec"]["podSelector"]["matchLabels"], labels)
    ]
    assert selected == [NAME]
    assert policy["spec"]["policyTypes"] == ["Ingress"]


def test_port_2379_admits_the_workers_and_nothing_else() -> None:
    """One rule: TCP 2379 from pods of this release labelled as rendezvous clients, which
    are every worker group's pods (and the helm test pod), never the etcd pod itself, a
    pod of another release or a bare pod of this release."""
    objs = objects(ELASTIC_JOB, values=[ELASTIC_JOB / "ci" / "multigroup-values.yaml"])
    (rule,) = one(objs, "NetworkPolicy", NAME)["spec"]["ingress"]
    assert rule["ports"] == [{"port": 2379, "protocol": "TCP"}]
    (peer,) = rule["from"]
    assert set(peer) == {"podSelector"}  # no namespaceSelector, no ipBlock
    selector = peer["podSelector"]["matchLabels"]
    admitted = sorted(n for n, labels in _pod_labels(objs).items() if selects(selector, labels))
    assert admitted == sorted(
        [
            f"{RELEASE}-elastic-job-anchor",
            f"{RELEASE}-elastic-job-spot",
            f"{RELEASE}-elastic-job-test-rendezvous",
        ]
    )
    assert not selects(selector, {"app.kubernetes.io/instance": RELEASE})
    other = {**_pod_labels(objs)[f"{RELEASE}-elastic-job-spot"], "app.kubernetes.io/instance": "x"}
    assert not selects(selector, other)


def test_shared_rendezvous_admits_labelled_clients_of_chosen_namespaces() -> None:
    """networkPolicy.clientPodLabels / clientNamespaceLabels (a rendezvous shared by jobs)."""
    objs = objects(ETCD, values=[ETCD / "ci" / "shared-values.yaml"])
    policy = one(objs, "NetworkPolicy", "shared-rendezvous")
    client_rule, metrics_rule = policy["spec"]["ingress"]
    (peer,) = client_rule["from"]
    assert peer["podSelector"]["matchLabels"] == {
        "elastic-job.pytorch.org/rendezvous-client": "true"
    }
    assert peer["namespaceSelector"]["matchLabels"] == {"example.com/training": "true"}
    assert metrics_rule["ports"] == [{"port": 2381, "protocol": "TCP"}]
    (scraper,) = metrics_rule["from"]
    assert scraper["namespaceSelector"]["matchLabels"] == {
        "kubernetes.io/metadata.name": "monitoring"
    }


def test_disabled_renders_no_policy() -> None:
    """networkPolicy.enabled=false: no NetworkPolicy."""
    assert not of_kind(objects(ETCD, sets=["networkPolicy.enabled=false"]), "NetworkPolicy")
