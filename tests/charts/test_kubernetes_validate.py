"""Every rendered manifest is valid Kubernetes (strict) for 1.29 through 1.35, and every
CRD-backed object validates against its upstream CRD schema (../shared/crds)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import jsonschema
import kubernetes_validate
import pytest
import yaml
from chart_render import KUBERNETES_VERSIONS, Case, cases, kubernetes_errors, objects
from testlib import shared_dir

CASES = cases()
CRD_GROUPS = ("scheduling.volcano.sh", "cert-manager.io", "monitoring.coreos.com", "kueue.x-k8s.io")


def _is_crd_backed(obj: dict[str, Any]) -> bool:
    return obj["apiVersion"].split("/")[0] in CRD_GROUPS


@pytest.mark.parametrize("case", CASES, ids=str)
def test_manifests_pass_kubernetes_validate_strict_for_each_minor(case: Case) -> None:
    """kubernetes-validate --strict (no unknown fields) for Kubernetes 1.29 .. 1.35."""
    errors = []
    for obj in objects(case):
        if _is_crd_backed(obj):
            continue
        for version in KUBERNETES_VERSIONS:
            errors += [
                f"{version} {obj['kind']}/{obj['metadata']['name']}: {err}"
                for err in kubernetes_errors(obj, version)
            ]
    assert not errors, "\n".join(errors)


@pytest.mark.parametrize("version", [KUBERNETES_VERSIONS[0], KUBERNETES_VERSIONS[-1]])
def test_kubernetes_validate_api_agrees_on_the_defaults(version: str) -> None:
    """The package's own validate(strict=True) accepts the defaults too, and refuses an
    unknown field as the suite's cached validator does."""
    for case in CASES[:1] + [c for c in CASES if c.name == "elastic-job:defaults"]:
        for obj in objects(case):
            kubernetes_validate.validate(obj, version, strict=True)
    obj = objects(CASES[0])[0]
    bad = {**obj, "spec": {**obj["spec"], "unknownField": 1}}
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(bad, version, strict=True)
    assert kubernetes_errors(bad, version)


def _crd_schemas(shared: Path) -> dict[tuple[str, str, str], dict[str, Any]]:
    """(group, version, kind) -> openAPIV3Schema, from every CRD under ../shared/crds."""
    out = {}
    for path in sorted((shared / "crds").rglob("*.yaml")):
        for doc in yaml.safe_load_all(path.read_text()):
            if not doc or doc.get("kind") != "CustomResourceDefinition":
                continue
            spec = doc["spec"]
            for version in spec["versions"]:
                key = (spec["group"], version["name"], spec["names"]["kind"])
                out[key] = version["schema"]["openAPIV3Schema"]
    return out


def _strict(schema: Any) -> Any:
    """The CRD schema with unknown fields refused, as the API server prunes and kubeconform
    -strict reports them (x-kubernetes-preserve-unknown-fields subtrees stay open)."""
    if isinstance(schema, list):
        return [_strict(item) for item in schema]
    if not isinstance(schema, dict):
        return schema
    out = {k: _strict(v) for k, v in schema.items()}
    pattern = out.get("pattern")
    if isinstance(pattern, str) and "(?i)" in pattern[1:]:
        # Go's regexp takes `^(?i)...` (the PodMonitor CRD has one); Python wants the flag first.
        out["pattern"] = "(?i)" + pattern.replace("(?i)", "")
    if (
        out.get("type") == "object"
        and "properties" in out
        and "additionalProperties" not in out
        and not out.get("x-kubernetes-preserve-unknown-fields")
    ):
        out["additionalProperties"] = False
    return out


def _metadata_free(schema: dict[str, Any]) -> dict[str, Any]:
    """apiVersion/kind/metadata are checked by the API server, not the CRD schema."""
    schema = dict(schema)
    props = dict(schema.get("properties", {}))
    props["metadata"] = {"type": "object"}
    schema["properties"] = props
    return schema


def test_crd_objects_validate_against_upstream_crd_schemas() -> None:
    """PodGroup (gang.volcano.enabled), LocalQueue (gang.kueue.localQueue.create),
    Certificate (etcd-rendezvous.tls.certManager), PodMonitor and PrometheusRule (the
    elastic-job-cluster chart) against the upstream CRDs' openAPIV3Schema, unknown fields
    refused, for every configuration that renders one."""
    shared = shared_dir()
    if shared is None:
        pytest.skip(
            "upstream CRDs: ../shared is not beside this checkout and fetching them "
            "from upstream failed (offline?); set ELASTIC_SHARED_DIR"
        )
    schemas = _crd_schemas(shared)
    checked = []
    for case in CASES:
        for obj in objects(case):
            if not _is_crd_backed(obj):
                continue
            group, version = obj["apiVersion"].split("/")
            schema = schemas.get((group, version, obj["kind"]))
            assert schema is not None, (
                f"no CRD in ../shared/crds for {obj['apiVersion']} {obj['kind']}"
            )
            jsonschema.validate(obj, _strict(_metadata_free(schema)))
            checked.append(f"{case}: {obj['kind']}")
    assert any("ci/gang-values.yaml: PodGroup" in c for c in checked), checked
    assert any("tls-cert-manager.yaml: Certificate" in c for c in checked), checked
    assert any("etcd-monitoring.yaml: ServiceMonitor" in c for c in checked), checked
    assert any("kueue-local-queue.yaml: LocalQueue" in c for c in checked), checked
    assert any("monitoring.yaml: PodMonitor" in c for c in checked), checked
    cluster = "elastic-job-cluster:ci/monitoring-values.yaml"
    assert f"{cluster}: PodMonitor" in checked, checked
    assert f"{cluster}: PrometheusRule" in checked, checked


def test_crd_check_refuses_an_unknown_podgroup_field() -> None:
    """The strict CRD check is not vacuous: a PodGroup with an unknown spec field fails."""
    shared = shared_dir()
    if shared is None:
        pytest.skip(
            "upstream CRDs: ../shared is not beside this checkout and fetching them "
            "from upstream failed (offline?); set ELASTIC_SHARED_DIR"
        )
    schema = _crd_schemas(shared)[("scheduling.volcano.sh", "v1beta1", "PodGroup")]
    case = next(c for c in CASES if c.name.endswith("ci/gang-values.yaml"))
    podgroup = next(o for o in objects(case) if o["kind"] == "PodGroup")
    bad = {**podgroup, "spec": {**podgroup["spec"], "minMembers": 2}}
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(bad, _strict(_metadata_free(schema)))


def test_crd_check_refuses_a_local_queue_without_its_cluster_queue() -> None:
    """The LocalQueue check is not vacuous: the CRD refuses a misspelt clusterQueue."""
    shared = shared_dir()
    if shared is None:
        pytest.skip(
            "upstream CRDs: ../shared is not beside this checkout and fetching them "
            "from upstream failed (offline?); set ELASTIC_SHARED_DIR"
        )
    schema = _crd_schemas(shared)[("kueue.x-k8s.io", "v1beta2", "LocalQueue")]
    case = next(c for c in CASES if c.name.endswith("kueue-local-queue.yaml"))
    queue = next(o for o in objects(case) if o["kind"] == "LocalQueue")
    jsonschema.validate(queue, _strict(_metadata_free(schema)))
    bad = {**queue, "spec": {"clusterQueu": queue["spec"]["clusterQueue"]}}
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(bad, _strict(_metadata_free(schema)))
