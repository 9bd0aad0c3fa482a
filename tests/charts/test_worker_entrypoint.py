"""templates/worker-statefulset.yaml, worker.entrypoint: `image` (the worker image holds
elastic-worker) or `injected` (the inject-worker init container copies it into an emptyDir
of a pod that runs the user's own image; images/worker/src/elastic_worker/bundle.py)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from chart_render import ELASTIC_JOB, EXAMPLES, Case, container, objects, pod_spec, render_error
from elastic_worker import bundle
from worker_sts import DEFAULTS, render_sts

from localrun import chart as localrun_chart

ROOT = ELASTIC_JOB.parents[1]
INJECTED = ["worker.entrypoint=injected", "worker.image.repository=registry.example.com/t/train"]


def _init_names(sts: dict[str, object]) -> list[str]:
    return [c["name"] for c in pod_spec(sts).get("initContainers", [])]


def test_by_default_the_worker_image_runs_its_own_entrypoint() -> None:
    """worker.entrypoint=image: `elastic-worker` from the image's PATH, nothing injected."""
    assert DEFAULTS["worker"]["entrypoint"] == "image"
    sts = render_sts()
    assert container(sts, "worker")["command"] == ["elastic-worker"]
    assert _init_names(sts) == ["init-topology"]
    assert "elastic-worker" not in {v["name"] for v in pod_spec(sts)["volumes"]}


def test_injected_copies_the_bundle_from_the_init_topology_image_and_runs_it_with_sh() -> None:
    """worker.entrypoint=injected: inject-worker runs the image init-topology already pulled
    (same reference and pull policy: no other pull), with init-topology's security context,
    and writes the emptyDir the worker container mounts where the bundle expects it."""
    sts = render_sts(sets=[*INJECTED, "job.command={python,/workspace/train.py,--lr,0.1}"])
    assert _init_names(sts) == ["init-topology", "inject-worker"]
    topo, inject = container(sts, "init-topology"), container(sts, "inject-worker")
    assert (inject["image"], inject["imagePullPolicy"]) == (topo["image"], topo["imagePullPolicy"])
    assert inject["securityContext"] == topo["securityContext"]
    assert inject["resources"] == topo["resources"]
    assert inject["command"] == [
        f"{localrun_chart.BUNDLE_IMAGE_PATH}/bin/inject",
        bundle.MOUNT_PATH,
    ]
    assert inject["volumeMounts"] == [{"name": "elastic-worker", "mountPath": bundle.MOUNT_PATH}]
    worker = container(sts, "worker")
    assert worker["image"].startswith("registry.example.com/t/train:")
    assert worker["command"] == ["/bin/sh", f"{bundle.MOUNT_PATH}/bin/elastic-worker"]
    assert worker["args"] == ["python", "/workspace/train.py", "--lr", "0.1"]
    # Writable: the image's python writes the bundle's bytecode there.
    (mount,) = [m for m in worker["volumeMounts"] if m["name"] == "elastic-worker"]
    assert mount == {"name": "elastic-worker", "mountPath": bundle.MOUNT_PATH}
    (volume,) = [v for v in pod_spec(sts)["volumes"] if v["name"] == "elastic-worker"]
    assert volume == {"name": "elastic-worker", "emptyDir": {"sizeLimit": "64Mi"}}


def test_the_bundle_is_where_the_init_topology_image_puts_it() -> None:
    """The path the chart's inject-worker runs is the one the image's build copies to."""
    dockerfile = (ROOT / "images" / "init-topology" / "Dockerfile").read_text()
    assert re.search(
        rf"^COPY --from=bundle \S+ {re.escape(localrun_chart.BUNDLE_IMAGE_PATH)}$", dockerfile, re.M
    ), dockerfile


def test_injected_extra_init_containers_run_after_the_injection() -> None:
    sts = render_sts(
        sets=[
            *INJECTED,
            "worker.extraInitContainers[0].name=warmup",
            "worker.extraInitContainers[0].image=busybox:1.36",
        ]
    )
    assert _init_names(sts) == ["init-topology", "inject-worker", "warmup"]


def test_an_extra_init_container_may_not_take_the_injections_name() -> None:
    sets = [
        *INJECTED,
        "worker.extraInitContainers[0].name=inject-worker",
        "worker.extraInitContainers[0].image=busybox:1.36",
    ]
    err = render_error(ELASTIC_JOB, sets=sets)
    assert (
        'worker.extraInitContainers[0].name "inject-worker" is already the chart\'s init container'
        in str(err)
    )
    # With the worker image nothing is injected: the name is free.
    assert "inject-worker" in _init_names(render_sts(sets=sets[2:]))


def test_an_unknown_entrypoint_is_refused_by_the_schema() -> None:
    err = str(render_error(ELASTIC_JOB, sets=["worker.entrypoint=inject"]))
    assert "entrypoint" in err and ("image" in err and "injected" in err), err


@pytest.mark.parametrize("example", ["own-image-ngc.yaml"])
def test_the_own_image_example_injects_into_its_image(example: str) -> None:
    values = EXAMPLES / example
    objs = objects(Case(example, ELASTIC_JOB, (values,)))
    (sts,) = [o for o in objs if o["kind"] == "StatefulSet" and "inject-worker" in _init_names(o)]
    assert container(sts, "worker")["image"].startswith("nvcr.io/nvidia/pytorch:")
    assert Path(values).read_text().count("entrypoint: injected") == 1
