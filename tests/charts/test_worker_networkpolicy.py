"""templates/worker-networkpolicy.yaml: workers accept traffic only from the job's workers."""

from __future__ import annotations

from chart_render import ELASTIC_JOB, RELEASE, objects, of_kind, one, selects, worker_statefulsets

NAME = f"{RELEASE}-elastic-job-workers"


def test_applies_to_every_worker_pod_and_admits_only_workers() -> None:
    """podSelector covers all groups; the only ingress peer is the job's worker pods."""
    objs = objects(ELASTIC_JOB, values=[ELASTIC_JOB / "ci" / "multigroup-values.yaml"])
    policy = one(objs, "NetworkPolicy", NAME)
    for sts in worker_statefulsets(objs):
        labels = sts["spec"]["template"]["metadata"]["labels"]
        assert selects(policy["spec"]["podSelector"]["matchLabels"], labels)
    assert policy["spec"]["policyTypes"] == ["Ingress"]
    (rule,) = policy["spec"]["ingress"]
    (peer,) = rule["from"]
    assert set(peer) == {"podSelector"}
    assert "ports" not in rule  # torchrun, gloo and NCCL pick their ports
    assert peer["podSelector"]["matchLabels"] == policy["spec"]["podSelector"]["matchLabels"]
    others = [o for o in of_kind(objs, "StatefulSet") if o not in worker_statefulsets(objs)]
    for other in others + of_kind(objs, "Pod"):
        labels = (other.get("spec", {}).get("template") or other)["metadata"]["labels"]
        assert not selects(peer["podSelector"]["matchLabels"], labels)


def test_extra_ingress_is_appended() -> None:
    """networkPolicy.extraIngress rules follow the workers rule (e.g. a mesh CIDR)."""
    objs = objects(
        ELASTIC_JOB,
        extra=[
            "--set-json",
            'networkPolicy.extraIngress=[{"from":[{"ipBlock":{"cidr":"10.99.0.0/16"}}]}]',
        ],
    )
    rules = one(objs, "NetworkPolicy", NAME)["spec"]["ingress"]
    assert rules[1] == {"from": [{"ipBlock": {"cidr": "10.99.0.0/16"}}]}


def test_disabled_renders_no_policy() -> None:
    """networkPolicy.enabled=false: no worker NetworkPolicy."""
    objs = objects(ELASTIC_JOB, sets=["networkPolicy.enabled=false"])
    assert NAME not in [o["metadata"]["name"] for o in of_kind(objs, "NetworkPolicy")]


def test_monitoring_admits_the_scraper_on_the_metrics_port_only() -> None:
    """monitoring.enabled: a second rule lets monitoring.scraper.podLabels in
    monitoring.scraper.namespaceLabels reach the port named `metrics`, nothing else."""
    objs = objects(
        ELASTIC_JOB,
        sets=[
            "monitoring.enabled=true",
            "monitoring.scraper.podLabels.app=vmagent",
            "monitoring.scraper.namespaceLabels.team=observability",
        ],
    )
    workers, scraper = one(objs, "NetworkPolicy", NAME)["spec"]["ingress"]
    assert "ports" not in workers
    assert scraper == {
        "from": [
            {
                "podSelector": {
                    "matchLabels": {"app": "vmagent", "app.kubernetes.io/name": "prometheus"}
                },
                "namespaceSelector": {"matchLabels": {"team": "observability"}},
            }
        ],
        "ports": [{"port": "metrics", "protocol": "TCP"}],
    }


def test_null_scraper_labels_select_any_pod_and_any_namespace() -> None:
    """monitoring.scraper.podLabels=null (Helm merges `{}` into the default) and empty
    namespaceLabels: `{}` selectors, any pod in any namespace."""
    objs = objects(
        ELASTIC_JOB, sets=["monitoring.enabled=true", "monitoring.scraper.podLabels=null"]
    )
    scraper = one(objs, "NetworkPolicy", NAME)["spec"]["ingress"][1]
    assert scraper["from"] == [{"podSelector": {}, "namespaceSelector": {}}]


def test_monitoring_off_adds_no_scraper_rule() -> None:
    """Default: the workers-only rule stays the only one."""
    assert len(one(objects(ELASTIC_JOB), "NetworkPolicy", NAME)["spec"]["ingress"]) == 1
