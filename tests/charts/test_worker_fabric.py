"""The pod settings GPU fabrics need (worker.* in values.yaml) and the settings every object
and image of both charts honours (global.commonLabels, global.imageRegistry, digests,
imagePullSecrets), rendered from tests/charts/values/fabric-pod-settings.yaml and the GKE
GPUDirect-TCPXO example."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pod_security
import pytest
import yaml
from chart_render import (
    ELASTIC_JOB,
    ETCD,
    EXAMPLES,
    TEST_VALUES,
    cases,
    container,
    env_of,
    etcd_statefulset,
    objects,
    of_kind,
    pod_spec,
    worker_statefulsets,
)

FABRIC = TEST_VALUES / "fabric-pod-settings.yaml"
TCPXO = EXAMPLES / "gke-a3-tcpxo.yaml"
DIGEST = "sha256:" + "b" * 64
# The etcd tag a default install runs (etcd-rendezvous values.yaml; tests/release checks it).
ETCD_TAG = yaml.safe_load((ETCD / "values.yaml").read_text())["image"]["tag"]


def _worker(values: Path) -> dict[str, Any]:
    (sts,) = worker_statefulsets(objects(ELASTIC_JOB, values=[values]))
    return sts


def _pod_templates(objs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [o for o in objs if o["kind"] == "Pod"] + [
        o for o in objs if "template" in o.get("spec", {})
    ]


def _images(objs: list[dict[str, Any]]) -> list[str]:
    out = []
    for obj in _pod_templates(objs):
        spec = pod_spec(obj)
        out += [c["image"] for c in [*spec.get("initContainers", []), *spec["containers"]]]
    return out


# --- containers -------------------------------------------------------------------------


def test_extra_init_containers_follow_init_topology_and_sidecars_keep_restart_policy() -> None:
    """worker.extraInitContainers run after init-topology, in order; `restartPolicy: Always`
    (a native sidecar) reaches the pod as written."""
    spec = pod_spec(_worker(FABRIC))
    assert [c["name"] for c in spec["initContainers"]] == [
        "init-topology",
        "warm-cache",
        "fabric-daemon",
    ]
    sidecar = spec["initContainers"][2]
    assert sidecar["restartPolicy"] == "Always"
    assert sidecar["startupProbe"]["exec"]["command"] == ["cat", "/run/ready"]
    assert "restartPolicy" not in spec["initContainers"][1]


def test_extra_containers_follow_the_worker() -> None:
    spec = pod_spec(_worker(FABRIC))
    assert [c["name"] for c in spec["containers"]] == ["worker", "log-shipper"]


def test_no_extra_containers_by_default() -> None:
    spec = pod_spec(worker_statefulsets(objects(ELASTIC_JOB))[0])
    assert [c["name"] for c in spec["initContainers"]] == ["init-topology"]
    assert [c["name"] for c in spec["containers"]] == ["worker"]


# --- pod-level settings -------------------------------------------------------------------


def test_host_network_sets_cluster_first_with_host_net() -> None:
    """worker.hostNetwork: the node's namespace and dnsPolicy ClusterFirstWithHostNet, so
    the rendezvous' Service name still resolves; checkov is told why."""
    sts = _worker(FABRIC)
    spec = pod_spec(sts)
    assert spec["hostNetwork"] is True
    assert spec["dnsPolicy"] == "ClusterFirstWithHostNet"
    skips = sts["metadata"]["annotations"].values()
    assert any(s.startswith("CKV_K8S_19=worker.hostNetwork") for s in skips)


def test_pod_network_by_default() -> None:
    spec = pod_spec(worker_statefulsets(objects(ELASTIC_JOB))[0])
    assert "hostNetwork" not in spec
    assert "dnsPolicy" not in spec
    assert "runtimeClassName" not in spec
    assert "topologySpreadConstraints" not in spec


def test_runtime_class_and_topology_spread() -> None:
    spec = pod_spec(_worker(FABRIC))
    assert spec["runtimeClassName"] == "nvidia"
    (constraint,) = spec["topologySpreadConstraints"]
    assert constraint["topologyKey"] == "topology.kubernetes.io/zone"


def test_runtime_class_of_253_characters_the_longest_name_renders() -> None:
    """worker.runtimeClassName: a DNS subdomain of up to 253 characters (254 is refused,
    test_bad_values_fabric.py)."""
    name = ".".join(["a" * 63] * 4)[:253]
    (sts,) = worker_statefulsets(objects(ELASTIC_JOB, sets=[f"worker.runtimeClassName={name}"]))
    assert pod_spec(sts)["runtimeClassName"] == name


