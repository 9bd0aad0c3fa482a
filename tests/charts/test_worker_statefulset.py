"""templates/worker-statefulset.yaml: one StatefulSet per worker group, the pod as
docs/contracts.md fixes it (init container, worker container, env, volumes)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest
import yaml
from chart_render import (
    CHARTS,
    ELASTIC_JOB,
    EXAMPLES,
    NAMESPACE,
    RELEASE,
    container,
    env_of,
    objects,
    one,
    pod_spec,
    worker_statefulsets,
)
from elastic_worker.settings import SETTINGS, Source

# The worker's variables the chart sets, in the chart's order: the one definition's
# (images/worker/src/elastic_worker/settings.py), then the downward API's.
CONTRACT_ENV = [
    *(s.name for s in SETTINGS if s.source in {Source.VALUE, Source.DERIVED}),
    "POD_NAME",
    "POD_NAMESPACE",
    "POD_IP",
    "NODE_NAME",
]
INIT_ENV = [
    "NODE_NAME",
    "POD_NAME",
    "POD_NAMESPACE",
    "TOPOLOGY_OUTPUT",
    "TOPOLOGY_LABEL_MAP",
    "TOPOLOGY_STRICT",
    "TOPOLOGY_TIMEOUT_SECONDS",
    "TOPOLOGY_USER_ENV",
]
DEFAULTS = yaml.safe_load((ELASTIC_JOB / "values.yaml").read_text())


def _sts(**kwargs: Any) -> dict[str, Any]:
    (sts,) = worker_statefulsets(objects(ELASTIC_JOB, **kwargs))
    return sts


def _worker_env(**kwargs: Any) -> dict[str, Any]:
    return env_of(container(_sts(**kwargs), "worker"))


def _names(ctr: dict[str, Any]) -> list[str]:
    return [e["name"] for e in ctr["env"]]


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
    assert _sts(sets=["workerGroups.default.replicas=5", "job.maxNodes=5"])["spec"]["replicas"] == 5


# --- selectors and labels ---------------------------------------------------------------


def test_selector_holds_only_name_instance_component_and_group() -> None:
    """Selectors never hold a version or chart label (immutable across upgrades)."""
    sts = _sts()
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
    labels = _sts(sets=["worker.podLabels.team=vision"])["spec"]["template"]["metadata"]["labels"]
    assert labels["elastic-job.pytorch.org/group"] == "default"
    assert labels["elastic-job.pytorch.org/rendezvous-client"] == "true"
    assert labels["app.kubernetes.io/part-of"] == "elastic-job"
    assert labels["app.kubernetes.io/managed-by"] == "Helm"
    assert labels["helm.sh/chart"] == "elastic-job-0.1.0"
    assert labels["team"] == "vision"


# --- the worker container ---------------------------------------------------------------


def test_worker_env_is_the_contract_list_in_order_then_user_env_sorted() -> None:
    """Env names exactly as docs/contracts.md lists them, then worker.env sorted by name."""
    sts = _sts(sets=["worker.env.ZED=1", "worker.env.ALPHA=a"])
    assert _names(container(sts, "worker")) == [*CONTRACT_ENV, "ALPHA", "ZED"]


def test_checkpoint_enabled_mounts_the_claim_and_sets_checkpoint_dir() -> None:
    """checkpoint.enabled + existingClaim: volume `checkpoint` (the PVC) at
    checkpoint.mountPath and CHECKPOINT_DIR set to it."""
    sts = _sts(
        sets=[
            "checkpoint.enabled=true",
            "checkpoint.existingClaim=ckpt",
            "checkpoint.mountPath=/mnt/ckpt",
        ]
    )
    worker = container(sts, "worker")
    assert env_of(worker)["CHECKPOINT_DIR"] == "/mnt/ckpt"
    assert {"name": "checkpoint", "mountPath": "/mnt/ckpt"} in worker["volumeMounts"]
    volumes = {v["name"]: v for v in pod_spec(sts)["volumes"]}
    assert volumes["checkpoint"]["persistentVolumeClaim"] == {"claimName": "ckpt"}


def test_checkpoint_disabled_mounts_nothing() -> None:
    """checkpoint.enabled=false (default): no checkpoint volume, no CHECKPOINT_DIR."""
    sts = _sts()
    assert "CHECKPOINT_DIR" not in env_of(container(sts, "worker"))
    assert "checkpoint" not in {v["name"] for v in pod_spec(sts)["volumes"]}


def test_every_env_value_is_a_string() -> None:
    """All env values are strings (numbers and booleans quoted)."""
    sts = _sts(sets=["worker.env.N=3", "worker.env.B=true"])
    for ctr in (container(sts, "worker"), container(sts, "init-topology")):
        for item in ctr["env"]:
            assert isinstance(item.get("value", ""), str), item


def test_downward_api_fields() -> None:
    """POD_NAME, POD_NAMESPACE, POD_IP, NODE_NAME from the downward API."""
    env = _worker_env()
    assert env["POD_NAME"] == {"fieldRef": {"fieldPath": "metadata.name"}}
    assert env["POD_NAMESPACE"] == {"fieldRef": {"fieldPath": "metadata.namespace"}}
    assert env["POD_IP"] == {"fieldRef": {"fieldPath": "status.podIP"}}
    assert env["NODE_NAME"] == {"fieldRef": {"fieldPath": "spec.nodeName"}}


def test_job_id_defaults_to_namespace_and_release() -> None:
    """job.id empty: ELASTIC_JOB_ID = `<namespace>-<release>`."""
    assert _worker_env()["ELASTIC_JOB_ID"] == f"{NAMESPACE}-{RELEASE}"


def test_job_id_is_lowercased_and_cut_to_63_without_trailing_dash() -> None:
    """job.id: lower-cased, cut to 63 characters, trailing '-' removed."""
    namespace = "n" * 62  # "<namespace>-<release>" cut at 63 ends with the "-"
    assert _worker_env(namespace=namespace)["ELASTIC_JOB_ID"] == "n" * 62
    assert _worker_env(sets=["job.id=Run-7"])["ELASTIC_JOB_ID"] == "run-7"
    assert _worker_env(sets=["job.id=" + "A" * 63])["ELASTIC_JOB_ID"] == "a" * 63


def test_job_id_is_stable_across_renders_and_releases() -> None:
    """The job id depends on release and namespace only."""
    assert _worker_env(namespace="team-a")["ELASTIC_JOB_ID"] == f"team-a-{RELEASE}"
    assert _worker_env(release="other")["ELASTIC_JOB_ID"] == f"{NAMESPACE}-other"


def test_rendezvous_endpoint_is_the_bundled_etcd_client_service_fqdn() -> None:
    """ELASTIC_RDZV_ENDPOINT = `<release>-etcd-rendezvous.<ns>.svc.<clusterDomain>:2379`,
    the client Service the dependency renders."""
    objs = objects(ELASTIC_JOB, sets=["global.clusterDomain=corp.local"])
    (sts,) = worker_statefulsets(objs)
    service = one(objs, "Service", f"{RELEASE}-etcd-rendezvous")
    etcd = container(one(objs, "StatefulSet", f"{RELEASE}-etcd-rendezvous"), "etcd")
    assert (
        f"--advertise-client-urls=http://{RELEASE}-etcd-rendezvous.{NAMESPACE}.svc.corp.local:2379"
        in etcd["command"]
    )
    assert service["spec"]["ports"][0] == {
        "name": "client",
        "port": 2379,
        "targetPort": "client",
        "protocol": "TCP",
    }
    assert (
        env_of(container(sts, "worker"))["ELASTIC_RDZV_ENDPOINT"]
        == f"{RELEASE}-etcd-rendezvous.{NAMESPACE}.svc.corp.local:2379"
    )


def test_rendezvous_endpoint_follows_etcd_fullname_override() -> None:
    """etcd-rendezvous.fullnameOverride renames the Service and the endpoint alike."""
    objs = objects(ELASTIC_JOB, sets=["etcd-rendezvous.fullnameOverride=rdzv"])
    one(objs, "Service", "rdzv")
    (sts,) = worker_statefulsets(objs)
    assert env_of(container(sts, "worker"))["ELASTIC_RDZV_ENDPOINT"] == (
        f"rdzv.{NAMESPACE}.svc.cluster.local:2379"
    )


def test_external_rendezvous_endpoint_replaces_the_bundled_etcd() -> None:
    """etcd-rendezvous.enabled=false + rendezvous.endpoint: no etcd objects, that endpoint."""
    objs = objects(
        ELASTIC_JOB,
        sets=["etcd-rendezvous.enabled=false", "rendezvous.endpoint=etcd.shared:2379"],
    )
    assert not [
        o
        for o in objs
        if "rendezvous" in o["metadata"]["labels"].get("app.kubernetes.io/component", "")
    ]
    (sts,) = worker_statefulsets(objs)
    assert env_of(container(sts, "worker"))["ELASTIC_RDZV_ENDPOINT"] == "etcd.shared:2379"


def test_rendezvous_settings_become_torchrun_rdzv_conf() -> None:
    """rendezvous.* -> ELASTIC_RDZV_CONF `join_timeout=..,last_call_timeout=..,close_timeout=..,
    keep_alive_interval=..,keep_alive_max_attempt=..` (etcd-v2 dynamic handler keys)."""
    env = _worker_env(
        sets=[
            "rendezvous.joinTimeout=900",
            "rendezvous.lastCallTimeout=2",
            "rendezvous.closeTimeout=45",
            "rendezvous.keepAliveInterval=3",
            "rendezvous.keepAliveMaxAttempt=4",
        ]
    )
    assert env["ELASTIC_RDZV_CONF"].startswith(
        "join_timeout=900,last_call_timeout=2,close_timeout=45,"
        "keep_alive_interval=3,keep_alive_max_attempt=4,"
    )


def test_default_rdzv_conf_comes_from_values_yaml() -> None:
    """The rendered conf is values.yaml's defaults (the image's equal them:
    tests/charts/test_worker_env_settings.py)."""
    r = DEFAULTS["rendezvous"]
    extra = "".join(f",{k}={v}" for k, v in sorted(r["extraConf"].items()))
    assert _worker_env()["ELASTIC_RDZV_CONF"] == (
        f"join_timeout={r['joinTimeout']},last_call_timeout={r['lastCallTimeout']},"
        f"close_timeout={r['closeTimeout']},keep_alive_interval={r['keepAliveInterval']},"
        f"keep_alive_max_attempt={r['keepAliveMaxAttempt']}{extra}"
    )
    assert _worker_env()["ELASTIC_MONITOR_INTERVAL"] == str(r["monitorInterval"])
    assert _worker_env()["ELASTIC_MAX_RESTARTS"] == str(r["maxRestarts"])


def test_rdzv_extra_conf_is_appended_sorted() -> None:
    """rendezvous.extraConf entries follow, sorted by key."""
    conf = _worker_env(
        sets=["rendezvous.extraConf.read_timeout=30", "rendezvous.extraConf.heartbeat_timeout=10"]
    )["ELASTIC_RDZV_CONF"]
    assert conf.endswith(",heartbeat_timeout=10,read_timeout=30")


def test_rendezvous_tls_adds_protocol_and_ca_cert_and_mounts_them() -> None:
    """rendezvous.tls: `protocol=https,ca_cert=...` (and the client cert) in the conf, and
    the Secrets mounted where the conf points."""
    sts = _sts(
        sets=[
            "rendezvous.tls.enabled=true",
            "rendezvous.tls.caSecret=etcd-ca",
            "rendezvous.tls.clientCertSecret=etcd-client",
            "etcd-rendezvous.tls.enabled=true",
            "etcd-rendezvous.tls.existingSecret=etcd-server",
        ]
    )
    worker = container(sts, "worker")
    conf = dict(kv.split("=", 1) for kv in env_of(worker)["ELASTIC_RDZV_CONF"].split(","))
    assert conf["protocol"] == "https"
    mounts = {m["name"]: m["mountPath"] for m in worker["volumeMounts"]}
    assert conf["ca_cert"].startswith(mounts["rendezvous-ca"] + "/")
    assert conf["ssl_cert"].startswith(mounts["rendezvous-client"] + "/")
    assert conf["ssl_cert_key"].startswith(mounts["rendezvous-client"] + "/")
    volumes = {v["name"]: v for v in pod_spec(sts)["volumes"]}
    assert volumes["rendezvous-ca"]["secret"]["secretName"] == "etcd-ca"
    assert volumes["rendezvous-client"]["secret"]["secretName"] == "etcd-client"


def test_nodes_processes_restarts_and_monitor_interval() -> None:
    """job.minNodes/maxNodes/nprocPerNode, rendezvous.maxRestarts/monitorInterval as strings."""
    env = _worker_env(
        sets=[
            "job.minNodes=2",
            "job.maxNodes=4",
            "job.nprocPerNode=1",
            "workerGroups.default.replicas=4",
            "rendezvous.maxRestarts=7",
        ],
        extra=["--set-json", "rendezvous.monitorInterval=0.25"],
    )
    assert (env["ELASTIC_MIN_NODES"], env["ELASTIC_MAX_NODES"]) == ("2", "4")
    assert env["ELASTIC_NPROC_PER_NODE"] == "1"
    assert env["ELASTIC_MAX_RESTARTS"] == "7"
    assert env["ELASTIC_MONITOR_INTERVAL"] == "0.25"


def test_gate_and_mesh_settings() -> None:
    """gate.timeoutSeconds/peers and mesh.interfaces/required as strings."""
    env = _worker_env(
        sets=[
            "gate.timeoutSeconds=90",
            "gate.peers=false",
            "mesh.interfaces=wg*\\,tun*",
            "mesh.required=true",
        ]
    )
    assert env["ELASTIC_GATE_TIMEOUT"] == "90"
    assert env["ELASTIC_GATE_PEERS"] == "false"
    assert env["ELASTIC_MESH_INTERFACES"] == "wg*,tun*"
    assert env["ELASTIC_MESH_REQUIRED"] == "true"
    assert _worker_env()["ELASTIC_MESH_INTERFACES"] == "wg*"
    assert _worker_env()["ELASTIC_INJECT_ENV"] == "/etc/inject/env"


def test_grace_period_env_equals_the_pods_termination_grace_period() -> None:
    """worker.terminationGracePeriodSeconds -> pod spec and ELASTIC_GRACE_PERIOD."""
    sts = _sts(sets=["worker.terminationGracePeriodSeconds=110"])
    assert pod_spec(sts)["terminationGracePeriodSeconds"] == 110
    assert env_of(container(sts, "worker"))["ELASTIC_GRACE_PERIOD"] == "110"


@pytest.mark.parametrize(
    ("sets", "expected"),
    [
        ([], "true"),
        (["rbac.scaleDown.enabled=false"], "false"),
        (["worker.automountServiceAccountToken=false"], "false"),
        (["serviceAccount.create=false"], "false"),
        (["serviceAccount.create=false", "serviceAccount.name=trainer"], "true"),
    ],
)
def test_scale_down_is_true_only_when_the_role_allows_it(sets: list[str], expected: str) -> None:
    """ELASTIC_SCALE_DOWN: rbac.scaleDown.enabled, a bound ServiceAccount and its token."""
    assert _worker_env(sets=sets)["ELASTIC_SCALE_DOWN"] == expected


def test_statefulsets_env_lists_every_group_of_the_release() -> None:
    """ELASTIC_STATEFULSETS = this release's worker StatefulSets, comma-separated."""
    objs = objects(ELASTIC_JOB, values=[ELASTIC_JOB / "ci" / "multigroup-values.yaml"])
    names = [s["metadata"]["name"] for s in worker_statefulsets(objs)]
    for sts in worker_statefulsets(objs):
        assert env_of(container(sts, "worker"))["ELASTIC_STATEFULSETS"] == ",".join(names)


