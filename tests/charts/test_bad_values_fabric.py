"""Bad values of the Kueue and fabric settings (gang.kueue, worker.extra*Containers,
hostNetwork, global.commonLabels, digests, pull secrets) fail `helm template` with Helm 3
and 4, naming the value, as in test_bad_values.py."""

from __future__ import annotations

from pathlib import Path

import pytest
from chart_render import ETCD
from test_bad_values import Bad, assert_refused

DIGEST = "sha256:" + "0" * 64
KUEUE = ("gang.kueue.enabled=true", "gang.kueue.queueName=team-a")

CASES = [
    Bad(
        "volcano-and-kueue",
        "gang.kueue.enabled",
        ("gang.volcano.enabled=true", *KUEUE),
        also=("gang.volcano.enabled",),
    ),
    Bad("kueue-without-queue", "gang.kueue.queueName", ("gang.kueue.enabled=true",)),
    Bad(
        "kueue-create-without-cluster-queue",
        "gang.kueue.localQueue.clusterQueue",
        ("gang.kueue.enabled=true", "gang.kueue.localQueue.create=true"),
    ),
    Bad(
        "kueue-group-below-min-nodes",
        "workerGroups.spare.replicas",
        (*KUEUE, "job.minNodes=2", "workerGroups.spare.replicas=1"),
        also=("job.minNodes", "all-or-nothing"),
    ),
    Bad("kueue-queue-not-a-name", "gang.kueue.queueName", ("gang.kueue.queueName=Team A",)),
    Bad(
        "host-network-with-etcd-policy",
        "worker.hostNetwork",
        ("worker.hostNetwork=true",),
        also=("etcd-rendezvous.networkPolicy.enabled",),
    ),
    Bad(
        "common-label-owned-by-the-chart",
        "global.commonLabels.app.kubernetes.io/name",
        ("global.commonLabels.app\\.kubernetes\\.io/name=mine",),
    ),
    Bad(
        "common-label-kueue-queue",
        "global.commonLabels.kueue.x-k8s.io/queue-name",
        ("global.commonLabels.kueue\\.x-k8s\\.io/queue-name=team-a",),
    ),
    Bad(
        "common-label-kueue-queue-etcd-alone",
        "global.commonLabels.kueue.x-k8s.io/queue-name",
        ("global.commonLabels.kueue\\.x-k8s\\.io/queue-name=team-a",),
        chart=ETCD,
    ),
    Bad("common-label-bad-value", "global.commonLabels", ("global.commonLabels.team=a b",)),
    Bad(
        "digest-twice",
        "worker.image.digest",
        (f"worker.image.tag=1.0@{DIGEST}", f"worker.image.digest={DIGEST}"),
    ),
    Bad("digest-not-sha256", "initTopology.image.digest", ("initTopology.image.digest=abc",)),
    Bad("registry-with-scheme", "global.imageRegistry", ("global.imageRegistry=https://mirror",)),
    Bad(
        "extra-container-named-worker",
        "worker.extraContainers[0].name",
        values="worker:\n  extraContainers:\n    - {name: worker, image: busybox:1.36}\n",
    ),
    Bad(
        "extra-init-container-named-like-another",
        "worker.extraContainers[0].name",
        values=(
            "worker:\n  extraInitContainers:\n    - {name: side, image: busybox:1.36}\n"
            "  extraContainers:\n    - {name: side, image: busybox:1.36}\n"
        ),
        also=("worker.extraInitContainers[0]",),
    ),
    Bad(
        "extra-container-without-image",
        "worker.extraContainers.0",
        values="worker:\n  extraContainers:\n    - {name: side}\n",
        also=("image",),
    ),
    Bad(
        "init-container-restart-policy-not-always",
        "worker.extraInitContainers.0.restartPolicy",
        values=(
            "worker:\n  extraInitContainers:\n"
            "    - {name: side, image: busybox:1.36, restartPolicy: OnFailure}\n"
        ),
    ),
    Bad(
        "container-restart-policy",
        "worker.extraContainers.0.restartPolicy",
        values=(
            "worker:\n  extraContainers:\n"
            "    - {name: side, image: busybox:1.36, restartPolicy: Always}\n"
        ),
    ),
    Bad(
        "container-typo",
        "worker.extraContainers.0.comand",
        values="worker:\n  extraContainers:\n    - {name: side, image: b:1, comand: [sh]}\n",
    ),
    Bad(
        "env-from-without-source",
        "worker.envFrom.0",
        values="worker:\n  envFrom:\n    - {prefix: X_}\n",
    ),
    Bad(
        "spread-without-topology-key",
        "worker.topologySpreadConstraints.0",
        values=(
            "worker:\n  topologySpreadConstraints:\n"
            "    - {maxSkew: 1, whenUnsatisfiable: DoNotSchedule}\n"
        ),
        also=("topologyKey",),
    ),
    Bad("runtime-class-not-a-name", "worker.runtimeClassName", ("worker.runtimeClassName=A_B",)),
    Bad(
        "runtime-class-longer-than-a-name",
        "worker.runtimeClassName",
        ("worker.runtimeClassName=" + "a" * 254,),
        also=("253",),
    ),
    Bad(
        "token-for-a-container-that-is-not-extra",
        "worker.extraContainersWithToken[0]",
        ("worker.extraContainersWithToken={worker}",),
        also=("names no container of worker.extraInitContainers or worker.extraContainers",),
    ),
    Bad(
        "token-for-an-extra-container-without-automount",
        "worker.extraContainersWithToken[0]",
        (
            "worker.extraContainers[0].name=log-shipper",
            "worker.extraContainers[0].image=b:1",
            "worker.extraContainersWithToken={log-shipper}",
            "worker.automountServiceAccountToken=false",
        ),
        also=("worker.automountServiceAccountToken is false",),
    ),
    Bad(
        "pull-secret-object-without-name",
        "worker.imagePullSecrets.0",
        values="worker:\n  imagePullSecrets:\n    - {nmae: regcred}\n",
    ),
    Bad("etcd-digest-not-sha256", "image.digest", ("image.digest=latest",), chart=ETCD),
    Bad(
        "etcd-digest-twice",
        "image.digest",
        (f"image.tag=v3.5.21@{DIGEST}", f"image.digest={DIGEST}"),
        chart=ETCD,
    ),
]


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.id)
def test_bad_fabric_value_fails_naming_it(helm: Path, case: Bad, tmp_path: Path) -> None:
    assert_refused(helm, case, tmp_path)
