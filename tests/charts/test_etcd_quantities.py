"""etcd-rendezvous sizes written as YAML integers render in full, not as Helm's float64
(2.147483648e+09); every Kubernetes quantity form passes the schema, 'K' does not."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from chart_render import ETCD, etcd_statefulset, objects, pod_spec, render_error


def _etcd(helm: Path, tmp_path: Path, text: str) -> dict[str, Any]:
    values = tmp_path / "values.yaml"
    values.write_text(text)
    return etcd_statefulset(objects(ETCD, helm=helm, values=[values]))


@pytest.mark.parametrize(("size", "expected"), [("2147483648", "2147483648"), ('"1e9"', "1e9")])
def test_persistence_size_renders_as_written(
    helm: Path, tmp_path: Path, size: str, expected: str
) -> None:
    sts = _etcd(helm, tmp_path, f"persistence:\n  enabled: true\n  size: {size}\n")
    [claim] = sts["spec"]["volumeClaimTemplates"]
    assert claim["spec"]["resources"]["requests"]["storage"] == expected


def test_empty_dir_size_limit_renders_in_full(helm: Path, tmp_path: Path) -> None:
    sts = _etcd(helm, tmp_path, "persistence:\n  emptyDirSizeLimit: 1073741824\n")
    [data] = [v for v in pod_spec(sts)["volumes"] if v["name"] == "data"]
    assert data["emptyDir"]["sizeLimit"] == "1073741824"


def test_a_size_kubernetes_rejects_is_refused(helm: Path, tmp_path: Path) -> None:
    values = tmp_path / "values.yaml"
    values.write_text('persistence:\n  size: "1K"\n')
    err = render_error(ETCD, helm=helm, values=[values])
    assert "persistence.size" in err.stderr or "/persistence/size" in err.stderr, err.stderr
