"""values.schema.json of every chart (elastic-job, etcd-rendezvous, elastic-job-cluster):
draft-07, closed at every level, `global` declared, and the defaults (and every example)
valid against it."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import yaml
from chart_render import CHARTS, EXAMPLES, walk

CHART_DIRS = sorted(p.parent for p in CHARTS.glob("*/Chart.yaml"))
# The dependency's values are checked by that chart's own (closed) schema; `global` is
# shared with every chart of a release, so other charts' globals must pass.
OPEN_ON_PURPOSE = {"/properties/etcd-rendezvous", "/properties/global"}


def _schema(chart: Path) -> dict[str, Any]:
    return json.loads((chart / "values.schema.json").read_text())


@pytest.mark.parametrize("chart", CHART_DIRS, ids=lambda p: p.name)
def test_schema_is_draft07_and_declares_global(chart: Path) -> None:
    """`$schema` is draft-07 and `global` is declared (Helm passes it to every chart)."""
    schema = _schema(chart)
    assert schema["$schema"] == "http://json-schema.org/draft-07/schema#"
    jsonschema.Draft7Validator.check_schema(schema)
    assert "global" in schema["properties"]


@pytest.mark.parametrize("chart", CHART_DIRS, ids=lambda p: p.name)
def test_every_object_with_properties_is_closed(chart: Path) -> None:
    """additionalProperties: false wherever properties are listed (typos fail)."""
    open_objects = [
        path
        for path, node in walk(_schema(chart))
        if isinstance(node, dict)
        and isinstance(node.get("properties"), dict)
        and node.get("additionalProperties") is not False
        and path not in OPEN_ON_PURPOSE
        and not path.endswith("/properties/properties")
    ]
    assert not open_objects


@pytest.mark.parametrize("chart", CHART_DIRS, ids=lambda p: p.name)
def test_defaults_satisfy_the_schema(chart: Path) -> None:
    """values.yaml itself is valid against values.schema.json."""
    values = yaml.safe_load((chart / "values.yaml").read_text())
    jsonschema.Draft7Validator(_schema(chart)).validate(values)


def _coalesce(base: Any, override: Any) -> Any:
    """Helm's merge of a values file over the defaults (null removes a key)."""
    if not (isinstance(base, dict) and isinstance(override, dict)):
        return override
    out = dict(base)
    for key, value in override.items():
        if value is None:
            out.pop(key, None)
        else:
            out[key] = _coalesce(base.get(key), value)
    return out


@pytest.mark.parametrize("example", sorted(EXAMPLES.glob("*.yaml")), ids=lambda p: p.name)
def test_examples_satisfy_the_schema(example: Path) -> None:
    """Each values-examples file, over the defaults as Helm merges it, is schema-valid."""
    defaults = yaml.safe_load((CHARTS / "elastic-job" / "values.yaml").read_text())
    values = _coalesce(defaults, yaml.safe_load(example.read_text()))
    values["etcd-rendezvous"] = {"enabled": values["etcd-rendezvous"].get("enabled", True)}
    jsonschema.Draft7Validator(_schema(CHARTS / "elastic-job")).validate(values)


@pytest.mark.parametrize("chart", CHART_DIRS, ids=lambda p: p.name)
def test_every_values_key_is_in_the_schema(chart: Path) -> None:
    """Each key of values.yaml has a schema property (no key only the defaults know)."""
    schema = _schema(chart)
    values = yaml.safe_load((chart / "values.yaml").read_text())

    def check(node: Any, sub: dict[str, Any], path: str) -> None:
        if not isinstance(node, dict) or "properties" not in sub:
            return
        for key, value in node.items():
            assert key in sub["properties"], f"{path}{key} is not in the schema"
            check(value, sub["properties"][key], f"{path}{key}.")

    check(values, schema, "")
