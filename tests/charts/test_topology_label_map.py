"""topology.labelMap: which variables init-topology may set from node labels. A rule, not
a list: NODE_, NCCL_, GLOO_, FI_ or UCX_ names (a node's fabric settings), none holding
PLUGIN, PATH, LIB, PRELOAD, DIR, FILE, CONF or MODULE (code loading, files); whoever labels
nodes sets the values. The rule is defined in init-topology's config; the chart's copy is
checked against it here."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from chart_render import (
    ELASTIC_JOB,
    EXAMPLES,
    RenderError,
    container,
    env_of,
    objects,
    render_error,
    worker_statefulsets,
)
from init_topology.config import (
    LABEL_MAP_FORBIDDEN_WORDS,
    LABEL_MAP_PREFIXES,
    label_map_name_allowed,
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
    "UCX_MODULE_DIR",
    "NCCL_CONF_FILE",
    "NCCL_DEBUG_FILE",
    "NCCL_TOPO_FILE",
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
    prefixes = ", ".join(LABEL_MAP_PREFIXES[:-1]) + " or " + LABEL_MAP_PREFIXES[-1]
    for part in (prefixes, ", ".join(LABEL_MAP_FORBIDDEN_WORDS)):
        assert part in err.stderr, err.stderr


@pytest.mark.parametrize("name", ALLOWED + REFUSED)
def test_the_chart_and_init_topology_judge_every_name_alike(helm: Path, name: str) -> None:
    """One rule: a name the chart lets through is one init-topology accepts, and back."""
    sets = [f"topology.labelMap.{name}={{a.example/b}}"]
    try:
        objects(ELASTIC_JOB, helm=helm, sets=sets)
        chart_allows = True
    except RenderError as exc:
        assert f"topology.labelMap.{name}:" in exc.stderr, exc.stderr
        chart_allows = False
    assert chart_allows == label_map_name_allowed(name)


def test_every_example_label_map_follows_the_rule() -> None:
    """The values-examples render (on-prem maps NCCL_IB_HCA)."""
    names = set()
    for example in sorted(EXAMPLES.glob("*.yaml")):
        for sts in worker_statefulsets(objects(ELASTIC_JOB, values=[example])):
            names |= set(json.loads(env_of(container(sts, "init-topology"))["TOPOLOGY_LABEL_MAP"]))
    assert "NCCL_IB_HCA" in names
