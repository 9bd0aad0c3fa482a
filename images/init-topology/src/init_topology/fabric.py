"""The fast fabric a Node shows (infiniband, efa, roce, ethernet or unknown): `fabric`.

Pure, like mapping.py: labels and allocatable resources in, one word out. Kept apart
because it is the one rule with many sources of evidence (device plugins, NFD, providers).
"""

from __future__ import annotations

import re
from collections.abc import Mapping

from init_topology.quantity import positive

UNKNOWN = "unknown"
EFA_RESOURCE = "vpc.amazonaws.com/efa"
_TOKEN = re.compile(r"[^a-z0-9]+")

# Fabric evidence (see `fabric`).
#: Device-plugin domains whose resources are RDMA devices: the RDMA shared device plugin
#: (k8s-rdma-shared-dev-plugin, the NVIDIA Network Operator's rdmaSharedDevicePlugin:
#: rdma/rdma_shared_device_a, rdma/hca_shared_devices_a, rdma/ib, ...).
RDMA_RESOURCE_DOMAINS = frozenset({"rdma"})
#: Name tokens that make any resource an RDMA device (nvidia.com/rdma_sriov on OKE,
#: networking.gke.io.networks/rdma-0 on GKE, nvidia.com/sriov_roce, .../mlnx_ib_sriov).
RDMA_TOKENS = frozenset({"rdma", "ib", "infiniband", "roce", "hca"})
#: The NVIDIA Network Operator's own resource domains: its host-device resource
#: (nvidia.com/hostdev: whole Mellanox NICs, selected with isRdma) is an RDMA device.
NETWORK_OPERATOR_DOMAINS = frozenset({"nvidia.com", "mellanox.com"})
#: SR-IOV device plugin domains (the SR-IOV Network Operator's openshift.io, the plugin's
#: default intel.com, the Network Operator's nvidia.com): their NICs (nvidia.com/mlnxnics,
#: openshift.io/mlxnics) may be RDMA VFs or not. GPU resources in them are not NICs.
SRIOV_RESOURCE_DOMAINS = frozenset({"openshift.io", "intel.com", "nvidia.com", "mellanox.com"})
GPU_RESOURCE_NAMES = ("gpu", "mig-", "vgpu", "pgpu")
#: Name tokens of a NIC resource that may do RDMA, in any domain.
NIC_TOKENS = frozenset({"sriov", "vf", "vfs", "mlnx", "mellanox", "connectx"})
#: NFD's labels for an RDMA-capable adapter (a Mellanox PCI device) and for loaded RDMA
#: modules, in both spellings NFD has used, and its Mellanox PCI vendor label.
NFD_RDMA_LABELS = (
    "feature.node.kubernetes.io/rdma.capable",
    "feature.node.kubernetes.io/rdma.available",
    "feature.node.kubernetes.io/custom-rdma.capable",
    "feature.node.kubernetes.io/custom-rdma.available",
    "feature.node.kubernetes.io/pci-15b3.present",
)
#: The Network Operator labels the nodes where it manages the Mellanox driver.
NETWORK_OPERATOR_LABELS = ("network.nvidia.com/operator.mofed.wait",)
#: The one RDMA link layer a provider offers (Azure: InfiniBand; GCE, OCI: RoCE v2).
PROVIDER_RDMA_LINK = {"azure": "infiniband", "gce": "roce", "oci": "roce"}
#: GCE machine types with RoCE NICs (GPUDirect RDMA): A3 Ultra, A4, A4X, A4X Max.
GCE_ROCE_MACHINE_PREFIXES = ("a3-ultragpu-", "a4-highgpu-", "a4x-highgpu-", "a4x-maxgpu-")
#: GCE machine types with RDMA that is neither InfiniBand nor RoCE (H4D: Cloud RDMA).
GCE_OTHER_RDMA_MACHINE_PREFIXES = ("h4d-",)
#: An Azure VM size: Standard_<family><vCPUs>[-<constrained vCPUs>]<additive features>_...
_AZURE_SIZE = re.compile(r"(?i:standard)_[A-Z]+\d+(?:-\d+)?(?P<features>[a-z]*)(?:_|$)")

#: CoreWeave's fabric labels: backend.coreweave.cloud/flavor names the backend fabric
#: (infiniband, roce); the ib.coreweave.cloud/ labels (fabric, leafgroup, speed, superpod,
#: ...) are put on InfiniBand nodes only.
COREWEAVE_FLAVOR = "backend.coreweave.cloud/flavor"
COREWEAVE_IB_PREFIX = "ib.coreweave.cloud/"


