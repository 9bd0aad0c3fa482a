"""values-examples/argocd/argocd-cm.yaml's StatefulSet health check, run by a real Lua 5.1
(Argo CD's gopher-lua speaks 5.1) on the chart's rendered StatefulSets as the API server
stores them (defaults filled in) at each stage of a job's life; other StatefulSets keep
Argo CD's built-in verdicts."""

from __future__ import annotations

import copy
import json
import shutil
import subprocess
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml
from testlib import HELMS, ROOT

CM = ROOT / "values-examples" / "argocd" / "argocd-cm.yaml"
KEY = "resource.customizations.health.apps_StatefulSet"
LUA = shutil.which("lua5.1")


def _lua_literal(value: Any) -> str:
    """A Python value as a Lua table constructor, as Argo CD hands the object to Lua."""
    if isinstance(value, dict):
        return (
            "{" + ",".join(f"[{json.dumps(k)}]={_lua_literal(v)}" for k, v in value.items()) + "}"
        )
    if isinstance(value, list):
        return "{" + ",".join(_lua_literal(v) for v in value) + "}"
    if isinstance(value, bool):
        return "true" if value else "false"
    if value is None:
        return "nil"
    if isinstance(value, (int, float)):
        return repr(value)
    return json.dumps(str(value))  # JSON string escapes are valid Lua 5.1 escapes here


def health(obj: dict[str, Any], tmp_path: Path) -> tuple[str, str]:
    if LUA is None:
        pytest.fail("lua5.1 is not installed: run scripts/bootstrap (apt-get install lua5.1)")
    script = yaml.safe_load(CM.read_text())["data"][KEY]
    (tmp_path / "check.lua").write_text(script)
    (tmp_path / "run.lua").write_text(
        f"obj = {_lua_literal(obj)}\n"
        f"local hs = assert(loadfile({json.dumps(str(tmp_path / 'check.lua'))}))()\n"
        'io.write(hs.status, "\\n", hs.message, "\\n")\n'
    )
    proc = subprocess.run(
        [LUA, str(tmp_path / "run.lua")], capture_output=True, text=True, check=False
    )
    assert proc.returncode == 0, proc.stderr
    state, message = proc.stdout.split("\n")[:2]
    return state, message


def _stored(obj: dict[str, Any], generation: int = 1) -> dict[str, Any]:
    """The object as the API server keeps it: defaults set, a generation."""
    out = copy.deepcopy(obj)
    out["metadata"]["generation"] = generation
    strategy = out["spec"].setdefault("updateStrategy", {"type": "RollingUpdate"})
    if strategy["type"] == "RollingUpdate":
        strategy.setdefault("rollingUpdate", {"partition": 0})
    out["spec"].setdefault("replicas", 1)
    return out


@pytest.fixture(scope="module")
def rendered() -> dict[str, dict[str, Any]]:
    proc = subprocess.run(
        [HELMS["helm3"], "template", "run42", ROOT / "charts" / "elastic-job", "-n", "ml"],
        capture_output=True,
        text=True,
        check=True,
    )
    sets = [o for o in yaml.safe_load_all(proc.stdout) if o and o["kind"] == "StatefulSet"]
    return {o["metadata"]["labels"]["app.kubernetes.io/component"]: o for o in sets}


def _status(replicas: int, ready: int, generation: int = 1, rev: str = "r1") -> dict[str, Any]:
    return {
        "observedGeneration": generation,
        "replicas": replicas,
        "readyReplicas": ready,
        "currentReplicas": replicas,
        "updatedReplicas": replicas,
        "currentRevision": rev,
        "updateRevision": rev,
        "availableReplicas": ready,
    }


def test_configmap_is_a_valid_argocd_cm_patch() -> None:
    cm = yaml.safe_load(CM.read_text())
    kubernetes_validate.validate(cm, "1.35", strict=True)
    assert cm["metadata"]["name"] == "argocd-cm" and KEY in cm["data"]


