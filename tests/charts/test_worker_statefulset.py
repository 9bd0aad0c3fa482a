"""templates/worker-statefulset.yaml: one StatefulSet per worker group; names, selectors,
labels and pod-level settings (the containers: test_worker_container.py and
test_worker_init_container.py)."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

from chart_render import (
    CHARTS,
    ELASTIC_JOB,
    RELEASE,
    container,
    env_of,
    objects,
    one,
    pod_spec,
    worker_statefulsets,
)
from worker_sts import render_sts, worker_env

# --- names, kind-level settings ---------------------------------------------------------


def test_one_statefulset_per_worker_group_named_fullname_group() -> None:
    """workerGroups.<name>: StatefulSet `<release>-elastic-job-<name>`, sorted by name."""
    objs = objects(ELASTIC_JOB, values=[ELASTIC_JOB / "ci" / "multigroup-values.yaml"])
    names = [s["metadata"]["name"] for s in worker_statefulsets(objs)]
    assert names == [f"{RELEASE}-elastic-job-anchor", f"{RELEASE}-elastic-job-spot"]


def test_statefulset_names_are_cut_to_52_characters() -> None:
    """A long release name: `<fullname>-<group>` is cut to 52 (controller-revision-hash)."""
    release = "r" * 53
    objs = objects(ELASTIC_JOB, release=release)
    for sts in worker_statefulsets(objs):
        assert len(sts["metadata"]["name"]) <= 52
        assert not sts["metadata"]["name"].endswith("-")


def test_group_set_to_null_is_removed() -> None:
    """workerGroups.default=null removes the default group."""
    objs = objects(ELASTIC_JOB, sets=["workerGroups.default=null", "workerGroups.spot.replicas=2"])
    assert [s["metadata"]["name"] for s in worker_statefulsets(objs)] == [
        f"{RELEASE}-elastic-job-spot"
    ]


def test_parallel_pod_management_and_the_jobs_headless_service() -> None:
    """podManagementPolicy Parallel; serviceName is the one headless worker Service."""
    objs = objects(ELASTIC_JOB, values=[ELASTIC_JOB / "ci" / "multigroup-values.yaml"])
    service = one(objs, "Service", f"{RELEASE}-elastic-job-workers")
    for sts in worker_statefulsets(objs):
        assert sts["spec"]["podManagementPolicy"] == "Parallel"
        assert sts["spec"]["serviceName"] == service["metadata"]["name"]


def test_replicas_come_from_the_group() -> None:
    """workerGroups.default.replicas -> spec.replicas."""
    assert (
        render_sts(sets=["workerGroups.default.replicas=5", "job.maxNodes=5"])["spec"]["replicas"]
        == 5
    )


# --- selectors and labels ---------------------------------------------------------------


def test_selector_holds_only_name_instance_component_and_group() -> None:
    """Selectors never hold a version or chart label (immutable across upgrades)."""
    sts = render_sts()
    assert sts["spec"]["selector"]["matchLabels"] == {
        "app.kubernetes.io/name": "elastic-job",
        "app.kubernetes.io/instance": RELEASE,
        "app.kubernetes.io/component": "worker",
        "elastic-job.pytorch.org/group": "default",
    }
    labels = sts["spec"]["template"]["metadata"]["labels"]
    assert all(labels[k] == v for k, v in sts["spec"]["selector"]["matchLabels"].items())


def _selectors(objs: list[dict[str, Any]]) -> dict[str, Any]:
    out = {}
    for obj in objs:
        key = f"{obj['kind']}/{obj['metadata']['name']}"
        spec = obj.get("spec", {})
        if obj["kind"] == "StatefulSet":
            # Every field a StatefulSet update may not change.
            out[key] = {
                "selector": spec["selector"],
                "serviceName": spec["serviceName"],
                "podManagementPolicy": spec.get("podManagementPolicy"),
                "volumeClaimTemplates": spec.get("volumeClaimTemplates"),
            }
        elif obj["kind"] == "PodDisruptionBudget":
            out[key] = spec["selector"]
        elif obj["kind"] == "Service":
            out[key] = spec.get("selector")
        elif obj["kind"] == "NetworkPolicy":
            out[key] = spec["podSelector"]
    return out


def test_selectors_are_unchanged_by_a_chart_and_app_version_bump(tmp_path: Path) -> None:
    """Bumping both charts' version and appVersion changes no selector and no immutable
    StatefulSet field (serviceName, podManagementPolicy, volumeClaimTemplates)."""
    copy = tmp_path / "charts"
    shutil.copytree(CHARTS, copy, symlinks=True)
    for chart_yaml in copy.glob("*/Chart.yaml"):
        text = chart_yaml.read_text().replace("version: 0.1.0", "version: 9.9.9")
        chart_yaml.write_text(text.replace('appVersion: "', 'appVersion: "9.9.9-was-'))
    lock = copy / "elastic-job" / "Chart.lock"
    lock.write_text(lock.read_text().replace("version: 0.1.0", "version: 9.9.9"))
    sets = ["etcd-rendezvous.persistence.enabled=true"]
    before = objects(ELASTIC_JOB, values=[ELASTIC_JOB / "ci" / "multigroup-values.yaml"], sets=sets)
    after = objects(
        copy / "elastic-job", values=[ELASTIC_JOB / "ci" / "multigroup-values.yaml"], sets=sets
    )
    assert _selectors(before) == _selectors(after)
    assert len(_selectors(before)) >= 6
    assert before != after  # the bump did change the labels


def test_pod_labels_carry_group_and_rendezvous_client() -> None:
    """Worker pods: contract labels, `elastic-job.pytorch.org/group` and the label the
    etcd NetworkPolicy admits; worker.podLabels added."""
    labels = render_sts(sets=["worker.podLabels.team=vision"])["spec"]["template"]["metadata"][
        "labels"
    ]
    assert labels["elastic-job.pytorch.org/group"] == "default"
    assert labels["elastic-job.pytorch.org/rendezvous-client"] == "true"
    assert labels["app.kubernetes.io/part-of"] == "elastic-job"
    assert labels["app.kubernetes.io/managed-by"] == "Helm"
    assert labels["helm.sh/chart"] == "elastic-job-0.1.0"
    assert labels["team"] == "vision"


# --- pod-level settings -----------------------------------------------------------------


def test_pod_security_restricted_by_default() -> None:
    """Non-root, seccomp RuntimeDefault, no privilege escalation, drop ALL (both containers)."""
    sts = render_sts()
    spec = pod_spec(sts)
    assert spec["securityContext"]["runAsNonRoot"] is True
    assert spec["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
    for name in ("worker", "init-topology"):
        ctx = container(sts, name)["securityContext"]
        assert ctx["allowPrivilegeEscalation"] is False
        assert ctx["capabilities"]["drop"] == ["ALL"]
        assert ctx["runAsNonRoot"] is True
    assert container(sts, "init-topology")["securityContext"]["readOnlyRootFilesystem"] is True


def test_service_account_and_token() -> None:
    """Pods run as the chart's ServiceAccount with the token mounted (init-topology, scale)."""
    spec = pod_spec(render_sts())
    assert spec["serviceAccountName"] == f"{RELEASE}-elastic-job"
    assert spec["automountServiceAccountToken"] is True
    assert (
        pod_spec(render_sts(sets=["worker.automountServiceAccountToken=false"]))[
            "automountServiceAccountToken"
        ]
        is False
    )