def fabric(
    labels: Mapping[str, str],
    allocatable: Mapping[str, str],
    node_provider: str,
    instance_type: str = "",
) -> str:
    """infiniband, efa, roce, ethernet or unknown: what the Node shows of its fast fabric.

    Writing `ethernet` makes NCCL_IB_DISABLE=1, which breaks training on a node that does
    have InfiniBand or RoCE; `infiniband`/`roce` only write NCCL's own default. So
    `ethernet` needs positive knowledge (the provider's instance type, below) and no RDMA
    device advertised; anything weaker that hints at RDMA gives `unknown`, and nothing is
    written. In order:

    1. allocatable vpc.amazonaws.com/efa > 0: efa.
    2. The provider's own fabric labels (`labelled_fabric`: CoreWeave's): what they say.
    3. An RDMA device resource whose name tells its link layer (`ib`, `infiniband` ->
       infiniband; `roce`, `eth`, `ethernet` -> roce): that.
    4. The provider's instance type (`provider_fabric`): infiniband or roce as it says;
       ethernet as it says unless a device resource that is or may be RDMA is advertised
       (NFD's host hints do not count there: Azure's accelerated networking is a Mellanox
       VF, EFA loads ib_uverbs).
    5. Any RDMA evidence (resource or NFD label): the provider's only RDMA link (Azure
       InfiniBand, GCE and OCI RoCE), else unknown.
    6. Nothing known: unknown.
    """
    if positive(allocatable.get(EFA_RESOURCE)):
        return "efa"
    labelled = labelled_fabric(labels)
    if labelled:
        return labelled
    rdma, maybe, link = _rdma_resources(allocatable)
    if link:
        return link
    view = provider_fabric(node_provider, instance_type)
    if view in ("infiniband", "roce"):
        return view
    if view == "ethernet":
        return UNKNOWN if rdma or maybe else "ethernet"
    if rdma or maybe or _rdma_labels(labels):
        return PROVIDER_RDMA_LINK.get(node_provider, UNKNOWN)
    return UNKNOWN


def labelled_fabric(labels: Mapping[str, str]) -> str | None:
    """The fabric a provider's own labels name; None where they name none.

    CoreWeave: `backend.coreweave.cloud/flavor` is `infiniband` or `roce`; without it (older
    nodes), any `ib.coreweave.cloud/` label marks an InfiniBand node.
    """
    flavor = labels.get(COREWEAVE_FLAVOR, "").strip().lower()
    if flavor in ("infiniband", "roce"):
        return flavor
    if any(key.startswith(COREWEAVE_IB_PREFIX) for key in labels):
        return "infiniband"
    return None


def provider_fabric(node_provider: str, instance_type: str) -> str | None:
    """What a cloud's instance type says of its fabric; None where it says nothing.

    - aws: EC2 has no InfiniBand or RoCE; its RDMA is EFA (counted by its resource), which
      NCCL reaches through the aws-ofi-nccl plugin, not its IB transport: ethernet.
    - azure: RDMA-capable sizes carry `r` among the additive features after the vCPU count
      (Standard_ND96isr_H100_v5, Standard_HB120rs_v3) and their RDMA is InfiniBand; a size
      without it has none: ethernet.
    - gce: RDMA NICs come with the machine family: RoCE on A3 Ultra, A4, A4X and A4X Max;
      H4D's Cloud RDMA is neither; every other family has only gVNIC/virtio NICs
      (A3 High/Mega's GPUDirect-TCPX/TCPXO is TCP over ethernet): ethernet.
    - anything else, or no instance type: None.
    """
    itype = instance_type.strip()
    if node_provider == "aws":
        return "ethernet"
    if node_provider == "azure" and itype:
        match = _AZURE_SIZE.match(itype)
        if match is None:
            return None
        return "infiniband" if "r" in match.group("features") else "ethernet"
    if node_provider == "gce" and itype:
        family = itype.lower()
        if family.startswith(GCE_ROCE_MACHINE_PREFIXES):
            return "roce"
        if family.startswith(GCE_OTHER_RDMA_MACHINE_PREFIXES):
            return None
        return "ethernet"
    return None


def _rdma_resources(allocatable: Mapping[str, str]) -> tuple[bool, bool, str | None]:
    """(an RDMA device is advertised, a device that may be RDMA is, the link layer the
    RDMA devices' names tell or None). Only resources with a positive quantity count."""
    rdma = maybe = False
    hints: set[str] = set()
    for name, quantity in allocatable.items():
        if not positive(quantity):
            continue
        domain, _, resource = name.lower().rpartition("/")
        tokens = set(_TOKEN.split(resource))
        if (
            domain in RDMA_RESOURCE_DOMAINS
            or tokens & RDMA_TOKENS
            or (domain in NETWORK_OPERATOR_DOMAINS and "hostdev" in tokens)
        ):
            rdma = True
            hints |= tokens
        elif (domain in SRIOV_RESOURCE_DOMAINS and not resource.startswith(GPU_RESOURCE_NAMES)) or (
            tokens & NIC_TOKENS
        ):
            maybe = True
    if hints & {"ib", "infiniband"}:
        return rdma, maybe, "infiniband"
    if hints & {"roce", "eth", "ethernet"}:
        return rdma, maybe, "roce"
    return rdma, maybe, None


def _rdma_labels(labels: Mapping[str, str]) -> bool:
    """NFD (or the NVIDIA Network Operator) says the host has an RDMA-capable adapter."""
    return any(labels.get(key, "").lower() == "true" for key in NFD_RDMA_LABELS) or any(
        key in labels for key in NETWORK_OPERATOR_LABELS
    )