def test_worker_command_is_the_entrypoint_and_args_the_users_command() -> None:
    """command [elastic-worker]; args = job.command, numbers as strings."""
    worker = container(_sts(), "worker")
    assert worker["command"] == ["elastic-worker"]
    assert worker["args"] == [str(a) for a in DEFAULTS["job"]["command"]]
    worker = container(_sts(sets=["job.command={python,/w/train.py,--epochs,3}"]), "worker")
    assert worker["args"] == ["python", "/w/train.py", "--epochs", "3"]


def test_default_command_trains_the_reference_script() -> None:
    """The default job.command runs /opt/elastic-worker/examples/train.py."""
    assert DEFAULTS["job"]["command"][:2] == ["python", "/opt/elastic-worker/examples/train.py"]


def test_images_default_to_the_pinned_app_version() -> None:
    """worker.image / initTopology.image: ghcr.io/elastic-job/*:<appVersion>, IfNotPresent."""
    sts = _sts()
    worker, init = container(sts, "worker"), container(sts, "init-topology")
    assert worker["image"] == "ghcr.io/elastic-job/worker:0.1.0"
    assert init["image"] == "ghcr.io/elastic-job/init-topology:0.1.0"
    assert worker["imagePullPolicy"] == init["imagePullPolicy"] == "IfNotPresent"
    sts = _sts(sets=["worker.image.tag=1.2.3", "worker.image.repository=reg.example/w"])
    assert container(sts, "worker")["image"] == "reg.example/w:1.2.3"


