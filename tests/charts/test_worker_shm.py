"""worker.shmSizeLimit: /dev/shm (a memory-backed emptyDir) counts against the worker's
memory limit, so it may not exceed it, in whatever form either quantity is written."""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest
from chart_render import (
    ELASTIC_JOB,
    container,
    objects,
    pod_spec,
    render_error,
    worker_statefulsets,
)

GI = 1024**3


def _values(tmp_path: Path, shm: str, memory: str | None) -> Path:
    """A values file: YAML numbers stay numbers (Helm holds them as float64)."""
    text = f"worker:\n  shmSizeLimit: {shm}\n"
    if memory is not None:
        text += f"  resources:\n    limits:\n      memory: {memory}\n"
    # Renders are cached by file path: one file per content.
    path = tmp_path / f"values-{hashlib.sha256(text.encode()).hexdigest()[:12]}.yaml"
    path.write_text(text)
    return path


def _size_limit(helm: Path, values: Path) -> str:
    (sts,) = worker_statefulsets(objects(ELASTIC_JOB, helm=helm, values=[values]))
    [dshm] = [v for v in pod_spec(sts)["volumes"] if v["name"] == "dshm"]
    assert dshm["emptyDir"]["medium"] == "Memory"
    return str(dshm["emptyDir"]["sizeLimit"])


@pytest.mark.parametrize(
    "memory",
    [
        "1000000",  # a YAML integer
        str(GI - 1),  # a YAML integer just below 1Gi (Helm: 1.073741823e+09)
        f'"{GI - 1}"',  # the same as a string
        '"1e9"',
        '"1E9"',
        '"1G"',
        '"1000M"',
        '"0.99Gi"',
        '".5Gi"',
        '"1048575Ki"',
        '"1073741823000m"',
        "1.0e9",  # a YAML float
    ],
)
def test_a_memory_limit_below_shm_is_refused_in_every_form(
    helm: Path, tmp_path: Path, memory: str
) -> None:
    """shmSizeLimit 1Gi over a smaller limit: fails naming both values, renders nothing."""
    err = render_error(ELASTIC_JOB, helm=helm, values=[_values(tmp_path, "1Gi", memory)])
    assert "worker.shmSizeLimit (1Gi) exceeds" in err.stderr, err.stderr
    assert "worker.resources.limits.memory" in err.stderr, err.stderr


@pytest.mark.parametrize(
    "memory",
    [str(GI), f'"{GI}"', '"1Gi"', '"1024Mi"', '"1.1G"', '"1.5e9"', '"2E9"', '"1E"', '"1.e10"'],
)
def test_a_memory_limit_at_or_above_shm_renders(helm: Path, tmp_path: Path, memory: str) -> None:
    assert _size_limit(helm, _values(tmp_path, "1Gi", memory)) == "1Gi"


@pytest.mark.parametrize(
    ("shm", "expected"),
    [(str(2 * GI), str(2 * GI)), ('"2147483648"', str(2 * GI)), ('"1e9"', "1e9"), ('"2Gi"', "2Gi")],
)
def test_shm_size_renders_as_written(helm: Path, tmp_path: Path, shm: str, expected: str) -> None:
    """A YAML integer is written in full, never as 2.147483648e+09."""
    assert _size_limit(helm, _values(tmp_path, shm, None)) == expected


def test_an_integer_shm_above_the_limit_is_refused(helm: Path, tmp_path: Path) -> None:
    """shmSizeLimit 2147483648 (a YAML integer) over a 2147483647 limit."""
    err = render_error(
        ELASTIC_JOB, helm=helm, values=[_values(tmp_path, str(2 * GI), str(2 * GI - 1))]
    )
    assert f"worker.shmSizeLimit ({2 * GI}) exceeds" in err.stderr, err.stderr
    assert _size_limit(helm, _values(tmp_path, str(2 * GI), str(2 * GI))) == str(2 * GI)


def test_a_groups_limit_is_named_where_it_is_set(helm: Path, tmp_path: Path) -> None:
    path = tmp_path / "values.yaml"
    path.write_text(
        "workerGroups:\n  big:\n    replicas: 1\n    resources:\n      limits:\n"
        "        memory: 1000000\n"
    )
    err = render_error(ELASTIC_JOB, helm=helm, values=[path])
    assert "workerGroups.big.resources.limits.memory = 1000000" in err.stderr, err.stderr


@pytest.mark.parametrize(
    ("value", "name"),
    [
        ('"1K"', "worker.shmSizeLimit"),  # Kubernetes has k, not K
        ('"1e100"', "worker.shmSizeLimit"),
        ('"-1Gi"', "worker.shmSizeLimit"),
        ('"1 Gi"', "worker.shmSizeLimit"),
    ],
)
def test_what_is_not_a_quantity_is_refused(
    helm: Path, tmp_path: Path, value: str, name: str
) -> None:
    err = render_error(ELASTIC_JOB, helm=helm, values=[_values(tmp_path, value, None)])
    assert name in err.stderr or "/worker/shmSizeLimit" in err.stderr, err.stderr


def test_snapshots_default_to_the_workers_memory_volume(helm: Path, tmp_path: Path) -> None:
    """packages/elastic-snapshot saves to /dev/shm/elastic-snapshot unless told otherwise:
    the worker container's memory-backed emptyDir (a pod's node-local memory, kept across a
    container restart), sized by worker.shmSizeLimit."""
    from elastic_snapshot.snapshots import DEFAULT_ROOT  # noqa: PLC0415 - imports torch

    (sts,) = worker_statefulsets(
        objects(ELASTIC_JOB, helm=helm, values=[_values(tmp_path, "2Gi", None)])
    )
    mounts = {m["name"]: m["mountPath"] for m in container(sts, "worker")["volumeMounts"]}
    [dshm] = [v for v in pod_spec(sts)["volumes"] if v["name"] == "dshm"]
    assert DEFAULT_ROOT.startswith(mounts["dshm"].rstrip("/") + "/"), (DEFAULT_ROOT, mounts)
    assert dshm["emptyDir"] == {"medium": "Memory", "sizeLimit": "2Gi"}
