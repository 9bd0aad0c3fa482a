"""scaledown.py: the job's StatefulSets scaled to 0 through the scale subresource of the
fake API server (real HTTP), a refusal a warning."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest
import yaml
from elastic_worker import scaledown
from elastic_worker.settings import config
from testlib import ROOT

from localrun.cluster.apiserver import FakeApiServer
from worker.test_completion import BASE, kube_api


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
    (line,) = [w for w in warnings if "default/run42-worker-a (403)" in w]
    assert line.startswith("not allowed to scale statefulset")
    assert "rbac.scaleDown.enabled=false" in line  # the value that turns it off


def test_the_value_the_warnings_name_is_the_charts() -> None:
    """scaledown.CHART_VALUE is a key of charts/elastic-job/values.yaml, a boolean."""
    values = yaml.safe_load((ROOT / "charts" / "elastic-job" / "values.yaml").read_text())
    node = values
    for part in scaledown.CHART_VALUE.split("."):
        node = node[part]
    assert isinstance(node, bool)


def test_without_api_access_the_warning_names_the_value(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """ELASTIC_SCALE_DOWN=true without the token: one warning saying what to mount or which
    value turns the scale-down off."""
    caplog.set_level(logging.INFO, logger="elastic_worker")
    listed = tmp_path / "statefulsets"
    listed.write_text("run42-worker-a\n")
    env = {
        **BASE,
        "ELASTIC_SCALE_DOWN": "true",
        "ELASTIC_STATEFULSETS_FILE": str(listed),
        "ELASTIC_SERVICEACCOUNT_DIR": str(tmp_path / "no-token"),
    }
    cfg = config.load(["train.py"], env)
    assert cfg.kube_api is None
    scaledown.scale_down_after_success(cfg)
    (line,) = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert "worker.automountServiceAccountToken" in line
    assert "rbac.scaleDown.enabled=false" in line
