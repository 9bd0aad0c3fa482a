"""templates/worker-statefulset.yaml, the worker container as docs/contracts.md fixes it:
env, rendezvous settings, command, images, volumes, resources, group settings."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from chart_render import (
    ELASTIC_JOB,
    NAMESPACE,
    RELEASE,
    container,
    env_of,
    objects,
    one,
    pod_spec,
    worker_statefulsets,
)
from worker_sts import CONTRACT_ENV, DEFAULTS, env_names, render_sts, worker_env

# --- the worker container ---------------------------------------------------------------


def test_worker_env_is_the_contract_list_in_order_then_user_env_sorted() -> None:
    """Env names exactly as docs/contracts.md lists them, then worker.env sorted by name."""
    sts = render_sts(sets=["worker.env.ZED=1", "worker.env.ALPHA=a"])
    assert env_names(container(sts, "worker")) == [*CONTRACT_ENV, "ALPHA", "ZED"]


def test_checkpoint_enabled_mounts_the_claim_and_sets_checkpoint_dir() -> None:
    """checkpoint.enabled + existingClaim: volume `checkpoint` (the PVC) at
    checkpoint.mountPath and CHECKPOINT_DIR set to it."""
    sts = render_sts(
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
    sts = render_sts()
    assert "CHECKPOINT_DIR" not in env_of(container(sts, "worker"))
    assert "checkpoint" not in {v["name"] for v in pod_spec(sts)["volumes"]}


def test_every_env_value_is_a_string() -> None:
    """All env values are strings (numbers and booleans quoted)."""
    sts = render_sts(sets=["worker.env.N=3", "worker.env.B=true"])
    for ctr in (container(sts, "worker"), container(sts, "init-topology")):
        for item in ctr["env"]:
            assert isinstance(item.get("value", ""), str), item


def test_downward_api_fields() -> None:
    """POD_NAME, POD_NAMESPACE, POD_IP, NODE_NAME from the downward API."""
    env = worker_env()
    assert env["POD_NAME"] == {"fieldRef": {"fieldPath": "metadata.name"}}
    assert env["POD_NAMESPACE"] == {"fieldRef": {"fieldPath": "metadata.namespace"}}
    assert env["POD_IP"] == {"fieldRef": {"fieldPath": "status.podIP"}}
    assert env["NODE_NAME"] == {"fieldRef": {"fieldPath": "spec.nodeName"}}


def test_job_id_defaults_to_namespace_and_release() -> None:
    """job.id empty: ELASTIC_JOB_ID = `<namespace>-<release>`."""
    assert worker_env()["ELASTIC_JOB_ID"] == f"{NAMESPACE}-{RELEASE}"


def test_job_id_is_lowercased_and_cut_to_63_without_trailing_dash() -> None:
    """job.id: lower-cased, cut to 63 characters, trailing '-' removed."""
    namespace = "n" * 62  # "<namespace>-<release>" cut at 63 ends with the "-"
    assert worker_env(namespace=namespace)["ELASTIC_JOB_ID"] == "n" * 62
    assert worker_env(sets=["job.id=Run-7"])["ELASTIC_JOB_ID"] == "run-7"
    assert worker_env(sets=["job.id=" + "A" * 63])["ELASTIC_JOB_ID"] == "a" * 63


def test_job_id_is_stable_across_renders_and_releases() -> None:
    """The job id depends on release and namespace only."""
    assert worker_env(namespace="team-a")["ELASTIC_JOB_ID"] == f"team-a-{RELEASE}"
    assert worker_env(release="other")["ELASTIC_JOB_ID"] == f"{NAMESPACE}-other"


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


def test_rendezvous_backend_reaches_the_worker_from_the_global() -> None:
    """global.rendezvousBackend -> ELASTIC_RDZV_BACKEND: etcd-v2 by default, etcd-v3 when
    set; the same value the bundled etcd follows (test_etcd_statefulset.py)."""
    assert worker_env()["ELASTIC_RDZV_BACKEND"] == "etcd-v2"
    for backend in ("etcd-v3", "etcd-lease"):
        env = worker_env(sets=[f"global.rendezvousBackend={backend}"])
        assert env["ELASTIC_RDZV_BACKEND"] == backend


def test_etcd_lease_heartbeats_every_second_at_any_size() -> None:
    """global.rendezvousBackend=etcd-lease: no keep_alive_interval in ELASTIC_RDZV_CONF at
    any job.maxNodes (the worker's default, 1 s: a lease keep-alive does not contend)."""
    sets = [
        "global.rendezvousBackend=etcd-lease",
        "job.maxNodes=1024",
        "workerGroups.default.replicas=1024",
    ]
    assert "keep_alive_interval" not in worker_env(sets=sets)["ELASTIC_RDZV_CONF"]


def test_etcd_v3_backend_keeps_the_rdzv_conf_and_its_tls_keys() -> None:
    """The etcd-v3 handler reads the same keys (torch's dynamic rendezvous timings; protocol,
    ca_cert, ssl_cert, ssl_cert_key for TLS), so ELASTIC_RDZV_CONF does not change."""
    tls = [
        "rendezvous.tls.enabled=true",
        "rendezvous.tls.caSecret=ca",
        "rendezvous.tls.clientCertSecret=client",
        "etcd-rendezvous.enabled=false",
        "rendezvous.endpoint=etcd.shared:2379",
    ]
    v2 = worker_env(sets=tls)["ELASTIC_RDZV_CONF"]
    v3 = worker_env(sets=[*tls, "global.rendezvousBackend=etcd-v3"])["ELASTIC_RDZV_CONF"]
    assert v3 == v2
    assert "protocol=https,ca_cert=/etc/elastic-job/rendezvous-ca/ca.crt" in v3


def test_rendezvous_settings_become_torchrun_rdzv_conf() -> None:
    """rendezvous.* -> ELASTIC_RDZV_CONF `join_timeout=..,last_call_timeout=..,close_timeout=..,
    keep_alive_interval=..,keep_alive_max_attempt=..` (etcd-v2 dynamic handler keys)."""
    env = worker_env(
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
    assert r["keepAliveInterval"] is None  # the worker's, from job.maxNodes: not rendered
    assert worker_env()["ELASTIC_RDZV_CONF"] == (
        f"join_timeout={r['joinTimeout']},last_call_timeout={r['lastCallTimeout']},"
        f"close_timeout={r['closeTimeout']},"
        f"keep_alive_max_attempt={r['keepAliveMaxAttempt']}{extra}"
    )
    assert worker_env()["ELASTIC_MONITOR_INTERVAL"] == str(r["monitorInterval"])
    assert worker_env()["ELASTIC_MAX_RESTARTS"] == str(r["maxRestarts"])


def test_rdzv_extra_conf_is_appended_sorted() -> None:
    """rendezvous.extraConf entries follow, sorted by key."""
    conf = worker_env(
        sets=["rendezvous.extraConf.read_timeout=30", "rendezvous.extraConf.heartbeat_timeout=10"]
    )["ELASTIC_RDZV_CONF"]
    assert conf.endswith(",heartbeat_timeout=10,read_timeout=30")


def test_rendezvous_tls_adds_protocol_and_ca_cert_and_mounts_them() -> None:
    """rendezvous.tls: `protocol=https,ca_cert=...` (and the client cert) in the conf, and
    the Secrets mounted where the conf points."""
    sts = render_sts(
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
    env = worker_env(
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


def test_warm_start_settings_reach_the_worker() -> None:
    """job.warmStart: on by default with torch and its distributed stack preloaded; off and
    the preload list as set."""
    default = worker_env()
    assert default["ELASTIC_WARM_START"] == "true"
    assert default["ELASTIC_WARM_PRELOAD"] == (
        "torch,torch._dynamo,torch.distributed.checkpoint,torch.distributed.fsdp"
    )
    env = worker_env(
        sets=["job.warmStart.enabled=false"],
        extra=["--set-json", 'job.warmStart.preload=["torch","torchvision.models"]'],
    )
    assert env["ELASTIC_WARM_START"] == "false"
    assert env["ELASTIC_WARM_PRELOAD"] == "torch,torchvision.models"


def test_exit_barrier_timeout_seconds_reaches_the_worker_60_s_by_default() -> None:
    """job.exitBarrierTimeoutSeconds -> ELASTIC_EXIT_BARRIER_TIMEOUT: how long a node that
    finished waits for the others (torchrun's own 300 s is what a user would get without
    it), and half of it for a warm process's teardown."""
    assert DEFAULTS["job"]["exitBarrierTimeoutSeconds"] == 60
    assert worker_env()["ELASTIC_EXIT_BARRIER_TIMEOUT"] == "60"
    env = worker_env(extra=["--set-json", "job.exitBarrierTimeoutSeconds=12.5"])
    assert env["ELASTIC_EXIT_BARRIER_TIMEOUT"] == "12.5"


def test_the_lifeline_is_on_by_default_on_its_named_port_and_off_when_disabled() -> None:
    """rendezvous.lifeline: the container port `lifeline` and the two variables; off, no
    port (and no ports at all without the metrics)."""
    on = container(render_sts(), "worker")
    assert {"name": "lifeline", "containerPort": 9406, "protocol": "TCP"} in on["ports"]
    assert (env_of(on)["ELASTIC_LIFELINE"], env_of(on)["ELASTIC_LIFELINE_PORT"]) == ("true", "9406")
    moved = container(render_sts(sets=["rendezvous.lifeline.port=29406"]), "worker")
    assert {"name": "lifeline", "containerPort": 29406, "protocol": "TCP"} in moved["ports"]
    assert env_of(moved)["ELASTIC_LIFELINE_PORT"] == "29406"
    off = container(
        render_sts(sets=["rendezvous.lifeline.enabled=false", "monitoring.enabled=false"]), "worker"
    )
    assert "ports" not in off
    assert env_of(off)["ELASTIC_LIFELINE"] == "false"


def test_gate_and_mesh_settings() -> None:
    """gate.timeoutSeconds/peers and mesh.interfaces/required as strings."""
    env = worker_env(
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
    assert worker_env()["ELASTIC_MESH_INTERFACES"] == "wg*"
    assert worker_env()["ELASTIC_INJECT_ENV"] == "/etc/inject/env"


def test_grace_period_env_equals_the_pods_termination_grace_period() -> None:
    """worker.terminationGracePeriodSeconds -> pod spec and ELASTIC_GRACE_PERIOD."""
    sts = render_sts(sets=["worker.terminationGracePeriodSeconds=110"])
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
    assert worker_env(sets=sets)["ELASTIC_SCALE_DOWN"] == expected


def test_worker_command_is_the_entrypoint_and_args_the_users_command() -> None:
    """command [elastic-worker]; args = job.command, numbers as strings."""
    worker = container(render_sts(), "worker")
    assert worker["command"] == ["elastic-worker"]
    assert worker["args"] == [str(a) for a in DEFAULTS["job"]["command"]]
    worker = container(render_sts(sets=["job.command={python,/w/train.py,--epochs,3}"]), "worker")
    assert worker["args"] == ["python", "/w/train.py", "--epochs", "3"]


def test_default_command_trains_the_reference_script() -> None:
    """The default job.command runs /opt/elastic-worker/examples/train.py."""
    assert DEFAULTS["job"]["command"][:2] == ["python", "/opt/elastic-worker/examples/train.py"]


def test_images_default_to_the_pinned_app_version() -> None:
    """worker.image / initTopology.image: ghcr.io/elastic-job/*:<appVersion>, IfNotPresent."""
    sts = render_sts()
    worker, init = container(sts, "worker"), container(sts, "init-topology")
    assert worker["image"] == "ghcr.io/elastic-job/worker:0.1.0"
    assert init["image"] == "ghcr.io/elastic-job/init-topology:0.1.0"
    assert worker["imagePullPolicy"] == init["imagePullPolicy"] == "IfNotPresent"
    sts = render_sts(sets=["worker.image.tag=1.2.3", "worker.image.repository=reg.example/w"])
    assert container(sts, "worker")["image"] == "reg.example/w:1.2.3"


def test_volumes_inject_and_shm() -> None:
    """`inject` emptyDir at /etc/inject (read-only in the worker), `dshm` memory emptyDir at
    /dev/shm with worker.shmSizeLimit."""
    sts = render_sts(sets=["worker.shmSizeLimit=2Gi"])
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
    res = container(render_sts(sets=["worker.gpus=8", "job.nprocPerNode=8"]), "worker")["resources"]
    assert res["limits"]["nvidia.com/gpu"] == 8
    assert res["requests"]["nvidia.com/gpu"] == 8
    res = container(
        render_sts(sets=["worker.gpus=1", "worker.gpuResourceName=amd.com/gpu"]), "worker"
    )["resources"]
    assert res["limits"] == {"amd.com/gpu": 1}


def test_no_resources_by_default() -> None:
    """worker.resources is empty by default (the user's choice): no resources rendered."""
    assert "resources" not in container(render_sts(), "worker")


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
    # (then nodeLoss's not-ready and unreachable tolerations: test_worker_node_loss.py)
    assert pod_spec(anchor)["tolerations"][0] == {"key": "base", "operator": "Exists"}
    assert pod_spec(spot)["tolerations"][0] == {"key": "spot", "operator": "Exists"}
    assert len(pod_spec(spot)["tolerations"]) == 3
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
