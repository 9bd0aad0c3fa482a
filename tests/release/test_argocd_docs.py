"""The Argo CD Application example and the chart README's Argo CD section say the same
thing: replicas ignored and respected on sync, a pinned release tag."""

from __future__ import annotations

import re
from typing import Any

import yaml
from testlib import ROOT

APPLICATION = ROOT / "values-examples" / "argocd" / "application.yaml"
README = ROOT / "charts" / "elastic-job" / "README.md"
VERSION = (ROOT / "VERSION").read_text().strip()


def _application() -> dict[str, Any]:
    app: dict[str, Any] = yaml.safe_load(APPLICATION.read_text())
    return app


def _readme_argocd_snippet() -> dict[str, Any]:
    section = README.read_text().split("\n## Argo CD\n", 1)[1]
    block = re.search(r"```yaml\n(.*?)```", section, re.S)
    assert block, "charts/elastic-job/README.md's Argo CD section has no yaml snippet"
    spec: dict[str, Any] = yaml.safe_load(block[1])["spec"]
    return spec


def test_application_targets_the_release_tag() -> None:
    """targetRevision is v<VERSION>: a tag, so syncs render one chart version."""
    assert _application()["spec"]["source"]["targetRevision"] == f"v{VERSION}"


def test_application_leaves_statefulset_replicas_to_the_job() -> None:
    spec = _application()["spec"]
    assert {"group": "apps", "kind": "StatefulSet", "jsonPointers": ["/spec/replicas"]} in spec[
        "ignoreDifferences"
    ]
    assert "RespectIgnoreDifferences=true" in spec["syncPolicy"]["syncOptions"]


def test_readme_snippet_is_what_the_example_applies() -> None:
    """The README's snippet is the example's ignoreDifferences and sync option."""
    snippet, spec = _readme_argocd_snippet(), _application()["spec"]
    assert snippet["ignoreDifferences"] == spec["ignoreDifferences"]
    assert set(snippet["syncPolicy"]["syncOptions"]) <= set(spec["syncPolicy"]["syncOptions"])
    assert snippet["syncPolicy"]["syncOptions"] == ["RespectIgnoreDifferences=true"]


def test_readme_is_outside_the_generated_table() -> None:
    """scripts/gen-chart-docs rewrites only between its markers; the section is after them."""
    text = README.read_text()
    assert text.index("<!-- parameters:end -->") < text.index("\n## Argo CD\n")
