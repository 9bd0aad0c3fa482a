"""templates/NOTES.txt of the per-job charts (elastic-job, etcd-rendezvous): what was
created, how to watch it, how to stop it. The cluster chart's: test_names.py."""

from __future__ import annotations

from chart_render import ELASTIC_JOB, ETCD, HELM4, NAMESPACE, RELEASE, helm_run


def _notes(chart, *sets: str) -> str:
    args = ["install", RELEASE, str(chart), "--dry-run=client", "--namespace", NAMESPACE]
    for item in sets:
        args += ["--set", item]
    proc = helm_run(HELM4, *args)  # Helm 3 contacts a cluster even with --dry-run=client
    assert proc.returncode == 0, proc.stderr
    return proc.stdout.split("NOTES:", 1)[1]


def test_elastic_job_notes_name_the_objects_and_commands() -> None:
    """StatefulSets, rendezvous endpoint, kubectl watch/logs, scale to 0, uninstall."""
    notes = _notes(ELASTIC_JOB, "gang.volcano.enabled=true")
    assert f"{RELEASE}-elastic-job-default" in notes
    assert f"{RELEASE}-etcd-rendezvous.{NAMESPACE}.svc.cluster.local:2379" in notes
    assert f"kubectl -n {NAMESPACE} get pods -l app.kubernetes.io/instance={RELEASE}" in notes
    assert f"statefulset/{RELEASE}-elastic-job-default --replicas=0" in notes
    assert f"helm -n {NAMESPACE} uninstall {RELEASE}" in notes
    assert "PodGroup" in notes
    assert f"helm -n {NAMESPACE} test {RELEASE}" in notes
    assert f"elastic-job -n {NAMESPACE} status {RELEASE}" in notes


def test_elastic_job_notes_show_the_workers_events_when_they_record_them() -> None:
    """events.enabled: how to list the Events the workers record; off: no such line."""
    assert "get events" in _notes(ELASTIC_JOB, "events.enabled=true")
    assert "get events" not in _notes(ELASTIC_JOB)


def test_etcd_rendezvous_notes_name_the_endpoint_and_policy() -> None:
    """Client endpoint, member pod, and who may connect when the NetworkPolicy is on."""
    notes = _notes(ETCD)
    assert f"{RELEASE}-etcd-rendezvous.{NAMESPACE}.svc.cluster.local:2379" in notes
    assert f"{RELEASE}-etcd-rendezvous-0" in notes
    assert "elastic-job.pytorch.org/rendezvous-client=true" in notes


def test_notes_name_the_rendezvous_backend() -> None:
    """global.rendezvousBackend: elastic-job names it beside the endpoint; the etcd chart
    says whether its v2 API is on and for which clients."""
    assert "Rendezvous (etcd-v2): " in _notes(ELASTIC_JOB)
    assert "Rendezvous (etcd-v3): " in _notes(ELASTIC_JOB, "global.rendezvousBackend=etcd-v3")
    assert "(v2 API on, for etcd-v2 clients)" in _notes(ETCD)
    assert "(v2 API off, for etcd-v3 clients)" in _notes(ETCD, "global.rendezvousBackend=etcd-v3")
    lease = "global.rendezvousBackend=etcd-lease"
    assert "Rendezvous (etcd-lease): " in _notes(ELASTIC_JOB, lease)
    assert "(v2 API off, for etcd-lease clients)" in _notes(ETCD, lease)


def test_under_kueue_the_notes_resize_a_group_through_zero() -> None:
    """gang.kueue.enabled: `kubectl scale` between two non-zero sizes bypasses Kueue's
    webhook and its accounting, so the resize hint goes through 0; without Kueue, directly."""
    kueue = _notes(ELASTIC_JOB, "gang.kueue.enabled=true", "gang.kueue.queueName=team-a")
    resize = kueue.split("Resize it", 1)[1].split("Stop it", 1)[0]
    assert resize.index("--replicas=0") < resize.index("--replicas=N"), resize
    plain = _notes(ELASTIC_JOB).split("Resize it", 1)[1].split("Stop it", 1)[0]
    assert "--replicas=0" not in plain and "--replicas=N" in plain
