"""Shared by the worker StatefulSet tests (test_worker_statefulset.py,
test_worker_container.py, test_worker_init_container.py): contract lists, render helpers."""

from __future__ import annotations

from typing import Any

import yaml
from chart_render import (
    ELASTIC_JOB,
    container,
    env_of,
    objects,
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