def test_a_groups_topology_spread_replaces_the_workers() -> None:
    objs = objects(
        ELASTIC_JOB,
        values=[FABRIC],
        sets=[
            "workerGroups.big.replicas=1",
            "workerGroups.big.topologySpreadConstraints[0].maxSkew=2",
            "workerGroups.big.topologySpreadConstraints[0].topologyKey=kubernetes.io/hostname",
            "workerGroups.big.topologySpreadConstraints[0].whenUnsatisfiable=DoNotSchedule",
        ],
    )
    by_group = {
        s["metadata"]["labels"]["elastic-job.pytorch.org/group"]: pod_spec(s)
        for s in worker_statefulsets(objs)
    }
    assert [c["topologyKey"] for c in by_group["big"]["topologySpreadConstraints"]] == [
        "kubernetes.io/hostname"
    ]
    assert [c["topologyKey"] for c in by_group["default"]["topologySpreadConstraints"]] == [
        "topology.kubernetes.io/zone"
    ]


def _spread_by_group(objs: list[dict[str, Any]]) -> dict[str, tuple[dict[str, Any], Any]]:
    """group -> (its StatefulSet's selector, its pods' topologySpreadConstraints)."""
    return {
        s["metadata"]["labels"]["elastic-job.pytorch.org/group"]: (
            s["spec"]["selector"]["matchLabels"],
            pod_spec(s)["topologySpreadConstraints"],
        )
        for s in worker_statefulsets(objs)
    }


def test_a_worker_spread_without_label_selector_spreads_each_groups_pods() -> None:
    """worker.topologySpreadConstraints without labelSelector: each group's constraint
    selects that group's pods (its StatefulSet's selector), not none."""
    objs = objects(ELASTIC_JOB, values=[ELASTIC_JOB / "ci" / "multigroup-values.yaml"])
    by_group = _spread_by_group(objs)
    assert sorted(by_group) == ["anchor", "spot"]
    for sts in worker_statefulsets(objs):
        selector, (constraint,) = by_group[
            sts["metadata"]["labels"]["elastic-job.pytorch.org/group"]
        ]
        assert constraint["labelSelector"] == {"matchLabels": selector}
        assert selector.items() <= sts["spec"]["template"]["metadata"]["labels"].items()
        assert constraint["topologyKey"] == "kubernetes.io/hostname"


def test_a_groups_spread_without_label_selector_spreads_that_groups_pods() -> None:
    """workerGroups.<name>.topologySpreadConstraints without labelSelector: the group's
    selector; matchLabelKeys keep their keys (the API refuses a key in both)."""
    group = "workerGroups.big.topologySpreadConstraints[0]"
    objs = objects(
        ELASTIC_JOB,
        sets=[
            "workerGroups.big.replicas=1",
            f"{group}.maxSkew=1",
            f"{group}.topologyKey=topology.kubernetes.io/zone",
            f"{group}.whenUnsatisfiable=DoNotSchedule",
            f"{group}.matchLabelKeys[0]=app.kubernetes.io/instance",
        ],
    )
    (sts,) = [s for s in worker_statefulsets(objs) if s["metadata"]["name"].endswith("-big")]
    selector = sts["spec"]["selector"]["matchLabels"]
    (constraint,) = pod_spec(sts)["topologySpreadConstraints"]
    assert constraint["labelSelector"] == {
        "matchLabels": {k: v for k, v in selector.items() if k != "app.kubernetes.io/instance"}
    }
    assert constraint["matchLabelKeys"] == ["app.kubernetes.io/instance"]
    assert selector["elastic-job.pytorch.org/group"] == "big"


def test_a_spread_with_its_own_label_selector_is_kept_as_written() -> None:
    (constraint,) = pod_spec(_worker(FABRIC))["topologySpreadConstraints"]
    assert constraint["labelSelector"] == {
        "matchLabels": {
            "app.kubernetes.io/instance": "run42",
            "app.kubernetes.io/component": "worker",
        }
    }


def test_env_from_reaches_the_worker_container_only() -> None:
    sts = _worker(FABRIC)
    assert container(sts, "worker")["envFrom"] == [
        {"configMapRef": {"name": "nccl-env"}},
        {"secretRef": {"name": "wandb", "optional": True}, "prefix": "WANDB_"},
    ]
    assert "envFrom" not in container(sts, "init-topology")