def test_volumes_inject_and_shm() -> None:
    """`inject` emptyDir at /etc/inject (read-only in the worker), `dshm` memory emptyDir at
    /dev/shm with worker.shmSizeLimit."""
    sts = _sts(sets=["worker.shmSizeLimit=2Gi"])
    volumes = {v["name"]: v for v in pod_spec(sts)["volumes"]}
    assert "emptyDir" in volumes["inject"]
    assert volumes["dshm"]["emptyDir"] == {"medium": "Memory", "sizeLimit": "2Gi"}
    worker_mounts = {m["name"]: m for m in container(sts, "worker")["volumeMounts"]}
    assert worker_mounts["inject"] == {
        "name": "inject",
        "mountPath": "/etc/inject",
        "readOnly": True,
    }
    assert worker_mounts["dshm"]["mountPath"] == "/dev/shm"
    init_mounts = container(sts, "init-topology")["volumeMounts"]
    assert init_mounts == [{"name": "inject", "mountPath": "/etc/inject"}]


def test_gpus_are_requested_and_limited() -> None:
    """worker.gpus=8 -> `nvidia.com/gpu: 8` in limits and requests; gpuResourceName renames."""
    res = container(_sts(sets=["worker.gpus=8", "job.nprocPerNode=8"]), "worker")["resources"]
    assert res["limits"]["nvidia.com/gpu"] == 8
    assert res["requests"]["nvidia.com/gpu"] == 8
    res = container(_sts(sets=["worker.gpus=1", "worker.gpuResourceName=amd.com/gpu"]), "worker")[
        "resources"
    ]
    assert res["limits"] == {"amd.com/gpu": 1}


