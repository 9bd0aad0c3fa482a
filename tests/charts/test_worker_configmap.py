"""templates/worker-configmap.yaml: this release's worker StatefulSets, listed once and
mounted into every worker container (ELASTIC_STATEFULSETS_FILE), so that the render grows
linearly with workerGroups, which the schema bounds."""

from __future__ import annotations

import base64
import gzip
from pathlib import Path
from typing import Any

import pytest
import yaml
from chart_render import (
    ELASTIC_JOB,
    RELEASE,
    container,
    env_of,
    load,
    objects,
    one,
    render,
    worker_statefulsets,
)
from elastic_worker.settings import config
from worker_sts import mounted_file

MULTI = ELASTIC_JOB / "ci" / "multigroup-values.yaml"
#: The schema's bound on workerGroups (values.schema.json, maxProperties).
MAX_GROUPS = 1000
#: A Kubernetes Secret's data, where Helm keeps the release (manifest gzip'd, base64'd).
SECRET_LIMIT = 1 << 20


def groups_file(tmp_path: Path, count: int) -> Path:
    """A values file with `count` groups of one replica each (the default group removed)."""
    path = tmp_path / f"groups-{count}.yaml"
    groups: dict[str, Any] = {"default": None}
    groups.update({f"g{i:04d}": {"replicas": 1} for i in range(count)})
    path.write_text(yaml.safe_dump({"workerGroups": groups}))
    return path


def test_configmap_lists_every_groups_statefulset_one_a_line() -> None:
    """workerGroups: the ConfigMap names each group's StatefulSet once, sorted by group."""
    objs = objects(ELASTIC_JOB, values=[MULTI])
    names = [s["metadata"]["name"] for s in worker_statefulsets(objs)]
    assert names == [f"{RELEASE}-elastic-job-anchor", f"{RELEASE}-elastic-job-spot"]
    cm = one(objs, "ConfigMap", f"{RELEASE}-elastic-job-statefulsets")
    assert cm["data"] == {"statefulsets": "".join(f"{n}\n" for n in names)}


def test_every_worker_reads_the_release_statefulsets_from_the_mounted_configmap(
    tmp_path: Path,
) -> None:
    """The worker's own reader, on the file as mounted, gives every StatefulSet of the
    release, in each group's pods."""
    objs = objects(ELASTIC_JOB, values=[MULTI])
    names = tuple(s["metadata"]["name"] for s in worker_statefulsets(objs))
    for sts in worker_statefulsets(objs):
        assert config.read_statefulsets(mounted_file(sts, objs, tmp_path)) == names
        assert "ELASTIC_STATEFULSETS" not in env_of(container(sts, "worker"))


def test_a_statefulset_does_not_grow_with_the_number_of_groups(tmp_path: Path) -> None:
    """workerGroups: group g0000's StatefulSet renders to the same bytes beside 1 or 60
    other groups (each listed every group in its env, so the render grew with the square
    of the groups: 10,000 took 176 s and 16 GB)."""

    def first_sts(count: int) -> str:
        docs = render(ELASTIC_JOB, values=[groups_file(tmp_path, count)]).split("\n---\n")
        [doc] = [
            d for d in docs if f"name: {RELEASE}-elastic-job-g0000\n" in d and "StatefulSet" in d
        ]
        return doc

    assert first_sts(2) == first_sts(61)


@pytest.mark.slow
def test_the_release_at_the_bound_of_groups_fits_helms_release_secret(tmp_path: Path) -> None:
    """workerGroups at its schema bound (1,000 groups) renders, and the manifest, gzip'd
    and base64'd as Helm stores it, takes under a fifth of the Secret it is stored in
    (room for the chart, the values and groups with settings of their own)."""
    text = render(ELASTIC_JOB, values=[groups_file(tmp_path, MAX_GROUPS)])
    assert len(worker_statefulsets(load(text))) == MAX_GROUPS
    stored = len(base64.b64encode(gzip.compress(text.encode())))
    assert stored < SECRET_LIMIT / 5, stored
