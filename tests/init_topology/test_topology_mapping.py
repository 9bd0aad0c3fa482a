"""The pure mapping: each Node fixture's variables, and each rule on its own."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from init_topology.config import Config, parse_label_map
from init_topology.envfile import render
from init_topology.mapping import (
    GPU_COUNT,
    GPU_MODEL,
    INSTANCE_TYPE,
    REGION,
    ZONE,
    build_variables,
    capacity_type,
    nccl_defaults,
    node_variables,
    provider,
)

from localrun.cluster.nodes import load_node

# What init-topology writes for each fixture with no label map and no user env.
EXPECTED: dict[str, dict[str, str]] = {
    "gke-a3-h100-spot": {
        "NODE_NAME": "gke-train-a3-spot-pool-8f3c2a1b-x7k2",
        "NODE_PROVIDER": "gce",
        "NODE_REGION": "us-central1",
        "NODE_ZONE": "us-central1-a",
        "NODE_INSTANCE_TYPE": "a3-highgpu-8g",
        "NODE_GPU_MODEL": "nvidia-h100-80gb",
        "NODE_GPU_COUNT": "8",
        "NODE_CAPACITY_TYPE": "spot",
        # A3 High moves GPU traffic over GPUDirect-TCPX (ethernet NICs), not RDMA.
        "NODE_FABRIC": "ethernet",
        "NODE_TOPOLOGY_SOURCE": "api",
        "NCCL_IB_DISABLE": "1",
    },
    # A3 Ultra: CX-7 RoCE NICs, attached as GKE multi-networks rdma-0 .. rdma-7.
    "gke-a3-ultra-h200-rdma": {
        "NODE_NAME": "gke-train-a3u-pool-2d7e9f10-q4mz",
        "NODE_PROVIDER": "gce",
        "NODE_REGION": "europe-west1",
        "NODE_ZONE": "europe-west1-b",
        "NODE_INSTANCE_TYPE": "a3-ultragpu-8g",
        "NODE_GPU_MODEL": "nvidia-h200-141gb",
        "NODE_GPU_COUNT": "8",
        "NODE_CAPACITY_TYPE": "on-demand",
        "NODE_FABRIC": "roce",
        "NODE_TOPOLOGY_SOURCE": "api",
        "NCCL_IB_DISABLE": "0",
    },
    "eks-p5-efa-karpenter-spot": {
        "NODE_NAME": "ip-10-0-142-23.ec2.internal",
        "NODE_PROVIDER": "aws",
        "NODE_REGION": "us-east-1",
        "NODE_ZONE": "us-east-1a",
        "NODE_INSTANCE_TYPE": "p5.48xlarge",
        "NODE_GPU_MODEL": "h100",
        "NODE_GPU_COUNT": "8",
        "NODE_CAPACITY_TYPE": "spot",
        "NODE_FABRIC": "efa",
        "NODE_TOPOLOGY_SOURCE": "api",
        "FI_PROVIDER": "efa",
        "FI_EFA_USE_DEVICE_RDMA": "1",
    },
    "aks-nd-h100-v5-infiniband": {
        "NODE_NAME": "aks-ndh100-26783410-vmss000003",
        "NODE_PROVIDER": "azure",
        "NODE_REGION": "eastus",
        "NODE_ZONE": "eastus-2",
        "NODE_INSTANCE_TYPE": "Standard_ND96isr_H100_v5",
        "NODE_GPU_MODEL": "NVIDIA-H100-80GB-HBM3",
        "NODE_GPU_COUNT": "8",
        "NODE_CAPACITY_TYPE": "on-demand",
        "NODE_FABRIC": "infiniband",
        "NODE_TOPOLOGY_SOURCE": "api",
        "NCCL_IB_DISABLE": "0",
    },
    "onprem-gfd-a100-roce": {
        "NODE_NAME": "dgx-a100-r07-n03",
        "NODE_PROVIDER": "",
        "NODE_REGION": "dc-fra1",
        "NODE_ZONE": "dc-fra1-hall2",
        "NODE_INSTANCE_TYPE": "",
        "NODE_GPU_MODEL": "NVIDIA-A100-SXM4-80GB",
        "NODE_GPU_COUNT": "8",
        "NODE_CAPACITY_TYPE": "unknown",
        # RDMA, but nothing on the Node says InfiniBand or RoCE: no NCCL default guessed.
        "NODE_FABRIC": "unknown",
        "NODE_TOPOLOGY_SOURCE": "api",
    },
    "cpu-bare": {
        "NODE_NAME": "cpu-node-01",
        "NODE_PROVIDER": "",
        "NODE_REGION": "",
        "NODE_ZONE": "",
        "NODE_INSTANCE_TYPE": "",
        "NODE_GPU_MODEL": "",
        "NODE_GPU_COUNT": "0",
        "NODE_CAPACITY_TYPE": "unknown",
        # Nothing says there is no InfiniBand or RoCE: no NCCL_IB_DISABLE=1 guessed.
        "NODE_FABRIC": "unknown",
        "NODE_TOPOLOGY_SOURCE": "api",
    },
    # Issue 9: the Network Operator in host-device mode (nvidia.com/hostdev), no NFD rdma
    # labels. Was ethernet + NCCL_IB_DISABLE=1; the size's `r` (isr) says InfiniBand.
    "aks-nd-h100-v5-hostdev": {
        "NODE_NAME": "aks-ndh100hd-41907532-vmss000001",
        "NODE_PROVIDER": "azure",
        "NODE_REGION": "eastus",
        "NODE_ZONE": "eastus-2",
        "NODE_INSTANCE_TYPE": "Standard_ND96isr_H100_v5",
        "NODE_GPU_MODEL": "NVIDIA-H100-80GB-HBM3",
        "NODE_GPU_COUNT": "8",
        "NODE_CAPACITY_TYPE": "on-demand",
        "NODE_FABRIC": "infiniband",
        "NODE_TOPOLOGY_SOURCE": "api",
        "NCCL_IB_DISABLE": "0",
    },
    # CoreWeave, its labels only (no feature discovery labels, no RDMA device resource):
    # the GPU class names the model, the backend/ib labels the InfiniBand fabric.
    "coreweave-h100-infiniband-labels": {
        "NODE_NAME": "gd92a1c",
        "NODE_PROVIDER": "",
        "NODE_REGION": "US-EAST-04",
        "NODE_ZONE": "US-EAST-04A",
        "NODE_INSTANCE_TYPE": "gd-8xh100ib-i128",
        "NODE_GPU_MODEL": "H100_NVLINK_80GB",
        "NODE_GPU_COUNT": "8",
        "NODE_CAPACITY_TYPE": "unknown",
        "NODE_FABRIC": "infiniband",
        "NODE_TOPOLOGY_SOURCE": "api",
        "NCCL_IB_DISABLE": "0",
    },
    # OKE: spec.providerID is the bare instance OCID; NFD sees the ConnectX NICs; OCI's
    # RDMA cluster networks are RoCE v2.
    "oke-bm-gpu-h100-rdma": {
        "NODE_NAME": "10.140.48.77",
        "NODE_PROVIDER": "oci",
        "NODE_REGION": "iad",
        "NODE_ZONE": "US-ASHBURN-AD-2",
        "NODE_INSTANCE_TYPE": "BM.GPU.H100.8",
        "NODE_GPU_MODEL": "NVIDIA-H100-80GB-HBM3",
        "NODE_GPU_COUNT": "8",
        "NODE_CAPACITY_TYPE": "unknown",
        "NODE_FABRIC": "roce",
        "NODE_TOPOLOGY_SOURCE": "api",
        "NCCL_IB_DISABLE": "0",
    },
}


def _local(name: str, zone: str, capacity: str, itype: str = "c-4x-amd64-linux") -> dict[str, str]:
    return {
        "NODE_NAME": name,
        "NODE_PROVIDER": "kind",
        "NODE_REGION": "local",
        "NODE_ZONE": zone,
        "NODE_INSTANCE_TYPE": itype,
        "NODE_GPU_MODEL": "",
        "NODE_GPU_COUNT": "0",
        "NODE_CAPACITY_TYPE": capacity,
        # kind says nothing of the host's NICs.
        "NODE_FABRIC": "unknown",
        "NODE_TOPOLOGY_SOURCE": "api",
    }


EXPECTED |= {
    "local-spot-0": _local("local-spot-0", "local-a", "spot"),
    "local-spot-1": _local("local-spot-1", "local-b", "spot"),
    "local-ondemand-0": _local("local-ondemand-0", "local-a", "on-demand"),
    "local-ondemand-1": _local("local-ondemand-1", "local-b", "on-demand"),
    "local-system-0": _local("local-system-0", "local-a", "on-demand", "c-2x-amd64-linux"),
}
# The `mixed` profile's GPU nodes (GPU feature discovery's labels): one job, two models.
EXPECTED |= {
    name: _local(name, zone, "on-demand", "g-8x-gpu")
    | {"NODE_GPU_MODEL": model, "NODE_GPU_COUNT": "8"}
    for name, zone, model in (
        ("local-gpu-a100-0", "local-a", "NVIDIA-A100-SXM4-80GB"),
        ("local-gpu-h100-0", "local-a", "NVIDIA-H100-80GB-HBM3"),
        ("local-gpu-h100-1", "local-b", "NVIDIA-H100-80GB-HBM3"),
    )
}


def config(node_name: str = "n", label_map: str = "", user_env: str = "") -> Config:
    return Config(
        node_name=node_name,
        output=Path("/etc/inject/env"),
        label_map=parse_label_map(label_map),
        strict=False,
        timeout_seconds=10,
        user_env=frozenset(n for n in user_env.split(",") if n),
        serviceaccount_dir=Path("/nonexistent"),
        api_host=None,
        api_port=None,
    )


def node_with(labels: dict[str, str], allocatable: dict[str, str] | None = None) -> dict[str, Any]:
    return {
        "metadata": {"name": "n", "labels": labels},
        "spec": {},
        "status": {"allocatable": allocatable or {"cpu": "4", "pods": "110"}},
    }


@pytest.mark.parametrize("stem", sorted(EXPECTED))
def test_each_fixture_maps_to_its_expected_variables_in_order(stem: str) -> None:
    node = load_node(stem)
    got = build_variables(config(node["metadata"]["name"]), node)
    assert list(got.items()) == list(EXPECTED[stem].items())


def test_fixtures_are_shaped_like_kubectl_output() -> None:
    for stem in EXPECTED:
        node = load_node(stem)
        assert node["apiVersion"] == "v1" and node["kind"] == "Node"
        labels = node["metadata"]["labels"]
        assert labels["kubernetes.io/hostname"] == node["metadata"]["name"]
        assert all(isinstance(v, str) and len(v) <= 63 for v in labels.values()), stem
        status = node["status"]
        assert set(status["allocatable"]) == set(status["capacity"]), stem
        assert {"kubeletVersion", "osImage", "containerRuntimeVersion"} <= set(status["nodeInfo"])
        assert any(a["type"] == "InternalIP" for a in status["addresses"]), stem
        ready = [c for c in status["conditions"] if c["type"] == "Ready"]
        assert ready and ready[0]["status"] == "True", stem


def test_without_a_node_only_the_name_and_unknowns_are_written() -> None:
    assert build_variables(config("n1"), None) == {
        "NODE_NAME": "n1",
        "NODE_CAPACITY_TYPE": "unknown",
        "NODE_FABRIC": "unknown",
        "NODE_TOPOLOGY_SOURCE": "downward-api",
    }


@pytest.mark.parametrize(
    ("provider_id", "expected"),
    [
        ("gce://proj/us-central1-a/gke-x", "gce"),
        ("aws:///us-east-1a/i-0abc", "aws"),
        ("azure:///subscriptions/x/resourceGroups/y", "azure"),
        ("kind://docker/kind/kind-worker", "kind"),
        ("openstack:///8c2d4f1e", "openstack"),
        ("oci://ocid1.instance.oc1.phx.x", "oci"),
        # OKE's default: the bare instance OCID.
        ("ocid1.instance.oc1.iad.anuwcljtc3n7s2yc4xdqxq6jzbi5k3r2xw4uv5f6g7h8i9j0k", "oci"),
        ("ocid1.compartment.oc1..aaaa", ""),
        ("", ""),
        ("not-a-provider-id", ""),
    ],
)
def test_provider_is_the_scheme_of_spec_provider_id(provider_id: str, expected: str) -> None:
    assert provider({"spec": {"providerID": provider_id}}) == expected


@pytest.mark.parametrize(
    ("labels", "expected"),
    [
        ({"cloud.google.com/gke-spot": "true", "cloud.google.com/gke-nodepool": "p"}, "spot"),
        ({"cloud.google.com/gke-preemptible": "true"}, "spot"),
        ({"cloud.google.com/gke-provisioning": "standard"}, "on-demand"),
        ({"cloud.google.com/gke-nodepool": "default-pool"}, "on-demand"),
        ({"eks.amazonaws.com/capacityType": "SPOT"}, "spot"),
        ({"eks.amazonaws.com/capacityType": "ON_DEMAND"}, "on-demand"),
        ({"eks.amazonaws.com/capacityType": "CAPACITY_BLOCK"}, "on-demand"),
        ({"karpenter.sh/capacity-type": "spot"}, "spot"),
        ({"karpenter.sh/capacity-type": "on-demand"}, "on-demand"),
        ({"karpenter.sh/capacity-type": "reserved"}, "on-demand"),
        ({"kubernetes.azure.com/scalesetpriority": "spot"}, "spot"),
        ({"kubernetes.azure.com/agentpool": "gpu"}, "on-demand"),
        ({"node.kubernetes.io/lifecycle": "spot"}, "spot"),
        ({"spotinst.io/node-lifecycle": "od"}, "on-demand"),
        ({"karpenter.sh/capacity-type": "something-new"}, "unknown"),
        ({"kubernetes.io/hostname": "x"}, "unknown"),
    ],
)
def test_capacity_type_from_each_provisioners_labels(labels: dict[str, str], expected: str) -> None:
    assert capacity_type(labels) == expected


@pytest.mark.parametrize(
    ("labels", "provider_id", "region", "zone"),
    [
        # No topology labels: GCE's providerID names the zone, and the zone its region.
        ({}, "gce://ml-proj/us-central1-c/gke-train-pool-1-abcd", "us-central1", "us-central1-c"),
        ({}, "gce://p/europe-west4-b/n", "europe-west4", "europe-west4-b"),
        # A region label but no zone label: the label's region stays.
        ({"topology.kubernetes.io/region": "r1"}, "gce://p/us-east4-a/n", "r1", "us-east4-a"),
        # Labels win over providerID.
        (
            {"topology.kubernetes.io/region": "us-central1", "topology.kubernetes.io/zone": "z"},
            "gce://p/us-central1-a/n",
            "us-central1",
            "z",
        ),
        # Other providers and shapes say nothing of a zone here.
        ({}, "aws:///us-east-1a/i-0abc", "", ""),
        ({}, "gce://p/n", "", ""),
        ({}, "gce://p/not a zone/n", "", ""),
        ({}, "", "", ""),
    ],
)
def test_zone_and_region_from_a_gce_provider_id_without_topology_labels(
    labels: dict[str, str], provider_id: str, region: str, zone: str
) -> None:
    node = node_with(labels)
    node["spec"]["providerID"] = provider_id
    got = node_variables("n", node)
    assert (got["NODE_REGION"], got["NODE_ZONE"]) == (region, zone)


@pytest.mark.parametrize(
    ("fabric_name", "instance_type", "expected"),
    [
        ("efa", "p5.48xlarge", {"FI_PROVIDER": "efa", "FI_EFA_USE_DEVICE_RDMA": "1"}),
        ("efa", "g5.48xlarge", {"FI_PROVIDER": "efa"}),
        ("infiniband", "", {"NCCL_IB_DISABLE": "0"}),
        ("roce", "", {"NCCL_IB_DISABLE": "0"}),
        ("ethernet", "", {"NCCL_IB_DISABLE": "1"}),
        ("unknown", "", {}),
        ("something-else", "", {}),
    ],
)
def test_nccl_defaults_per_fabric(
    fabric_name: str, instance_type: str, expected: dict[str, str]
) -> None:
    assert nccl_defaults(fabric_name, instance_type) == expected


def test_no_nccl_default_for_a_variable_the_user_set_on_the_worker() -> None:
    node = load_node("eks-p5-efa-karpenter-spot")
    got = build_variables(config(user_env="FI_EFA_USE_DEVICE_RDMA,OTHER"), node)
    assert got["FI_PROVIDER"] == "efa"
    assert "FI_EFA_USE_DEVICE_RDMA" not in got


def test_label_map_first_present_label_wins_in_the_order_given() -> None:
    node = node_with({"b.example.com/rack": "r2", "c.example.com/rack": "r3"})
    label_map = '{"NODE_RACK": ["a.example.com/rack", "c.example.com/rack", "b.example.com/rack"]}'
    assert build_variables(config(label_map=label_map), node)["NODE_RACK"] == "r3"


def test_label_map_counts_an_empty_label_as_present() -> None:
    node = node_with({"a.example.com/flag": "", "b.example.com/flag": "x"})
    label_map = '{"NODE_FLAG": ["a.example.com/flag", "b.example.com/flag"]}'
    assert build_variables(config(label_map=label_map), node)["NODE_FLAG"] == ""


def test_label_map_variable_without_any_label_is_not_written() -> None:
    got = build_variables(config(label_map='{"NODE_RACK": ["x.example.com/rack"]}'), node_with({}))
    assert "NODE_RACK" not in got


def test_label_map_can_override_the_fabric_and_the_nccl_defaults_follow() -> None:
    node = load_node("onprem-gfd-a100-roce")
    label_map = json.dumps(
        {"NODE_FABRIC": ["platform.example.com/fabric"], "NODE_RACK": ["platform.example.com/rack"]}
    )
    got = build_variables(config("dgx-a100-r07-n03", label_map=label_map), node)
    assert got["NODE_FABRIC"] == "roce"
    assert got["NODE_RACK"] == "r07"
    assert got["NCCL_IB_DISABLE"] == "0"
    # The override keeps NODE_FABRIC in its place among the NODE_* variables.
    assert list(got).index("NODE_FABRIC") < list(got).index("NODE_TOPOLOGY_SOURCE")


def test_label_map_value_that_cannot_be_written_is_skipped_not_fatal() -> None:
    node = node_with({"a.example.com/x": "bad\x00value", "b.example.com/y": "ok"})
    label_map = '{"NODE_X": ["a.example.com/x"], "NODE_Y": ["b.example.com/y"]}'
    got = build_variables(config(label_map=label_map), node)
    assert "NODE_X" not in got and got["NODE_Y"] == "ok"


def test_mapping_does_not_modify_the_node() -> None:
    node = load_node("aks-nd-h100-v5-infiniband")
    before = copy.deepcopy(node)
    node_variables("x", node)
    assert node == before


anything = st.text(max_size=80)
ALL_KNOWN_LABELS = sorted(
    {*REGION, *ZONE, *INSTANCE_TYPE, *GPU_MODEL, *GPU_COUNT}
    | {
        "karpenter.sh/capacity-type",
        "eks.amazonaws.com/capacityType",
        "cloud.google.com/gke-spot",
        "cloud.google.com/gke-nodepool",
        "kubernetes.azure.com/scalesetpriority",
        "feature.node.kubernetes.io/rdma.available",
    }
)


@settings(max_examples=200, deadline=None)
@given(
    labels=st.dictionaries(st.one_of(st.sampled_from(ALL_KNOWN_LABELS), anything), anything),
    allocatable=st.dictionaries(
        st.one_of(
            st.sampled_from(["nvidia.com/gpu", "vpc.amazonaws.com/efa", "rdma/ib"]), anything
        ),
        st.one_of(st.integers(-5, 10).map(str), anything),
    ),
    provider_id=anything,
)
def test_any_node_maps_to_variables_that_can_be_written(
    labels: dict[str, str], allocatable: dict[str, str], provider_id: str
) -> None:
    node = {
        "metadata": {"labels": labels},
        "spec": {"providerID": provider_id},
        "status": {"allocatable": allocatable},
    }
    label_map = json.dumps({"NODE_A": [k for k in sorted(labels) if k][:3] or ["x"]})
    got = build_variables(config("n", label_map=label_map), node)
    render(got)  # never raises: every value is writable
    assert got["NODE_CAPACITY_TYPE"] in ("spot", "on-demand", "unknown")
    assert got["NODE_FABRIC"] in ("infiniband", "efa", "roce", "ethernet", "unknown")
    assert got["NODE_GPU_COUNT"].isdigit()
