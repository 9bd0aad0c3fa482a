"""topology.labelMap: which variables init-topology may set from node labels. A rule, not
a list: NODE_, NCCL_, GLOO_, FI_ or UCX_ names (a node's fabric settings), none holding
PLUGIN, PATH, LIB or PRELOAD (code loading); whoever labels nodes sets the values."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from chart_render import (
    ELASTIC_JOB,
    EXAMPLES,
    container,
    env_of,
    objects,
    render_error,
    worker_statefulsets,
)

ALLOWED = [
    "NODE_POOL",
    "NCCL_IB_HCA",
    "NCCL_SOCKET_NTHREADS",
    "GLOO_SOCKET_IFNAME",
    "FI_EFA_USE_DEVICE_RDMA",
    "UCX_TLS",
    "NODE_",
]
REFUSED = [
    # Outside the families: shells, interpreters, the loader.
    "BASH_ENV",
    "ENV",
    "SHELLOPTS",
    "PROMPT_COMMAND",
    "CDPATH",
    "PS4",
    "PYTHONSTARTUP",
    "PYTHONINSPECT",
    "PYTHONWARNINGS",
    "LD_AUDIT",
    "LD_PRELOAD",
    "HOME",
    "CUDA_VISIBLE_DEVICES",
    "TORCH_NCCL_BLOCKING_WAIT",
    # Inside a family, but they load code or say where it is loaded from.
    "NCCL_NET_PLUGIN",
    "NCCL_TUNER_PLUGIN",
    "FI_PROVIDER_PATH",
    "UCX_MODULE_DIR_PATH",
    "NODE_LD_LIBRARY_PATH",
    "NCCL_LIBDIR",
    "GLOO_PRELOAD",
]


@pytest.mark.parametrize("name", ALLOWED)
def test_fabric_variable_names_reach_init_topology(helm: Path, name: str) -> None:
    objs = objects(ELASTIC_JOB, helm=helm, sets=[f"topology.labelMap.{name}={{a.example/b}}"])
    for sts in worker_statefulsets(objs):
        label_map = json.loads(env_of(container(sts, "init-topology"))["TOPOLOGY_LABEL_MAP"])
        assert label_map == {name: ["a.example/b"]}


@pytest.mark.parametrize("name", REFUSED)
def test_other_names_are_refused_stating_the_rule(helm: Path, name: str) -> None:
    err = render_error(
        ELASTIC_JOB, helm=helm, sets=[f"topology.labelMap.{name}={{evil.example/label}}"]
    )
    assert f"topology.labelMap.{name}:" in err.stderr, err.stderr
    for part in ("NODE_, NCCL_, GLOO_, FI_ or UCX_", "PLUGIN, PATH, LIB, PRELOAD"):
        assert part in err.stderr, err.stderr


def test_every_example_label_map_follows_the_rule() -> None:
    """The values-examples render (on-prem maps NCCL_IB_HCA)."""
    names = set()
    for example in sorted(EXAMPLES.glob("*.yaml")):
        for sts in worker_statefulsets(objects(ELASTIC_JOB, values=[example])):
            names |= set(json.loads(env_of(container(sts, "init-topology"))["TOPOLOGY_LABEL_MAP"]))
    assert "NCCL_IB_HCA" in names