def test_no_resources_by_default() -> None:
    """worker.resources is empty by default (the user's choice): no resources rendered."""
    assert "resources" not in container(_sts(), "worker")


def test_group_settings_merge_over_worker_defaults() -> None:
    """Groups: nodeSelector and env merge (group wins); tolerations, resources, gpus replace."""
    values = {
        "worker": {
            "nodeSelector": {"pool": "gpu", "zone": "a"},
            "tolerations": [{"key": "base", "operator": "Exists"}],
            "env": {"SHARED": "1", "WHO": "worker"},
            "resources": {"requests": {"cpu": "1"}},
            "gpus": 1,
        },
        "workerGroups": {
            "default": None,
            "anchor": {"replicas": 1},
            "spot": {
                "replicas": 2,
                "nodeSelector": {"zone": "b", "spot": "true"},
                "tolerations": [{"key": "spot", "operator": "Exists"}],
                "env": {"WHO": "spot"},
                "resources": {"requests": {"cpu": "2"}},
                "gpus": 0,
            },
        },
    }
    path = Path(pytest.importorskip("tempfile").mkdtemp()) / "values.yaml"
    path.write_text(yaml.safe_dump(values))
    anchor, spot = worker_statefulsets(objects(ELASTIC_JOB, values=[path]))
    assert pod_spec(anchor)["nodeSelector"] == {"pool": "gpu", "zone": "a"}
    assert pod_spec(spot)["nodeSelector"] == {"pool": "gpu", "zone": "b", "spot": "true"}
    assert pod_spec(anchor)["tolerations"] == [{"key": "base", "operator": "Exists"}]
    assert pod_spec(spot)["tolerations"] == [{"key": "spot", "operator": "Exists"}]
    assert env_of(container(anchor, "worker"))["WHO"] == "worker"
    assert env_of(container(spot, "worker"))["WHO"] == "spot"
    assert env_of(container(spot, "worker"))["SHARED"] == "1"
    assert container(anchor, "worker")["resources"] == {
        "requests": {"cpu": "1", "nvidia.com/gpu": 1},
        "limits": {"nvidia.com/gpu": 1},
    }
    assert container(spot, "worker")["resources"] == {"requests": {"cpu": "2"}}