def test_priority_class_and_group_override() -> None:
    """worker.priorityClassName, replaced per group."""
    assert (
        pod_spec(render_sts(sets=["worker.priorityClassName=high"]))["priorityClassName"] == "high"
    )
    assert "priorityClassName" not in pod_spec(render_sts())
    spec = pod_spec(
        render_sts(
            sets=["worker.priorityClassName=high", "workerGroups.default.priorityClassName=low"]
        )
    )
    assert spec["priorityClassName"] == "low"


def test_volcano_gang_sets_scheduler_and_group_annotation() -> None:
    """gang.volcano.enabled: schedulerName and `scheduling.k8s.io/group-name` = the PodGroup."""
    objs = objects(ELASTIC_JOB, sets=["gang.volcano.enabled=true"])
    (sts,) = worker_statefulsets(objs)
    podgroup = one(objs, "PodGroup")
    assert pod_spec(sts)["schedulerName"] == "volcano"
    annotations = sts["spec"]["template"]["metadata"]["annotations"]
    assert annotations["scheduling.k8s.io/group-name"] == podgroup["metadata"]["name"]


def test_no_gang_by_default() -> None:
    """gang.volcano.enabled=false: default scheduler, no group annotation."""
    sts = render_sts()
    assert "schedulerName" not in pod_spec(sts)
    assert "annotations" not in sts["spec"]["template"]["metadata"]


def test_checkov_skips_follow_the_settings() -> None:
    """Resource-limit skips disappear once worker.resources sets requests and limits."""
    annotations = render_sts()["metadata"]["annotations"]
    assert any(v.startswith("CKV_K8S_11=") for v in annotations.values())
    annotations = render_sts(values=[ELASTIC_JOB / "ci" / "cpu-values.yaml"])["metadata"][
        "annotations"
    ]
    assert not any(
        v.split("=")[0] in {"CKV_K8S_10", "CKV_K8S_11", "CKV_K8S_12", "CKV_K8S_13"}
        for v in annotations.values()
    )
    assert list(annotations) == [f"checkov.io/skip{i}" for i in range(1, len(annotations) + 1)]


DIGEST = "sha256:" + "ab" * 32


