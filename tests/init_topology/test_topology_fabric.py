"""The fabric rule: each source of evidence; InfiniBand never switched off on a guess."""

from __future__ import annotations

import pytest
from init_topology.fabric import fabric
from init_topology.mapping import nccl_defaults

NFD_RDMA = {"feature.node.kubernetes.io/rdma.available": "true"}
MELLANOX = {"feature.node.kubernetes.io/pci-15b3.present": "true"}


@pytest.mark.parametrize(
    ("allocatable", "labels", "node_provider", "instance_type", "expected"),
    [
        # EFA.
        ({"vpc.amazonaws.com/efa": "4"}, {}, "aws", "p5.48xlarge", "efa"),
        ({"vpc.amazonaws.com/efa": "0"}, {}, "aws", "p5.48xlarge", "ethernet"),
        # EC2 has no InfiniBand or RoCE; EFA without its plugin loads ib_uverbs (NFD hint).
        ({}, NFD_RDMA, "aws", "g6.12xlarge", "ethernet"),
        # RDMA device resources whose names tell the link layer.
        ({"rdma/ib": "1"}, {}, "", "", "infiniband"),
        ({"nvidia.com/mlnx_ib_sriov": "8"}, {}, "", "", "infiniband"),
        ({"rdma/roce_gdr": "8"}, {}, "", "", "roce"),
        ({"nvidia.com/sriov_roce": "8"}, {}, "", "", "roce"),
        ({"rdma/rdma_shared_device_eth": "63"}, {}, "", "", "roce"),
        (
            {"rdma/rdma_shared_device_ib": "1k"},
            {},
            "",
            "",
            "infiniband",
        ),  # 1000, as the API writes it
        # Azure: RDMA sizes carry `r` and their RDMA is InfiniBand, however it is exposed.
        ({"nvidia.com/hostdev": "8"}, {}, "azure", "Standard_ND96isr_H100_v5", "infiniband"),
        ({"nvidia.com/hostdev": "8"}, MELLANOX, "azure", "", "infiniband"),
        ({}, {}, "azure", "Standard_ND96isr_H100_v5", "infiniband"),
        ({}, {}, "azure", "Standard_HB120-96rs_v3", "infiniband"),
        ({"rdma/hca_shared_devices_a": "63"}, {}, "azure", "", "infiniband"),
        # ... a size without it has none; its accelerated-networking VF is a Mellanox NIC.
        ({}, {**MELLANOX, **NFD_RDMA}, "azure", "Standard_NC24ads_A100_v4", "ethernet"),
        ({"openshift.io/mlnxnics": "4"}, {}, "azure", "Standard_NC24ads_A100_v4", "unknown"),
        ({}, {}, "azure", "not-a-size", "unknown"),
        # GCE: RoCE on A3 Ultra / A4 / A4X (also with DRANET: no resource on the Node).
        ({}, {}, "gce", "a3-ultragpu-8g", "roce"),
        ({}, {}, "gce", "a4-highgpu-8g", "roce"),
        ({}, {}, "gce", "a4x-maxgpu-4g-metal", "roce"),
        ({"networking.gke.io.networks/rdma-0": "1"}, {}, "gce", "", "roce"),
        ({}, {}, "gce", "a3-highgpu-8g", "ethernet"),  # GPUDirect-TCPX: TCP over ethernet
        ({}, {}, "gce", "h4d-highmem-192", "unknown"),  # Cloud RDMA: neither IB nor RoCE
        ({"networking.gke.io.networks/rdma-0": "1"}, {}, "gce", "a3-highgpu-8g", "unknown"),
        ({}, {}, "gce", "", "unknown"),
        # OCI: RDMA is RoCE.
        ({"nvidia.com/rdma_sriov": "16"}, {}, "oci", "BM.GPU.A100-v2.8", "roce"),
        ({}, NFD_RDMA, "oci", "BM.GPU.H100.8", "roce"),
        # The NVIDIA Network Operator's host-device and SR-IOV resources, NFD, nothing:
        # RDMA of an unknown link layer, or nothing known. Never ethernet.
        ({"nvidia.com/hostdev": "8"}, {}, "", "", "unknown"),
        ({"nvidia.com/mlnxnics": "8"}, {}, "", "", "unknown"),
        ({"openshift.io/mlxnics": "8"}, {}, "", "", "unknown"),
        ({"rdma/rdma_shared_device_a": "1000"}, {}, "", "", "unknown"),
        ({}, NFD_RDMA, "", "", "unknown"),
        ({}, MELLANOX, "", "", "unknown"),
        ({}, {"feature.node.kubernetes.io/custom-rdma.capable": "true"}, "", "", "unknown"),
        ({}, {"network.nvidia.com/operator.mofed.wait": "false"}, "kind", "", "unknown"),
        ({"rdma/ib": "0"}, {}, "", "", "unknown"),
        ({"example.com/lib": "1", "nvidia.com/gpu": "8"}, {}, "", "", "unknown"),
        # CoreWeave: the backend fabric's flavor, else its InfiniBand-only labels.
        ({}, {"backend.coreweave.cloud/flavor": "infiniband"}, "", "", "infiniband"),
        ({}, {"backend.coreweave.cloud/flavor": "roce"}, "", "", "roce"),
        ({"rdma/ib": "1"}, {"backend.coreweave.cloud/flavor": "roce"}, "", "", "roce"),
        ({}, {"ib.coreweave.cloud/fabric": "us-east-04a-ib-01"}, "", "", "infiniband"),
        ({}, {"ib.coreweave.cloud/leafgroup": "12"}, "", "", "infiniband"),
        ({}, {"backend.coreweave.cloud/flavor": "other"}, "", "", "unknown"),
        ({}, {"node.coreweave.cloud/rack": "42"}, "", "", "unknown"),
        ({}, {}, "", "", "unknown"),
        ({}, {}, "kind", "c-4x-amd64-linux", "unknown"),
    ],
)
def test_fabric_from_resources_labels_and_provider(
    allocatable: dict[str, str],
    labels: dict[str, str],
    node_provider: str,
    instance_type: str,
    expected: str,
) -> None:
    assert fabric(labels, allocatable, node_provider, instance_type) == expected


@pytest.mark.parametrize(
    ("allocatable", "labels", "node_provider", "instance_type"),
    [
        ({"nvidia.com/hostdev": "8"}, MELLANOX, "", ""),
        ({"openshift.io/mlnxnics": "8"}, {}, "aws", "p4d.24xlarge"),
        ({"rdma/rdma_shared_device_a": "1k"}, {}, "gce", "n2-standard-8"),
        ({}, NFD_RDMA, "", ""),
        ({}, {}, "", ""),
    ],
)
def test_ib_is_never_disabled_without_positive_knowledge(
    allocatable: dict[str, str], labels: dict[str, str], node_provider: str, instance_type: str
) -> None:
    """NCCL_IB_DISABLE=1 switches InfiniBand off: only where the node is known to lack it."""
    node_fabric = fabric(labels, allocatable, node_provider, instance_type)
    assert nccl_defaults(node_fabric, instance_type).get("NCCL_IB_DISABLE") != "1"
