"""Every configuration renders the same with Helm 3 and Helm 4, and the same twice."""

from __future__ import annotations

import re
import subprocess

import pytest
from chart_render import CHARTS, HELM3, HELM4, Case, cases, helm_run, load, render

CASES = cases()


@pytest.mark.parametrize("case", CASES, ids=str)
def test_helm3_and_helm4_render_identical_manifests(case: Case) -> None:
    """Defaults, ci/*-values.yaml and values-examples: byte-identical under Helm 3 and 4."""
    args = ["template", "run42", str(case.chart), "--namespace", "ml"]
    for values in case.values:
        args += ["-f", str(values)]
    out3 = helm_run(HELM3, *args)
    out4 = helm_run(HELM4, *args)
    assert out3.returncode == 0, out3.stderr
    assert out4.returncode == 0, out4.stderr
    assert out3.stdout == out4.stdout
    assert load(out3.stdout), "nothing rendered"


@pytest.mark.parametrize("case", CASES, ids=str)
def test_rendering_twice_is_byte_identical(case: Case) -> None:
    """No random, time-based or cluster-dependent output: two renders are the same bytes."""
    args = ["template", "run42", str(case.chart), "--namespace", "ml"]
    for values in case.values:
        args += ["-f", str(values)]
    first, second = helm_run(HELM4, *args), helm_run(HELM4, *args)
    assert first.returncode == 0, first.stderr
    assert first.stdout == second.stdout


FORBIDDEN = re.compile(
    r"\b(lookup|randAlphaNum|randAlpha|randNumeric|randAscii|randBytes|randInt|uuidv4|now|"
    r"date|dateInZone|unixEpoch|genCA|genPrivateKey|genSelfSignedCert|genSignedCert)\b"
)


@pytest.mark.parametrize(
    "template",
    sorted(p for p in CHARTS.glob("*/templates/**/*") if p.is_file()),
    ids=lambda p: str(p.relative_to(CHARTS)),
)
def test_no_lookup_random_or_time_functions_in_templates(template) -> None:
    """Templates use no lookup, rand*, uuid, now/date or gen* functions (Argo CD drift)."""
    actions = " ".join(re.findall(r"\{\{(.*?)\}\}", template.read_text(), flags=re.S))
    assert not FORBIDDEN.search(actions), FORBIDDEN.search(actions)


def test_capabilities_never_switch_features_on() -> None:
    """Features needing CRDs are switched by values only, never by .Capabilities."""
    for template in CHARTS.glob("*/templates/**/*"):
        if template.is_file():
            assert ".Capabilities" not in template.read_text(), template


def test_chart_renders_without_a_cluster_for_every_kubernetes_version() -> None:
    """`--kube-version` 1.29 through 1.35 all render (kubeVersion: >=1.29.0-0)."""
    for minor in range(29, 36):
        proc = helm_run(
            HELM3,
            "template",
            "run42",
            str(CHARTS / "elastic-job"),
            "--kube-version",
            f"1.{minor}.0",
        )
        assert proc.returncode == 0, proc.stderr


def test_kube_version_below_minimum_is_refused() -> None:
    """Chart.yaml kubeVersion refuses Kubernetes 1.28."""
    proc = helm_run(
        HELM3, "template", "run42", str(CHARTS / "elastic-job"), "--kube-version", "1.28.0"
    )
    assert proc.returncode != 0
    assert "kubeVersion" in proc.stderr or "1.28" in proc.stderr


def test_helm_binaries_are_helm3_and_helm4() -> None:
    """The two binaries the suite compares really are Helm 3.17+ and Helm 4."""
    v3 = subprocess.run(
        [HELM3, "version", "--template", "{{.Version}}"],
        capture_output=True,
        text=True,
        check=False,
    )
    v4 = subprocess.run(
        [HELM4, "version", "--template", "{{.Version}}"],
        capture_output=True,
        text=True,
        check=False,
    )
    assert v3.stdout.startswith("v3.")
    assert int(v3.stdout.split(".")[1]) >= 17
    assert v4.stdout.startswith("v4.")


@pytest.mark.parametrize(
    "sets",
    [[], ["fullnameOverride=" + "f" * 63, "etcd-rendezvous.fullnameOverride=" + "e" * 63]],
    ids=["long-release", "long-fullname-overrides"],
)
def test_names_stay_within_kubernetes_limits(sets: list[str]) -> None:
    """A 53-character release (Helm's maximum) or 63-character overrides: DNS-label objects
    (Services, StatefulSets, Pods) stay within 63, StatefulSets within 52, labels within 63."""
    release = "r" * 53
    objs = load(render(CHARTS / "elastic-job", release=release, sets=sets))
    for obj in objs:
        name = obj["metadata"]["name"]
        if obj["kind"] in ("Service", "Pod", "StatefulSet", "NetworkPolicy", "ServiceAccount"):
            assert len(name) <= 63, name
            assert not name.endswith("-"), name
        if obj["kind"] == "StatefulSet":
            assert len(name) <= 52, name
        labels = {**obj["metadata"].get("labels", {})}
        if obj["kind"] == "StatefulSet":
            labels.update(obj["spec"]["template"]["metadata"]["labels"])
        for value in labels.values():
            assert len(value) <= 63, value
