"""podobject.pod_object against goldens: a pod spec as the chart renders it now and a point
of the pod's lifecycle in, the Pod object the fake API server serves out.

    tests/localrun/golden/podobject/
        <case>.in.json     which StatefulSet (of the chart rendered at test time with
                           values-examples/cpu-smoke.yaml, release demo), the node's IP, the
                           owner's uid, and the pod's lifecycle fields (pod.py's Pod;
                           `running`: a container process)
        <case>.out.json    the Pod object, as `kubectl get pod -o json` would show it, with
                           what it copies from the pod template (spec, labels, annotations,
                           the image) named instead of repeated: the test checks those
                           parts equal the template's, so a chart change needs no new golden

A change to pod_object that changes a golden fails here with the diff; when the change is
meant, write the goldens again and review them in the commit:

    UPDATE_GOLDEN=1 .venv/bin/pytest tests/localrun/test_localrun_podobject_golden.py
"""

from __future__ import annotations

import copy
import difflib
import json
import os
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client

from localrun.cluster.pod import Disruption, Phase, Pod, Termination
from localrun.cluster.podobject import pod_object
from localrun.cluster.statefulset import StatefulSet
from localrun.render import ROOT, render

GOLDEN = Path(__file__).parent / "golden" / "podobject"
CASES = sorted(p.name.removesuffix(".in.json") for p in GOLDEN.glob("*.in.json"))
UPDATE = os.environ.get("UPDATE_GOLDEN") == "1"
# What a golden says in place of a part the Pod copies from its StatefulSet's pod template.
FROM_TEMPLATE = "(as the StatefulSet's pod template: {})"


class Process:
    """The container process of a pod the golden says runs (pod_object only asks whether
    there is one)."""

    started = 0.0

    def poll(self) -> int | None:
        return None

    def terminate(self) -> None:
        raise AssertionError("pod_object must not signal a container")

    def kill(self) -> None:
        raise AssertionError("pod_object must not signal a container")

    def wait(self, timeout: float) -> int | None:
        return None


@pytest.fixture(scope="module")
def statefulsets() -> dict[str, dict[str, Any]]:
    """The chart's StatefulSets as the local run renders them (scripts/demo's values)."""
    rendered = render(
        ROOT / "charts" / "elastic-job",
        [ROOT / "values-examples" / "cpu-smoke.yaml"],
        [],
        release="demo",
        namespace="default",
    )
    return {s["metadata"]["name"]: s for s in rendered.statefulsets}


def given(case: str) -> dict[str, Any]:
    data: dict[str, Any] = json.loads((GOLDEN / f"{case}.in.json").read_text())
    return data


def pod_from(case: dict[str, Any], statefulsets: dict[str, dict[str, Any]]) -> Pod:
    sts = StatefulSet(copy.deepcopy(statefulsets[case["statefulset"]]))
    fields = dict(case["pod"])
    ordinal = fields.pop("ordinal")
    running = fields.pop("running", False)
    phase = Phase(fields.pop("phase"))
    last_run = fields.pop("last_run", None)
    disruption = fields.pop("disruption", None)
    pod = Pod(f"{sts.name}-{ordinal}", sts, ordinal, **fields)
    pod.phase = phase
    pod.proc = Process() if running else None
    pod.last_run = Termination(**last_run) if last_run else None
    pod.disruption = Disruption(**disruption) if disruption else None
    return pod


def pod_of(case: str, statefulsets: dict[str, dict[str, Any]]) -> dict[str, Any]:
    g = given(case)
    return pod_object(pod_from(g, statefulsets), g["owner_uid"], g["host_ip"])


def folded(pod: dict[str, Any], sts: dict[str, Any]) -> dict[str, Any]:
    """`pod` with each part it copies from `sts`'s pod template checked equal to it and
    named instead of repeated; what pod_object adds stays."""
    out = copy.deepcopy(pod)
    template = sts["spec"]["template"]
    for key, value in template["spec"].items():
        assert out["spec"].pop(key) == value, f"spec.{key} is not the template's"
    out["spec"]["(the rest)"] = FROM_TEMPLATE.format("spec")
    labels = out["metadata"]["labels"]
    for key, value in template["metadata"]["labels"].items():
        assert labels.pop(key) == value, f"label {key} is not the template's"
    labels["(the rest)"] = FROM_TEMPLATE.format("metadata.labels")
    annotations = template["metadata"].get("annotations")
    if annotations:
        assert out["metadata"]["annotations"] == annotations
        out["metadata"]["annotations"] = FROM_TEMPLATE.format("metadata.annotations")
    (status,) = out["status"]["containerStatuses"]
    assert status["image"] == template["spec"]["containers"][0]["image"]
    status["image"] = FROM_TEMPLATE.format("spec.containers[0].image")
    return out


@pytest.mark.parametrize("case", CASES)
def test_the_pod_object_of_each_lifecycle_point_is_its_golden(
    case: str, statefulsets: dict[str, dict[str, Any]]
) -> None:
    got = folded(pod_of(case, statefulsets), statefulsets[given(case)["statefulset"]])
    text = json.dumps(got, indent=1, sort_keys=True) + "\n"
    golden = GOLDEN / f"{case}.out.json"
    if UPDATE:
        golden.write_text(text)
    assert golden.exists(), f"no golden for {case}: run with UPDATE_GOLDEN=1 and review it"
    want = golden.read_text()
    diff = "".join(
        difflib.unified_diff(want.splitlines(True), text.splitlines(True), "golden", "now")
    )
    assert text == want, f"{case}: pod_object differs from its golden\n{diff}"


@pytest.mark.parametrize("case", CASES)
def test_each_pod_object_is_a_pod_the_kubernetes_client_reads(
    case: str, statefulsets: dict[str, dict[str, Any]]
) -> None:
    obj = pod_of(case, statefulsets)
    pod = client.ApiClient()._ApiClient__deserialize(obj, "V1Pod")  # type: ignore[attr-defined]
    g = given(case)
    assert pod.metadata.name.endswith(f"-{g['pod']['ordinal']}")
    assert pod.status.phase in ("Pending", "Running")
    assert pod.metadata.owner_references[0].uid == g["owner_uid"]
    assert pod.spec.containers[0].image == obj["status"]["containerStatuses"][0]["image"]


def test_the_goldens_cover_every_phase_a_served_pod_can_be_in() -> None:
    phases = {given(c)["pod"]["phase"] for c in CASES}
    assert phases == {p.value for p in Phase} - {Phase.GONE.value}  # a gone pod is not served


def test_the_goldens_name_statefulsets_the_chart_renders(
    statefulsets: dict[str, dict[str, Any]],
) -> None:
    named = {given(c)["statefulset"] for c in CASES}
    assert named <= set(statefulsets), (named, sorted(statefulsets))
    assert len(named) == 2, "a worker's pod and the rendezvous' pod: both kinds covered"