def test_the_digest_skip_goes_once_both_images_are_pinned_by_digest() -> None:
    """worker.image.digest and initTopology.image.digest: CKV_K8S_43 and CKV_K8S_15 hold, no skip;
    one of them alone keeps it (the other image is still pulled by tag)."""

    def skips(*sets: str) -> list[str]:
        annotations = render_sts(sets=list(sets))["metadata"]["annotations"]
        assert list(annotations) == [f"checkov.io/skip{i}" for i in range(1, len(annotations) + 1)]
        return [v.split("=")[0] for v in annotations.values()]

    assert "CKV_K8S_43" in skips()
    assert "CKV_K8S_43" in skips(f"worker.image.digest={DIGEST}")
    both = skips(f"worker.image.digest={DIGEST}", f"initTopology.image.digest={DIGEST}")
    assert "CKV_K8S_43" not in both
    assert both == [k for k in skips() if k not in {"CKV_K8S_43", "CKV_K8S_15"}]


def test_the_etcd_digest_skip_goes_with_a_digest() -> None:
    def skips(*sets: str) -> list[str]:
        (sts,) = [
            o
            for o in objects(ELASTIC_JOB, sets=list(sets))
            if o["kind"] == "StatefulSet" and "etcd" in o["metadata"]["name"]
        ]
        return [v.split("=")[0] for v in sts["metadata"]["annotations"].values()]

    assert "CKV_K8S_43" in skips()
    assert "CKV_K8S_43" not in skips(f"etcd-rendezvous.image.digest={DIGEST}")


def test_worker_runs_as_the_worker_images_user_and_init_as_65532() -> None:
    """The worker container runs as the worker image's user 10001 (HOME for caches); the
    pod's user (init-topology's, 65532) and fsGroup stay as the init container needs."""
    sts = render_sts()
    spec = pod_spec(sts)
    assert (spec["securityContext"]["runAsUser"], spec["securityContext"]["fsGroup"]) == (
        65532,
        65532,
    )
    worker = container(sts, "worker")["securityContext"]
    assert (worker["runAsUser"], worker["runAsGroup"]) == (10001, 10001)
    assert "runAsUser" not in container(sts, "init-topology")["securityContext"]


def test_numbers_in_command_env_and_conf_are_written_in_full(tmp_path: Path) -> None:
    """YAML numbers in job.command, worker.env and rendezvous.extraConf render as written
    (1000000, not Go's 1e+06), so `--steps 1000000` reaches the script intact."""
    values = tmp_path / "values.yaml"
    values.write_text(
        "job:\n  command: [python, t.py, --steps, 1000000, --lr, 0.0001]\n"
        "worker:\n  env:\n    BIG: 1000000\n    HALF: 0.5\n"
        "rendezvous:\n  extraConf:\n    read_timeout: 3000000\n"
    )
    worker = container(render_sts(values=[values]), "worker")
    assert worker["args"] == ["python", "t.py", "--steps", "1000000", "--lr", "0.0001"]
    env = env_of(worker)
    assert (env["BIG"], env["HALF"]) == ("1000000", "0.5")
    assert env["ELASTIC_RDZV_CONF"].endswith(",read_timeout=3000000")


def test_cert_manager_secrets_of_the_bundled_etcd_are_used_by_default() -> None:
    """rendezvous.tls with etcd-rendezvous.tls.certManager: the workers mount the etcd
    server Secret's ca.crt and the client Secret cert-manager issues for them."""
    objs = objects(ELASTIC_JOB, values=[Path(__file__).parent / "values" / "tls-cert-manager.yaml"])
    (sts,) = worker_statefulsets(objs)
    volumes = {v["name"]: v for v in pod_spec(sts)["volumes"]}
    assert (
        volumes["rendezvous-ca"]["secret"]["secretName"] == f"{RELEASE}-etcd-rendezvous-server-tls"
    )
    assert volumes["rendezvous-client"]["secret"]["secretName"] == (
        f"{RELEASE}-etcd-rendezvous-client-tls"
    )
    secrets = {c["spec"]["secretName"] for c in objs if c["kind"] == "Certificate"}
    assert {
        volumes["rendezvous-ca"]["secret"]["secretName"],
        volumes["rendezvous-client"]["secret"]["secretName"],
    } <= secrets


def test_nproc_per_node_may_be_gpu() -> None:
    """job.nprocPerNode=gpu passes through (torchrun: one process per visible GPU)."""
    env = worker_env(sets=["job.nprocPerNode=gpu", "worker.gpus=8"])
    assert env["ELASTIC_NPROC_PER_NODE"] == "gpu"


def test_a_capability_added_to_init_topology_is_skipped_with_its_reason() -> None:
    """worker.initContainerSecurityContext adding a capability fails CKV_K8S_25 on the pod
    (checked against checkov in test_checkov.py's scans): the skip says who added it."""

    def skips(*sets: str) -> dict[str, str]:
        annotations = render_sts(sets=list(sets))["metadata"]["annotations"]
        return dict(v.split("=", 1) for v in annotations.values())

    assert "CKV_K8S_25" not in skips()
    reason = skips("worker.initContainerSecurityContext.capabilities.add={NET_RAW}")["CKV_K8S_25"]
    assert "worker.initContainerSecurityContext" in reason
