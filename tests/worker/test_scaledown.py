"""scaledown.py: the job's StatefulSets scaled to 0 through the scale subresource of the
fake API server (real HTTP), a refusal a warning."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest
from elastic_worker import scaledown

from localrun.cluster.apiserver import FakeApiServer
from worker.test_completion import kube_api


def test_scale_to_zero_patches_each_statefulset(tmp_path: Path) -> None:
    with FakeApiServer(workdir=tmp_path / "api") as api:
        api.add_statefulset("default", "run42-worker-a", replicas=3)
        api.add_statefulset("default", "run42-worker-b", replicas=2)
        kube = kube_api(api)
        assert kube is not None
        assert scaledown.scale_to_zero(kube, "default", ("run42-worker-a", "run42-worker-b")) == 2
        for name in ("run42-worker-a", "run42-worker-b"):
            assert api.statefulsets[("default", name)]["spec"]["replicas"] == 0
        assert {r.method for r in api.requests} == {"PATCH"}


def test_a_403_is_a_warning_not_a_failure(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="elastic_worker")
    with FakeApiServer(workdir=tmp_path / "api") as api:
        api.add_statefulset("default", "run42-worker-a", replicas=3)
        api.set_fault(r"/scale$", 403)
        kube = kube_api(api)
        assert kube is not None
        assert scaledown.scale_to_zero(kube, "default", ("run42-worker-a",)) == 0
        assert api.statefulsets[("default", "run42-worker-a")]["spec"]["replicas"] == 3
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert any(
        "not allowed to scale statefulset default/run42-worker-a (403)" in w for w in warnings
    )
