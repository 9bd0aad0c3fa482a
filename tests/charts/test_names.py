"""Object names of a release: the worker StatefulSets and the bundled etcd's never share a
name (their pods would be the same pods), whatever the release name's length."""

from __future__ import annotations

import pytest
from chart_render import ELASTIC_JOB, etcd_statefulset, objects, worker_statefulsets

MULTI = ELASTIC_JOB / "ci" / "multigroup-values.yaml"


@pytest.mark.parametrize("length", [1, 20, 40, 41, 45, 49, 50, 51, 52, 53])
def test_worker_and_etcd_statefulsets_differ_for_every_release_name_length(length: int) -> None:
    """Helm allows release names up to 53 characters; 50-53 used to give a worker group the
    etcd StatefulSet's name. Names stay within 52 and keep the whole group name."""
    for values in ([], [MULTI]):
        objs = objects(ELASTIC_JOB, release="r" * length, values=values)
        workers = [s["metadata"]["name"] for s in worker_statefulsets(objs)]
        groups = [
            s["metadata"]["labels"]["elastic-job.pytorch.org/group"]
            for s in worker_statefulsets(objs)
        ]
        names = [*workers, etcd_statefulset(objs)["metadata"]["name"]]
        assert len(set(names)) == len(names), names
        for name, group in zip(workers, groups, strict=True):
            assert len(name) <= 52 and name.endswith(f"-{group}"), name
            assert not name.startswith("-") and "--" not in name, name


def test_short_names_are_unchanged() -> None:
    """Names that fit are `<fullname>-<group>`, as before."""
    objs = objects(ELASTIC_JOB, values=[MULTI])
    assert [s["metadata"]["name"] for s in worker_statefulsets(objs)] == [
        "run42-elastic-job-anchor",
        "run42-elastic-job-spot",
    ]
