"""The workflow's kubeconform step, run here: the same renders (ci/render-all) validated
against the same schemas (ci/crd_schemas.py from ci/crds.sha256's CRDs, and the strict
upstream Kubernetes schemas), with jsonschema in place of kubeconform, which has no
package here. Helm 3 and 4, as the workflow's matrix."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import yaml
from chart_render import KUBERNETES_VERSIONS, kubernetes_errors
from ci_inputs import crd_files, generate_schemas, render_all
from kubernetes_validate.utils import SchemaNotFoundError


class _NoDuplicates(yaml.SafeLoader):
    """kubeconform -strict refuses duplicate keys (yaml.UnmarshalStrict); so does this."""

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
        keys = [self.construct_object(k, deep=deep) for k, _ in node.value]
        dupes = {k for k in keys if keys.count(k) > 1}
        if dupes:
            raise yaml.constructor.ConstructorError(
                None, None, f"duplicate keys {sorted(dupes)}", node.start_mark
            )
        return super().construct_mapping(node, deep=deep)


@pytest.fixture(scope="module")
def schemas(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return generate_schemas(tmp_path_factory.mktemp("crd-schemas"), crd_files())


@pytest.fixture(scope="module")
def rendered(tmp_path_factory: pytest.TempPathFactory) -> Callable[[Path], Path]:
    """ci/render-all's output for one helm, rendered once for this file's tests (each reads
    it, none writes): a render of every configuration costs 10-20 s here."""
    outs: dict[Path, Path] = {}

    def get(helm: Path) -> Path:
        if helm not in outs:
            outs[helm] = render_all(helm, tmp_path_factory.mktemp("render-all") / "out")
        return outs[helm]

    return get


def _schema_path(schemas: Path, obj: dict[str, Any]) -> Path:
    """kubeconform's '{{.Group}}/{{.ResourceKind}}_{{.ResourceAPIVersion}}.json'."""
    group, _, version = str(obj["apiVersion"]).rpartition("/")
    return schemas / group / f"{str(obj['kind']).lower()}_{version}.json"


def kubeconform_errors(schemas: Path, obj: dict[str, Any]) -> list[str]:
    """What `kubeconform -strict -schema-location default -schema-location <schemas>`
    reports for one object, for every Kubernetes minor of the workflow's matrix."""
    name = f"{obj['kind']}/{obj['metadata']['name']}"
    # kubeconform tries its schema locations in order: the Kubernetes schemas, then ours.
    try:
        errors = []
        for version in KUBERNETES_VERSIONS:
            errors += [f"{version} {name}: {e}" for e in kubernetes_errors(obj, version)]
        return errors
    except SchemaNotFoundError:
        pass
    path = _schema_path(schemas, obj)
    if not path.is_file():
        # The old workflow's bug: a group missing from the catalogue failed every run.
        return [f"{name}: no schema for {obj['apiVersion']} (add its CRD to ci/crds.sha256)"]
    validator = jsonschema.Draft7Validator(json.loads(path.read_text()))
    return [f"{name}: {e.json_path}: {e.message}" for e in validator.iter_errors(obj)]


@pytest.mark.slow
def test_every_render_passes_the_kubeconform_step(
    helm: Path, schemas: Path, rendered: Callable[[Path], Path]
) -> None:
    """Each file ci/render-all writes validates: CRD kinds against the generated schemas
    (PodGroup, Certificate, ServiceMonitor, the Argo CD Application), the rest against the
    strict Kubernetes schemas of 1.29..1.35; no duplicate keys."""
    out = rendered(helm)
    errors, kinds = [], set()
    for path in sorted(out.glob("*.yaml")):
        for obj in yaml.load_all(path.read_text(), Loader=_NoDuplicates):
            if obj:
                kinds.add(obj["kind"])
                errors += [f"{path.name}: {e}" for e in kubeconform_errors(schemas, obj)]
    assert not errors, "\n".join(errors)
    assert {"PodGroup", "Certificate", "ServiceMonitor", "Application", "StatefulSet"} <= kinds


def test_a_crd_kind_without_a_schema_fails(schemas: Path) -> None:
    """A CRD object whose group has no pinned CRD is an error, not a silent pass."""
    obj = {
        "apiVersion": "jobset.x-k8s.io/v1alpha2",
        "kind": "JobSet",
        "metadata": {"name": "x"},
    }
    assert "no schema for jobset.x-k8s.io/v1alpha2" in kubeconform_errors(schemas, obj)[0]


@pytest.mark.slow
def test_generated_schemas_refuse_unknown_fields_but_keep_open_subtrees(
    helm: Path, schemas: Path, rendered: Callable[[Path], Path]
) -> None:
    """ci/crd_schemas.py makes the CRD schemas strict: a misspelt PodGroup field fails, while
    x-kubernetes-preserve-unknown-fields subtrees (an Application's helm valuesObject)
    stay open."""
    out = rendered(helm)
    (podgroup,) = [
        o
        for o in yaml.safe_load_all((out / "elastic-job-ci-gang-values.yaml").read_text())
        if o and o["kind"] == "PodGroup"
    ]
    assert kubeconform_errors(schemas, podgroup) == []
    bad = {**podgroup, "spec": {**podgroup["spec"], "minMembers": 2}}
    assert any("minMembers" in e for e in kubeconform_errors(schemas, bad))
    app = yaml.safe_load((out / "argocd-application.yaml").read_text())
    app["spec"]["source"]["helm"]["valuesObject"] = {"anything": {"nested": [1, "two"]}}
    assert kubeconform_errors(schemas, app) == []
    app["spec"]["source"]["helm"]["valueFile"] = "typo.yaml"
    assert any("valueFile" in e for e in kubeconform_errors(schemas, app))
