"""The rendered containers' settings are accepted by the images' own config parsers
(elastic_worker.config.load, init_topology.config.load_config), for every configuration.

The chart and the images meet in docs/contracts.md; this runs the real parsers on the real
rendered environment, with the downward-API fields filled in as the kubelet would."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from chart_render import (
    ELASTIC_JOB,
    NAMESPACE,
    Case,
    cases,
    container,
    objects,
    worker_statefulsets,
)
from worker_sts import mounted_file

worker_config = pytest.importorskip(
    "elastic_worker.settings.config", reason="scripts/bootstrap installs it"
)
topology_config = pytest.importorskip(
    "init_topology.config", reason="scripts/bootstrap installs it"
)

JOB_CASES = [c for c in cases() if c.chart == ELASTIC_JOB]
FIELDS = {
    "metadata.name": "run42-elastic-job-default-0",
    "metadata.namespace": NAMESPACE,
    "metadata.uid": "3b0c0a4e-0000-4000-8000-000000000001",
    "status.podIP": "10.1.2.3",
    "spec.nodeName": "node-a",
    "status.hostIP": "192.0.2.10",
}


def _environment(ctr: dict[str, Any]) -> dict[str, str]:
    env = {}
    for item in ctr.get("env", []):
        if "value" in item:
            env[item["name"]] = item["value"]
        elif "fieldRef" in item.get("valueFrom", {}):
            env[item["name"]] = FIELDS[item["valueFrom"]["fieldRef"]["fieldPath"]]
    return env


@pytest.mark.parametrize("case", JOB_CASES, ids=str)
def test_worker_entrypoint_accepts_the_rendered_settings(case: Case, tmp_path: Path) -> None:
    """elastic-worker's config loader takes every rendered worker container as it is."""
    inject = tmp_path / "env"
    inject.write_text("")
    objs = objects(case)
    names = tuple(s["metadata"]["name"] for s in worker_statefulsets(objs))
    for sts in worker_statefulsets(objs):
        worker = container(sts, "worker")
        env = {**_environment(worker), "ELASTIC_INJECT_ENV": str(inject)}
        config = worker_config.load(worker["args"], env)
        assert config.min_nodes == int(env["ELASTIC_MIN_NODES"])
        # The file as the kubelet mounts it names every StatefulSet of the release.
        assert worker_config.read_statefulsets(mounted_file(sts, objs, tmp_path)) == names
        assert list(config.command) == worker["args"]


@pytest.mark.parametrize("case", JOB_CASES, ids=str)
def test_init_topology_accepts_the_rendered_settings(case: Case) -> None:
    """init-topology's config loader takes every rendered init container as it is."""
    for sts in worker_statefulsets(objects(case)):
        init = container(sts, "init-topology")
        config = topology_config.load_config(_environment(init))
        assert str(config.output) == "/etc/inject/env"
        assert config.user_env == frozenset(
            n for n in _environment(init)["TOPOLOGY_USER_ENV"].split(",") if n
        )
