"""Chart.yaml annotations Artifact Hub reads: the license, the images a default install
runs (checked against a real render) and this version's changes (checked against
CHANGELOG.md)."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml
from testlib import ROOT

CHARTS = ("elastic-job", "elastic-job-cluster", "etcd-rendezvous")
VERSION = (ROOT / "VERSION").read_text().strip()
KINDS = {"added", "changed", "deprecated", "removed", "fixed", "security"}


def _annotations(chart: str) -> dict[str, str]:
    chart_yaml = yaml.safe_load((ROOT / "charts" / chart / "Chart.yaml").read_text())
    annotations: dict[str, str] = chart_yaml["annotations"]
    return annotations


def _rendered_images(helm: Path, chart: str) -> set[str]:
    proc = subprocess.run(
        [helm, "template", "run42", ROOT / "charts" / chart],
        capture_output=True,
        text=True,
        check=True,
    )
    images = set()
    for obj in yaml.safe_load_all(proc.stdout):
        if not obj:
            continue
        spec = obj.get("spec", {})
        spec = spec if obj["kind"] == "Pod" else spec.get("template", {}).get("spec")
        for ctr in [*(spec or {}).get("initContainers", []), *(spec or {}).get("containers", [])]:
            images.add(ctr["image"])
    return images


def _changelog_entries() -> dict[str, set[str]]:
    """kind -> entries of this version's CHANGELOG.md section, whitespace joined."""
    text = (ROOT / "CHANGELOG.md").read_text()
    match = re.search(rf"^## \[{re.escape(VERSION)}\][^\n]*\n(.*?)(?=^## \[|\Z)", text, re.M | re.S)
    assert match, f"CHANGELOG.md has no section '## [{VERSION}]'"
    out: dict[str, set[str]] = {}
    kind = None
    for block in re.split(r"\n(?=### |- )", match[1]):
        if block.startswith("### "):
            kind = block[4:].split("\n")[0].strip().lower()
        elif block.startswith("- "):
            assert kind in KINDS, f"CHANGELOG.md: an entry under '### {kind}'"
            out.setdefault(kind, set()).add(" ".join(block[2:].split()))
    return out


@pytest.mark.parametrize("chart", CHARTS)
def test_license_annotation_is_the_license_file(chart: str) -> None:
    assert _annotations(chart)["artifacthub.io/license"] == "Apache-2.0"
    assert "Apache License" in (ROOT / "LICENSE").read_text().split("\n", 3)[1]


@pytest.mark.parametrize("chart", CHARTS)
def test_images_annotation_lists_what_a_default_install_runs(helm: Path, chart: str) -> None:
    """artifacthub.io/images is exactly the set of images in the default render (helm test
    pod included), so a bumped tag or a new container cannot leave it stale."""
    listed = yaml.safe_load(_annotations(chart)["artifacthub.io/images"])
    assert {item["image"] for item in listed} == _rendered_images(helm, chart)
    assert all(set(item) == {"name", "image"} for item in listed)


def test_changes_annotations_are_this_versions_changelog_entries() -> None:
    """Each chart's artifacthub.io/changes entry is an entry of CHANGELOG.md's section for
    VERSION, with its kind; every entry there is announced by at least one chart."""
    changelog = _changelog_entries()
    announced: set[tuple[str, str]] = set()
    for chart in CHARTS:
        changes: list[dict[str, Any]] = yaml.safe_load(
            _annotations(chart)["artifacthub.io/changes"]
        )
        for change in changes:
            kind, text = change["kind"], " ".join(change["description"].split())
            assert text in changelog.get(kind, set()), (
                f"charts/{chart}: '{kind}: {text}' is not under '### {kind.title()}' in "
                f"CHANGELOG.md's [{VERSION}]"
            )
            announced.add((kind, text))
    missing = {(k, t) for k, texts in changelog.items() for t in texts} - announced
    assert not missing, f"CHANGELOG.md entries no chart announces: {sorted(missing)}"


# Artifact Hub's categories (its repository metadata documentation).
CATEGORIES = {
    "ai-machine-learning", "database", "integration-delivery", "monitoring-logging",
    "networking", "security", "storage", "streaming-messaging",
}  # fmt: skip
RAW = "https://raw.githubusercontent.com/elastic-job/elastic-job/main/"
BLOB = "https://github.com/elastic-job/elastic-job/blob/main/"


def _chart(chart: str) -> dict[str, Any]:
    data: dict[str, Any] = yaml.safe_load((ROOT / "charts" / chart / "Chart.yaml").read_text())
    return data


def test_repository_metadata_is_artifact_hubs_format() -> None:
    """artifacthub-repo.yml: only the keys Artifact Hub reads, owners with a name."""
    meta = yaml.safe_load((ROOT / "artifacthub-repo.yml").read_text())
    assert set(meta) <= {"repositoryID", "owners", "ignore"}, sorted(meta)
    assert meta["owners"] and all(owner.get("name") for owner in meta["owners"])
    assert all(set(owner) <= {"name", "email"} for owner in meta["owners"])


@pytest.mark.parametrize("chart", CHARTS)
def test_icon_is_a_file_of_this_repository(chart: str) -> None:
    """The icon URL is the raw file on main of an image that is here (SVG or PNG)."""
    icon = _chart(chart)["icon"]
    assert icon.startswith(RAW), icon
    path = ROOT / icon.removeprefix(RAW)
    assert path.suffix in (".svg", ".png") and path.is_file(), path
    if path.suffix == ".svg":
        assert path.read_text().lstrip().startswith("<svg"), path


@pytest.mark.parametrize("chart", CHARTS)
def test_category_and_links(chart: str) -> None:
    """A category Artifact Hub knows; links with names, https, and those into this
    repository pointing at files that are here."""
    annotations = _annotations(chart)
    assert annotations["artifacthub.io/category"] in CATEGORIES
    links = yaml.safe_load(annotations["artifacthub.io/links"])
    assert links and all(set(link) == {"name", "url"} for link in links)
    for link in links:
        assert link["url"].startswith("https://"), link
        if link["url"].startswith(BLOB):
            assert (ROOT / link["url"].removeprefix(BLOB)).is_file(), link
