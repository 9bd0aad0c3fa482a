"""podobject.pod_object against goldens: a pod spec as the chart renders it and a point of
the pod's lifecycle in, the Pod object the fake API server serves out.

    tests/localrun/golden/podobject/
        worker-statefulset.json, etcd-statefulset.json   the chart's StatefulSets as
                                                         rendered (cpu-smoke.yaml, release demo)
        <case>.in.json     which StatefulSet, the node's IP, the owner's uid, and the pod's
                           lifecycle fields (pod.py's Pod; `running`: a container process)
        <case>.out.json    the Pod object, as `kubectl get pod -o json` would show it

A change to pod_object that changes a golden fails here with the diff; when the change is
meant, write the goldens again and review them in the commit:

    UPDATE_GOLDEN=1 .venv/bin/pytest tests/localrun/test_localrun_podobject_golden.py
"""

from __future__ import annotations

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

GOLDEN = Path(__file__).parent / "golden" / "podobject"
CASES = sorted(p.name.removesuffix(".in.json") for p in GOLDEN.glob("*.in.json"))
UPDATE = os.environ.get("UPDATE_GOLDEN") == "1"


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


def pod_from(case: dict[str, Any]) -> Pod:
    sts = StatefulSet(json.loads((GOLDEN / case["statefulset"]).read_text()))
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


@pytest.mark.parametrize("case", CASES)
def test_the_pod_object_of_each_lifecycle_point_is_its_golden(case: str) -> None:
    given = json.loads((GOLDEN / f"{case}.in.json").read_text())
    got = pod_object(pod_from(given), given["owner_uid"], given["host_ip"])
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
def test_each_golden_is_a_pod_the_kubernetes_client_reads(case: str) -> None:
    obj = json.loads((GOLDEN / f"{case}.out.json").read_text())
    pod = client.ApiClient()._ApiClient__deserialize(obj, "V1Pod")  # type: ignore[attr-defined]
    given = json.loads((GOLDEN / f"{case}.in.json").read_text())
    assert pod.metadata.name.endswith(f"-{given['pod']['ordinal']}")
    assert pod.status.phase in ("Pending", "Running")
    assert pod.metadata.owner_references[0].uid == given["owner_uid"]


def test_the_goldens_cover_every_phase_a_served_pod_can_be_in() -> None:
    phases = {json.loads((GOLDEN / f"{c}.in.json").read_text())["pod"]["phase"] for c in CASES}
    assert phases == {p.value for p in Phase} - {Phase.GONE.value}  # a gone pod is not served