def test_user_env_value_from_is_rendered() -> None:
    """worker.env entries may be `{valueFrom: ...}`."""
    objs = objects(ELASTIC_JOB, values=[ELASTIC_JOB / "ci" / "multigroup-values.yaml"])
    spot = next(s for s in worker_statefulsets(objs) if s["metadata"]["name"].endswith("spot"))
    assert env_of(container(spot, "worker"))["HOST_IP"] == {
        "fieldRef": {"fieldPath": "status.hostIP"}
    }


# --- the init container -----------------------------------------------------------------


def test_init_container_contract() -> None:
    """init-topology: command [init-topology], no args, the contract env in order."""
    init = container(_sts(), "init-topology")
    assert init["command"] == ["init-topology"]
    assert "args" not in init
    assert _names(init) == INIT_ENV
    env = env_of(init)
    assert env["NODE_NAME"] == {"fieldRef": {"fieldPath": "spec.nodeName"}}
    assert env["TOPOLOGY_OUTPUT"] == "/etc/inject/env"
    assert env["TOPOLOGY_STRICT"] == "false"
    assert env["TOPOLOGY_TIMEOUT_SECONDS"] == str(DEFAULTS["topology"]["timeoutSeconds"])


def test_topology_label_map_is_the_values_map_as_json() -> None:
    """topology.labelMap -> TOPOLOGY_LABEL_MAP (JSON object, name -> ordered label keys)."""
    env = env_of(container(_sts(), "init-topology"))
    assert json.loads(env["TOPOLOGY_LABEL_MAP"]) == DEFAULTS["topology"]["labelMap"]
    example = yaml.safe_load((EXAMPLES / "eks-efa.yaml").read_text())
    (sts,) = worker_statefulsets(objects(ELASTIC_JOB, values=[EXAMPLES / "eks-efa.yaml"]))
    label_map = json.loads(env_of(container(sts, "init-topology"))["TOPOLOGY_LABEL_MAP"])
    assert label_map == {**DEFAULTS["topology"]["labelMap"], **example["topology"]["labelMap"]}


