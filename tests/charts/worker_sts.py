"""Shared by the worker StatefulSet tests (test_worker_statefulset.py,
test_worker_container.py, test_worker_init_container.py): contract lists, render helpers."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml
from chart_render import (
    ELASTIC_JOB,
    container,
    env_of,
    objects,
    one,
    pod_spec,
    worker_statefulsets,
)
from elastic_worker.settings.definitions import SETTINGS
from elastic_worker.settings.schema import Source

# The worker's variables the chart sets, in the chart's order: the one definition's
# (images/worker/src/elastic_worker/settings/definitions.py), then the downward API's.
CONTRACT_ENV = [
    *(s.name for s in SETTINGS if s.source in {Source.VALUE, Source.DERIVED}),
    "POD_NAME",
    "POD_NAMESPACE",
    "POD_IP",
    "POD_UID",
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


def render_sts(**kwargs: Any) -> dict[str, Any]:
    (sts,) = worker_statefulsets(objects(ELASTIC_JOB, **kwargs))
    return sts


def worker_env(**kwargs: Any) -> dict[str, Any]:
    return env_of(container(render_sts(**kwargs), "worker"))


def env_names(ctr: dict[str, Any]) -> list[str]:
    return [e["name"] for e in ctr["env"]]


def mounted_file(sts: dict[str, Any], objs: list[dict[str, Any]], tmp_path: Path) -> Path:
    """The file ELASTIC_STATEFULSETS_FILE names, laid out as the kubelet mounts the
    ConfigMap volume (one file per key) under tmp_path."""
    worker = container(sts, "worker")
    path = Path(env_of(worker)["ELASTIC_STATEFULSETS_FILE"])
    [mount] = [m for m in worker["volumeMounts"] if path.is_relative_to(m["mountPath"])]
    assert mount["readOnly"] is True
    [volume] = [v for v in pod_spec(sts)["volumes"] if v["name"] == mount["name"]]
    cm = one(objs, "ConfigMap", volume["configMap"]["name"])
    local = tmp_path / "mount"
    local.mkdir(exist_ok=True)
    for key, text in cm["data"].items():
        (local / key).write_text(text)
    return local / path.relative_to(mount["mountPath"])