def test_image_pull_secrets_as_names_and_objects_in_both_charts() -> None:
    objs = objects(ELASTIC_JOB, values=[FABRIC])
    assert pod_spec(_worker(FABRIC))["imagePullSecrets"] == [
        {"name": "regcred"},
        {"name": "mirror-cred"},
    ]
    assert pod_spec(etcd_statefulset(objs))["imagePullSecrets"] == [{"name": "mirror-cred"}]
    test_pod = next(o for o in objs if o["kind"] == "Pod")
    assert test_pod["spec"]["imagePullSecrets"] == [{"name": "regcred"}, {"name": "mirror-cred"}]


# --- images -----------------------------------------------------------------------------


def test_image_registry_replaces_the_host_of_every_chart_image() -> None:
    """global.imageRegistry reaches init-topology, worker, the test pod and etcd; images the
    user wrote (extra containers) stay as written."""
    objs = objects(ELASTIC_JOB, values=[FABRIC])
    images = _images(objs)
    ours = [i for i in images if not i.startswith("registry.example.com/")]
    assert sorted(ours) == sorted(
        [
            f"mirror.example.com:5000/elastic-job/init-topology:0.1.0@sha256:{'a' * 64}",
            f"mirror.example.com:5000/elastic-job/worker:0.1.0@{DIGEST}",
            f"mirror.example.com:5000/etcd-development/etcd:{ETCD_TAG}@sha256:{'c' * 64}",
            # The test pod runs the worker image, digest included.
            f"mirror.example.com:5000/elastic-job/worker:0.1.0@{DIGEST}",
        ]
    )
    assert "registry.example.com/tools/log-shipper:0.9.1" in images


@pytest.mark.parametrize(
    ("repository", "expected"),
    [
        ("ghcr.io/elastic-job/worker", "mirror.local/elastic-job/worker:1.0"),
        ("localhost:5000/worker", "mirror.local/worker:1.0"),
        ("library/worker", "mirror.local/library/worker:1.0"),
        ("worker", "mirror.local/worker:1.0"),
    ],
)
def test_image_registry_keeps_the_path_after_the_host(repository: str, expected: str) -> None:
    sts = worker_statefulsets(
        objects(
            ELASTIC_JOB,
            sets=[
                "global.imageRegistry=mirror.local/",
                f"worker.image.repository={repository}",
                "worker.image.tag=1.0",
            ],
        )
    )[0]
    assert container(sts, "worker")["image"] == expected


def test_etcd_chart_alone_honours_registry_and_digest() -> None:
    objs = objects(
        ETCD,
        sets=["global.imageRegistry=mirror.local", f"image.digest={DIGEST}"],
    )
    spec = pod_spec(etcd_statefulset(objs))
    want = f"mirror.local/etcd-development/etcd:{ETCD_TAG}@{DIGEST}"
    assert spec["containers"][0]["image"] == want


def test_test_pod_takes_no_worker_digest_for_another_image() -> None:
    """tests.image set to another image: the worker's digest does not follow it."""
    objs = objects(
        ELASTIC_JOB,
        sets=[
            f"worker.image.digest={DIGEST}",
            "tests.image.repository=python",
            "tests.image.tag=3.12",
        ],
    )
    test_pod = next(o for o in objs if o["kind"] == "Pod")
    assert test_pod["spec"]["containers"][0]["image"] == "python:3.12"


# --- labels -----------------------------------------------------------------------------


def test_common_labels_on_every_object_of_both_charts_never_in_selectors() -> None:
    """global.commonLabels on each rendered object and pod template; a pod's own podLabels
    win; selectors are unchanged."""
    objs = objects(ELASTIC_JOB, values=[FABRIC])
    for obj in objs:
        labels = obj["metadata"]["labels"]
        assert labels["team"] == "ml", obj["metadata"]["name"]
        assert labels["cost-center"] == "4711"
    worker = _worker(FABRIC)
    assert worker["spec"]["template"]["metadata"]["labels"]["team"] == "research"
    assert "team" not in worker["spec"]["selector"]["matchLabels"]
    etcd = etcd_statefulset(objs)
    assert etcd["spec"]["template"]["metadata"]["labels"]["team"] == "ml"
    assert "team" not in etcd["spec"]["selector"]["matchLabels"]
    assert len(objs) >= 10