def test_topology_strict_and_timeout() -> None:
    """topology.strict / timeoutSeconds -> TOPOLOGY_STRICT / TOPOLOGY_TIMEOUT_SECONDS."""
    env = env_of(
        container(
            _sts(sets=["topology.strict=true", "topology.timeoutSeconds=12"]), "init-topology"
        )
    )
    assert (env["TOPOLOGY_STRICT"], env["TOPOLOGY_TIMEOUT_SECONDS"]) == ("true", "12")


def test_topology_user_env_names_the_users_worker_variables() -> None:
    """TOPOLOGY_USER_ENV: comma-separated, sorted names of the group's merged env."""
    objs = objects(ELASTIC_JOB, values=[ELASTIC_JOB / "ci" / "multigroup-values.yaml"])
    by_name = {s["metadata"]["name"].rsplit("-", 1)[1]: s for s in worker_statefulsets(objs)}
    anchor = env_of(container(by_name["anchor"], "init-topology"))["TOPOLOGY_USER_ENV"]
    spot = env_of(container(by_name["spot"], "init-topology"))["TOPOLOGY_USER_ENV"]
    assert anchor == "NCCL_DEBUG,WORKER_POOL"
    assert spot == "HOST_IP,NCCL_DEBUG,WORKER_POOL"
    assert env_of(container(_sts(), "init-topology"))["TOPOLOGY_USER_ENV"] == ""


