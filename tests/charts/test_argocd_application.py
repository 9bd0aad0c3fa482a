"""values-examples/argocd/application.yaml: an Argo CD Application pointing at the chart."""

from __future__ import annotations

from pathlib import Path

import jsonschema
import pytest
import yaml
from chart_render import EXAMPLES, ROOT, objects
from testlib import shared_dir

APPLICATION = EXAMPLES / "argocd" / "application.yaml"


def _application() -> dict:
    return yaml.safe_load(APPLICATION.read_text())


def test_application_validates_against_the_argo_cd_crd() -> None:
    """The Application is valid against Argo CD's CRD schema (../shared/crds)."""
    shared = shared_dir()
    if shared is None:
        pytest.skip(
            "upstream CRDs: ../shared is not beside this checkout and fetching them "
            "from upstream failed (offline?); set ELASTIC_SHARED_DIR"
        )
    crd = yaml.safe_load((shared / "crds" / "argo-cd" / "application-crd.yaml").read_text())
    (version,) = [v for v in crd["spec"]["versions"] if v["name"] == "v1alpha1"]
    schema = version["schema"]["openAPIV3Schema"]
    jsonschema.validate(_application(), schema)


def test_application_points_at_the_chart_and_an_existing_values_file() -> None:
    """source.path is the chart; every valueFiles entry exists relative to it."""
    source = _application()["spec"]["source"]
    chart = ROOT / source["path"]
    assert (chart / "Chart.yaml").exists()
    for values in source["helm"]["valueFiles"]:
        assert (chart / values).resolve().exists(), values


def test_application_renders_like_helm_template(tmp_path: Path) -> None:
    """What Argo CD renders (value files, then valuesObject) is a valid job."""
    source = _application()["spec"]["source"]
    chart = ROOT / source["path"]
    inline = tmp_path / "values-object.yaml"
    inline.write_text(yaml.safe_dump(source["helm"]["valuesObject"]))
    values = [(chart / v).resolve() for v in source["helm"]["valueFiles"]] + [inline]
    objs = objects(chart, values=values, release=source["helm"]["releaseName"])
    workers = [
        o for o in objs if o["kind"] == "StatefulSet" and "elastic-job" in o["metadata"]["name"]
    ]
    assert workers
    for sts in workers:
        worker = sts["spec"]["template"]["spec"]["containers"][0]
        assert worker["args"] == ["python", "/workspace/train.py", "--epochs", "3"]