def test_completed_job_reads_healthy(rendered: dict[str, Any], tmp_path: Path) -> None:
    """After the worker scaled its StatefulSet to 0 (generation 2) and the pods are gone."""
    sts = _stored(rendered["worker"], generation=2)
    sts["spec"]["replicas"] = 0
    sts["status"] = _status(0, 0, generation=2)
    state, message = health(sts, tmp_path)
    assert state == "Healthy"
    assert "scaled to 0" in message and "completed" in message


def test_job_scaling_to_zero_is_progressing(rendered: dict[str, Any], tmp_path: Path) -> None:
    sts = _stored(rendered["worker"], generation=2)
    sts["spec"]["replicas"] = 0
    sts["status"] = {**_status(2, 0, generation=2), "replicas": 2}
    assert health(sts, tmp_path) == ("Progressing", "elastic-job scaling to 0: 2 pods left")


def test_scale_not_yet_observed_is_progressing(rendered: dict[str, Any], tmp_path: Path) -> None:
    sts = _stored(rendered["worker"], generation=2)
    sts["spec"]["replicas"] = 0
    sts["status"] = _status(2, 2, generation=1)
    assert health(sts, tmp_path)[0] == "Progressing"


def test_running_job_keeps_the_builtin_verdicts(rendered: dict[str, Any], tmp_path: Path) -> None:
    """A running job is Progressing until its pods are ready, then Healthy, as built in."""
    sts = _stored(rendered["worker"])
    assert sts["spec"]["replicas"] == 2
    sts["status"] = _status(2, 1)
    assert health(sts, tmp_path) == ("Progressing", "Waiting for 1 pods to be ready...")
    sts["status"] = _status(2, 2)
    assert health(sts, tmp_path) == (
        "Healthy",
        "partitioned roll out complete: 2 new pods have been updated...",
    )
    del sts["status"]
    assert health(sts, tmp_path) == (
        "Progressing",
        "Waiting for statefulset spec update to be observed...",
    )


def test_other_statefulsets_at_zero_are_not_called_a_finished_job(
    rendered: dict[str, Any], tmp_path: Path
) -> None:
    """The etcd StatefulSet (and any other app's) scaled to 0 gets the built-in answer."""
    sts = _stored(rendered["rendezvous"], generation=2)
    sts["spec"]["replicas"] = 0
    sts["status"] = _status(0, 0, generation=2)
    state, message = health(sts, tmp_path)
    assert state == "Healthy" and "elastic-job" not in message
    assert message == "partitioned roll out complete: 0 new pods have been updated..."


@pytest.mark.parametrize(
    ("strategy", "status", "want"),
    [
        (
            {"type": "OnDelete"},
            _status(3, 3),
            ("Healthy", "statefulset has 3 ready pods"),
        ),
        (
            {"type": "RollingUpdate", "rollingUpdate": {"partition": 1}},
            {**_status(3, 3), "updatedReplicas": 1},
            (
                "Progressing",
                "Waiting for partitioned roll out to finish: 1 out of 2 new pods have been "
                "updated...",
            ),
        ),
        (
            {"type": "RollingUpdate"},
            {**_status(3, 3), "updatedReplicas": 1, "updateRevision": "r2"},
            (
                "Progressing",
                "waiting for statefulset rolling update to complete 1 pods at revision r2...",
            ),
        ),
        (
            {"type": "RollingUpdate"},
            _status(3, 3),
            ("Healthy", "statefulset rolling update complete 3 pods at revision r1..."),
        ),
    ],
)
def test_builtin_rules_are_kept_for_any_statefulset(
    rendered: dict[str, Any],
    tmp_path: Path,
    strategy: dict[str, Any],
    status: dict[str, Any],
    want: tuple[str, str],
) -> None:
    """gitops-engine's getAppsv1StatefulSetHealth, case by case (the custom check replaces
    it for every StatefulSet Argo CD manages)."""
    sts = copy.deepcopy(rendered["rendezvous"])
    sts["metadata"]["generation"] = 1
    sts["spec"]["replicas"] = 3
    sts["spec"]["updateStrategy"] = strategy
    sts["status"] = status
    assert health(sts, tmp_path) == want
