"""README.md's and CONTRIBUTING.md's facts about the parts, checked against the tree and the
charts' renders: the parts table names every chart and image, the count of charts is the
number under charts/, and the RBAC a release gets is what the charts grant."""

from __future__ import annotations

import re
from typing import Any

from chart_render import CLUSTER, ELASTIC_JOB, objects, of_kind
from testlib import ROOT

README = (ROOT / "README.md").read_text()
CHART_NAMES = sorted(p.parent.name for p in (ROOT / "charts").glob("*/Chart.yaml"))
IMAGE_NAMES = sorted(p.parent.name for p in (ROOT / "images").glob("*/Dockerfile"))
NUMBERS = {"two": 2, "three": 3, "four": 4, "five": 5}
VERBS = {"get", "list", "watch", "create", "update", "patch", "delete", "deletecollection"}


def parts_table() -> set[str]:
    """The first column of README's parts table."""
    return set(re.findall(r"^\| `([^`]+)` \|", README, re.MULTILINE))


def test_the_parts_table_has_a_row_for_every_chart_and_image() -> None:
    rows = parts_table()
    assert len(CHART_NAMES) >= 3 and len(IMAGE_NAMES) >= 2
    missing = {f"charts/{c}" for c in CHART_NAMES} | {f"images/{i}" for i in IMAGE_NAMES}
    assert not missing - rows, f"README's parts table has no row for {sorted(missing - rows)}"


def test_the_number_of_charts_the_docs_give_is_the_number_of_charts() -> None:
    """CONTRIBUTING's opening and CHANGELOG's preamble (an entry may say "both charts" of
    the two a change touched)."""
    for doc, text in (
        ("CONTRIBUTING.md", (ROOT / "CONTRIBUTING.md").read_text()),
        ("CHANGELOG.md", (ROOT / "CHANGELOG.md").read_text().split("\n## ")[0]),
    ):
        said = re.findall(r"\b(two|three|four|five|both) charts\b", text, re.IGNORECASE)
        assert said, f"{doc} no longer says how many charts there are: drop this check"
        for word in said:
            assert NUMBERS.get(word.lower(), 2) == len(CHART_NAMES), f"{doc}: {word!r} charts"


def _verbs(roles: list[dict[str, Any]]) -> set[str]:
    return {v for role in roles for rule in role["rules"] for v in rule["verbs"]}


def test_the_rbac_readme_gives_a_release_is_what_the_charts_grant() -> None:
    """A release is namespaced-only; `get` on nodes is the cluster chart's ClusterRole."""
    sentence = re.search(r"^- namespaced\s+RBAC only: (.*?);\n- ", README, re.DOTALL | re.M)
    assert sentence, "README's line on a release's RBAC is gone: find it again"
    text = " ".join(sentence[1].split())
    per_job = objects(ELASTIC_JOB, sets=("events.enabled=true",))
    cluster_scoped = [o["kind"] for o in per_job if o["kind"].startswith("Cluster")]
    assert not cluster_scoped, f"the per-job chart renders {cluster_scoped}"
    (node_reader,) = of_kind(objects(CLUSTER), "ClusterRole")
    assert [r["resources"] for r in node_reader["rules"]] == [["nodes"]]
    named = {w for w in re.findall(r"`([a-z]+)`", text) if w in VERBS}
    assert named == _verbs(of_kind(per_job, "Role")) | _verbs([node_reader])
    per_job_part, _, cluster_part = text.partition("on nodes")
    assert "nodes" not in per_job_part and "elastic-job-cluster" in cluster_part