# --- pod-level settings -----------------------------------------------------------------


def test_pod_security_restricted_by_default() -> None:
    """Non-root, seccomp RuntimeDefault, no privilege escalation, drop ALL (both containers)."""
    sts = _sts()
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
    spec = pod_spec(_sts())
    assert spec["serviceAccountName"] == f"{RELEASE}-elastic-job"
    assert spec["automountServiceAccountToken"] is True
    assert (
        pod_spec(_sts(sets=["worker.automountServiceAccountToken=false"]))[
            "automountServiceAccountToken"
        ]
        is False
    )


def test_priority_class_and_group_override() -> None:
    """worker.priorityClassName, replaced per group."""
    assert pod_spec(_sts(sets=["worker.priorityClassName=high"]))["priorityClassName"] == "high"
    assert "priorityClassName" not in pod_spec(_sts())
    spec = pod_spec(
        _sts(sets=["worker.priorityClassName=high", "workerGroups.default.priorityClassName=low"])
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
    sts = _sts()
    assert "schedulerName" not in pod_spec(sts)
    assert "annotations" not in sts["spec"]["template"]["metadata"]


def test_checkov_skips_follow_the_settings() -> None:
    """Resource-limit skips disappear once worker.resources sets requests and limits."""
    annotations = _sts()["metadata"]["annotations"]
    assert any(v.startswith("CKV_K8S_11=") for v in annotations.values())
    annotations = _sts(values=[ELASTIC_JOB / "ci" / "cpu-values.yaml"])["metadata"]["annotations"]
    assert not any(
        v.split("=")[0] in {"CKV_K8S_10", "CKV_K8S_11", "CKV_K8S_12", "CKV_K8S_13"}
        for v in annotations.values()
    )
    assert list(annotations) == [f"checkov.io/skip{i}" for i in range(1, len(annotations) + 1)]


def test_worker_runs_as_the_worker_images_user_and_init_as_65532() -> None:
    """The worker container runs as the worker image's user 10001 (HOME for caches); the
    pod's user (init-topology's, 65532) and fsGroup stay as the init container needs."""
    sts = _sts()
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
    worker = container(_sts(values=[values]), "worker")
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
    env = _worker_env(sets=["job.nprocPerNode=gpu", "worker.gpus=8"])
    assert env["ELASTIC_NPROC_PER_NODE"] == "gpu"