def test_renders_without_fabric_values_carry_none_of_them() -> None:
    """Empty defaults change nothing: no common label, registry or digest leaks into the
    other configurations' renders."""
    for case in cases():
        if case.values and case.values[0].name in {FABRIC.name, TCPXO.name}:
            continue
        for obj in objects(case):
            assert "team" not in obj["metadata"].get("labels", {}), case
        for image in _images(objects(case)):
            assert "mirror" not in image and "@" not in image, (case, image)


# --- the GKE A3 Mega GPUDirect-TCPXO example ----------------------------------------------


def test_tcpxo_example_runs_the_daemon_as_a_native_sidecar_after_the_plugin() -> None:
    spec = pod_spec(_worker(TCPXO))
    names = [c["name"] for c in spec["initContainers"]]
    assert names == ["init-topology", "nccl-plugin-installer", "tcpxo-daemon"]
    daemon = spec["initContainers"][2]
    assert daemon["restartPolicy"] == "Always"
    assert daemon["securityContext"]["capabilities"]["add"] == ["NET_ADMIN", "NET_BIND_SERVICE"]
    assert "privileged" not in daemon["securityContext"]
    assert "restartPolicy" not in spec["initContainers"][1]


def test_tcpxo_example_wires_the_nics_libraries_and_nccl_settings() -> None:
    sts = _worker(TCPXO)
    spec = pod_spec(sts)
    annotations = sts["spec"]["template"]["metadata"]["annotations"]
    assert annotations["networking.gke.io/default-interface"] == "eth0"
    assert '"interfaceName":"eth8"' in annotations["networking.gke.io/interfaces"]
    assert "/dev/nvidia7" in annotations["devices.gke.io/container.tcpxo-daemon"]
    env = env_of(container(sts, "worker"))
    assert env["LD_LIBRARY_PATH"] == "/usr/local/nvidia/lib64:/usr/local/tcpxo/lib64"
    assert env["NCCL_SOCKET_IFNAME"] == "eth0"
    assert env["NCCL_FASTRAK_IFNAME"] == ",".join(f"eth{i}" for i in range(1, 9))
    assert env["NCCL_TUNER_CONFIG_PATH"].startswith("/usr/local/tcpxo/lib64/")
    mounts = {m["name"]: m["mountPath"] for m in container(sts, "worker")["volumeMounts"]}
    assert mounts["tcpxo-plugin"] == "/usr/local/tcpxo/lib64"
    assert mounts["aperture-devices"] == env["NCCL_FASTRAK_LLCM_DEVICE_DIRECTORY"]
    installer = {m["name"]: m["mountPath"] for m in spec["initContainers"][1]["volumeMounts"]}
    assert installer["tcpxo-plugin"] == mounts["tcpxo-plugin"]
    assert "hostNetwork" not in spec
    assert of_kind(objects(ELASTIC_JOB, values=[TCPXO]), "NetworkPolicy")


# --- Pod Security levels ------------------------------------------------------------------


def test_defaults_and_fabric_free_pods_are_restricted() -> None:
    """The chart's own pods meet `restricted` (worker, etcd, test pod)."""
    for obj in _pod_templates(objects(ELASTIC_JOB)):
        assert pod_security.pod_level(pod_spec(obj)) == "restricted", (
            obj["metadata"]["name"],
            pod_security.restricted_violations(pod_spec(obj)),
        )


def test_tcpxo_example_needs_privileged_as_it_says() -> None:
    """The example's comment says `privileged`: hostPath volumes and NET_ADMIN."""
    spec = pod_spec(_worker(TCPXO))
    assert pod_security.pod_level(spec) == "privileged"
    assert pod_security.claimed_level(TCPXO.read_text()) == "privileged"
    violations = pod_security.baseline_violations(spec, {})
    assert "volume sys: hostPath" in violations
    assert (
        "container tcpxo-daemon: capabilities.add ['NET_ADMIN'] (not in baseline's list)"
        in violations
    )


def test_host_network_needs_privileged_and_secure_extras_stay_otherwise_restricted() -> None:
    spec = pod_spec(_worker(FABRIC))
    assert pod_security.baseline_violations(spec, {}) == ["hostNetwork: true"]
    assert pod_security.restricted_violations(spec) == []
    assert pod_security.pod_level(spec) == "privileged"
