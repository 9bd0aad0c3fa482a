"""gang.kueue: the worker StatefulSets as Kueue Workloads (its StatefulSet integration) and
the optional LocalQueue (templates/localqueue.yaml)."""

from __future__ import annotations

from chart_render import (
    ELASTIC_JOB,
    EXAMPLES,
    RELEASE,
    TEST_VALUES,
    container,
    env_of,
    objects,
    of_kind,
    one,
    pod_spec,
    worker_statefulsets,
)

QUEUE = "kueue.x-k8s.io/queue-name"
PRIORITY = "kueue.x-k8s.io/priority-class"
KUEUE_SETS = ("gang.kueue.enabled=true", "gang.kueue.queueName=q")


def test_every_worker_statefulset_carries_the_queue_label() -> None:
    """gang.kueue.queueName labels each group's StatefulSet (what Kueue's StatefulSet
    integration reads), with the WorkloadPriorityClass; no Volcano scheduler, no PodGroup."""
    objs = objects(ELASTIC_JOB, values=[EXAMPLES / "kueue-two-groups.yaml"])
    stss = worker_statefulsets(objs)
    assert sorted(s["metadata"]["name"] for s in stss) == [
        f"{RELEASE}-elastic-job-base",
        f"{RELEASE}-elastic-job-burst",
    ]
    for sts in stss:
        labels = sts["metadata"]["labels"]
        assert labels[QUEUE] == "team-a"
        assert labels[PRIORITY] == "training"
        # The pods get Kueue's labels from Kueue itself; the chart leaves the template alone.
        assert QUEUE not in sts["spec"]["template"]["metadata"]["labels"]
        assert "schedulerName" not in pod_spec(sts)
        assert "annotations" not in sts["spec"]["template"]["metadata"]
    assert not of_kind(objs, "PodGroup")
    assert not of_kind(objs, "LocalQueue")


def test_each_admitted_group_can_train_alone() -> None:
    """The example's groups each hold job.minNodes pods: the count Kueue admits at once."""
    objs = objects(ELASTIC_JOB, values=[EXAMPLES / "kueue-two-groups.yaml"])
    for sts in worker_statefulsets(objs):
        min_nodes = int(env_of(container(sts, "worker"))["ELASTIC_MIN_NODES"])
        assert sts["spec"]["replicas"] >= min_nodes


def test_no_kueue_labels_by_default() -> None:
    """gang.kueue.enabled=false: no queue label, so Kueue (without
    manageJobsWithoutQueueName) leaves the StatefulSets alone."""
    for sts in worker_statefulsets(objects(ELASTIC_JOB)):
        assert not [k for k in sts["metadata"]["labels"] if k.startswith("kueue.x-k8s.io/")]


def test_priority_label_only_when_set() -> None:
    objs = objects(ELASTIC_JOB, sets=["gang.kueue.enabled=true", "gang.kueue.queueName=q"])
    (sts,) = worker_statefulsets(objs)
    assert sts["metadata"]["labels"][QUEUE] == "q"
    assert PRIORITY not in sts["metadata"]["labels"]


def test_created_local_queue_is_the_one_the_statefulsets_name() -> None:
    """gang.kueue.localQueue.create: a LocalQueue named like the release, pointing at
    gang.kueue.localQueue.clusterQueue, and the StatefulSets submitted to it."""
    objs = objects(ELASTIC_JOB, values=[TEST_VALUES / "kueue-local-queue.yaml"])
    queue = one(objs, "LocalQueue")
    assert queue["apiVersion"] == "kueue.x-k8s.io/v1beta2"
    assert queue["metadata"]["name"] == f"{RELEASE}-elastic-job"
    assert queue["spec"] == {"clusterQueue": "gpu-cluster-queue"}
    (sts,) = worker_statefulsets(objs)
    assert sts["metadata"]["labels"][QUEUE] == queue["metadata"]["name"]


def test_created_local_queue_takes_queue_name() -> None:
    objs = objects(
        ELASTIC_JOB,
        sets=[
            "gang.kueue.enabled=true",
            "gang.kueue.queueName=mine",
            "gang.kueue.localQueue.create=true",
            "gang.kueue.localQueue.clusterQueue=cq",
        ],
    )
    assert one(objs, "LocalQueue")["metadata"]["name"] == "mine"
    (sts,) = worker_statefulsets(objs)
    assert sts["metadata"]["labels"][QUEUE] == "mine"


def test_a_group_at_zero_replicas_is_allowed() -> None:
    """A group with 0 replicas makes no Workload (Kueue admits it once scaled up from zero,
    the one resize Kueue allows), so it need not reach job.minNodes."""
    objs = objects(
        ELASTIC_JOB,
        sets=[
            *KUEUE_SETS,
            "job.minNodes=2",
            "workerGroups.default.replicas=2",
            "workerGroups.later.replicas=0",
        ],
    )
    replicas = {s["metadata"]["name"]: s["spec"]["replicas"] for s in worker_statefulsets(objs)}
    assert replicas == {f"{RELEASE}-elastic-job-default": 2, f"{RELEASE}-elastic-job-later": 0}


def test_every_doc_names_the_same_minimum_kueue_version() -> None:
    """v0.10.2: the first release with both the serving pod group (v0.10.0) and the
    priority-class label copied to a StatefulSet's pods (v0.10.2); the chart README, the
    values' comment and the Kueue example say it, and none still says v0.9."""
    docs = {
        "README": (ELASTIC_JOB / "README.md").read_text(),
        "values.yaml": (ELASTIC_JOB / "values.yaml").read_text(),
        "example": (EXAMPLES / "kueue-two-groups.yaml").read_text(),
    }
    for name, text in docs.items():
        assert "v0.10.2" in text, name
        assert "v0.9+" not in text and "v0.9 or later" not in text, name
