"""templates/worker-statefulset.yaml, the init-topology container as docs/contracts.md
fixes it."""

from __future__ import annotations

import json

import yaml
from chart_render import (
    ELASTIC_JOB,
    EXAMPLES,
    container,
    env_of,
    objects,
    worker_statefulsets,
)
from worker_sts import DEFAULTS, INIT_ENV, env_names, render_sts

# --- the init container -----------------------------------------------------------------


def test_init_container_contract() -> None:
    """init-topology: command [init-topology], no args, the contract env in order."""
    init = container(render_sts(), "init-topology")
    assert init["command"] == ["init-topology"]
    assert "args" not in init
    assert env_names(init) == INIT_ENV
    env = env_of(init)
    assert env["NODE_NAME"] == {"fieldRef": {"fieldPath": "spec.nodeName"}}
    assert env["TOPOLOGY_OUTPUT"] == "/etc/inject/env"
    assert env["TOPOLOGY_STRICT"] == "false"
    assert env["TOPOLOGY_TIMEOUT_SECONDS"] == str(DEFAULTS["topology"]["timeoutSeconds"])


def test_topology_label_map_is_the_values_map_as_json() -> None:
    """topology.labelMap -> TOPOLOGY_LABEL_MAP (JSON object, name -> ordered label keys)."""
    env = env_of(container(render_sts(), "init-topology"))
    assert json.loads(env["TOPOLOGY_LABEL_MAP"]) == DEFAULTS["topology"]["labelMap"]
    example = yaml.safe_load((EXAMPLES / "eks-efa.yaml").read_text())
    (sts,) = worker_statefulsets(objects(ELASTIC_JOB, values=[EXAMPLES / "eks-efa.yaml"]))
    label_map = json.loads(env_of(container(sts, "init-topology"))["TOPOLOGY_LABEL_MAP"])
    assert label_map == {**DEFAULTS["topology"]["labelMap"], **example["topology"]["labelMap"]}


def test_topology_strict_and_timeout() -> None:
    """topology.strict / timeoutSeconds -> TOPOLOGY_STRICT / TOPOLOGY_TIMEOUT_SECONDS."""
    env = env_of(
        container(
            render_sts(sets=["topology.strict=true", "topology.timeoutSeconds=12"]), "init-topology"
        )
    )
    assert (env["TOPOLOGY_STRICT"], env["TOPOLOGY_TIMEOUT_SECONDS"]) == ("true", "12")


def test_topology_user_env_names_the_users_worker_variables() -> None:
    """TOPOLOGY_USER_ENV: comma-separated, sorted names of the group's merged env."""
    objs = objects(ELASTIC_JOB, values=[ELASTIC_JOB / "ci" / "multigroup-values.yaml"])
    by_name = {s["metadata"]["name"].rsplit("-", 1)[1]: s for s in worker_statefulsets(objs)}
    anchor = env_of(container(by_name["anchor"], "init-topology"))["TOPOLOGY_USER_ENV"]
    spot = env_of(container(by_name["spot"], "init-topology"))["TOPOLOGY_USER_ENV"]
    assert anchor == "NCCL_DEBUG,WORKER_POOL"
    assert spot == "HOST_IP,NCCL_DEBUG,WORKER_POOL"
    assert env_of(container(render_sts(), "init-topology"))["TOPOLOGY_USER_ENV"] == ""
